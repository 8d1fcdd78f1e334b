"""Data parallel: ms_accum's window on two msrun workers against MindSpore's plain data-parallel loop and a K·B step.

    python -m benchmarks --only parallel             (starts msrun itself)
    msrun --worker_num=2 --local_worker_num=2 --master_port=P --join=True --log_dir=DIR \\
        benchmarks/parallel.py [--rounds R] [--windows W]        (what it starts; `python` from PATH must be the venv's)

LeNet5, Momentum(0.01, 0.9), 16 samples per rank per micro-batch, K = 4, pre-loaded tensors, interleaved rounds. The
plain loop is `nn.TrainOneStepCell` under MindSpore's data parallel, which all-reduces the gradients of every step;
ms_accum's micro-batches accumulate locally and each window all-reduces the buffer once. Rank 0 prints its samples
as one JSON line (in LOG_DIR/worker_0.log).
"""
import argparse
import json
import os
import socket
import subprocess
import sys
import tempfile

if __name__ == "__main__":  # started by msrun as a script: this checkout first, and ms_accum before MindSpore
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    import ms_accum  # noqa: F401

from benchmarks.common import K, REPO, Table  # noqa: E402

MICRO = 16
PLAIN = "plain data parallel: nn.TrainOneStepCell on B (all-reduce every step)"
BIG = "one K·B step: nn.TrainOneStepCell on K·B"
DEFAULT = "ms_accum default ('three_graphs'), one all-reduce a window"
FUSED = "ms_accum TrainAccumulationCell ('fused'), the same"


def worker(rounds: int, windows: int) -> None:
    import numpy as np
    from mindspore import Tensor, nn
    from ms_accum import init_data_parallel, set_device
    from ms_accum.graphs import TrainAccumulationCell
    from benchmarks.common import build, executor, interleave, loop, one_step_cell
    set_device("CPU")
    info = init_data_parallel(gradients_mean=True)  # MindSpore's context: the plain contender's TrainOneStepCell
    # all-reduces every step only under it
    rng = np.random.default_rng(info.rank)
    xs = rng.standard_normal((2 * K * MICRO, 1, 32, 32)).astype(np.float32)
    ys = rng.integers(0, 10, (2 * K * MICRO,)).astype(np.int32)
    micro = [(Tensor(xs[i:i + MICRO]), Tensor(ys[i:i + MICRO])) for i in range(0, len(xs), MICRO)]
    big = [(Tensor(xs[i:i + K * MICRO]), Tensor(ys[i:i + K * MICRO])) for i in range(0, len(xs), K * MICRO)]

    def three_graphs(net, loss, opt):
        runner = executor(net, loss, opt, "three_graphs").runner(K)

        def run(n):
            for w in range(n):
                runner.run(micro[(w * K) % len(micro):][:K], K)
        return run

    def per_micro_batch(run):
        return lambda n: run(K * n)

    builders = {
        PLAIN: lambda net, loss, opt: per_micro_batch(loop(one_step_cell(net, loss, opt), micro)),
        BIG: lambda net, loss, opt: loop(one_step_cell(net, loss, opt), big),
        DEFAULT: three_graphs,
        FUSED: lambda net, loss, opt: per_micro_batch(loop(
            TrainAccumulationCell(nn.WithLossCell(net, loss), opt, K).set_train(), micro)),
    }
    contenders = {name: make(*build("lenet5")[:3]) for name, make in builders.items()}
    samples = interleave(contenders, rounds, windows)
    if info.is_main:
        print(json.dumps({"workers": info.group_size, "samples_ms": samples}), flush=True)


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def table(rounds: int, windows: int, workers: int = 2, timeout: float = 900) -> Table:
    """Runs `worker` under msrun with `workers` CPU workers and returns rank 0's table."""
    bin_dir = os.path.dirname(sys.executable)
    # msrun starts `python` from PATH: this interpreter's must come first.
    env = {**os.environ, "PATH": bin_dir + os.pathsep + os.environ.get("PATH", ""), "GLOG_v": "3"}
    with tempfile.TemporaryDirectory() as logs:
        command = [os.path.join(bin_dir, "msrun"), f"--worker_num={workers}", f"--local_worker_num={workers}",
                   f"--master_port={_free_port()}", "--join=True", f"--log_dir={logs}", os.path.abspath(__file__),
                   "--rounds", str(rounds), "--windows", str(windows)]
        done = subprocess.run(command, cwd=REPO, env=env, capture_output=True, text=True, timeout=timeout,
                              check=False)
        with open(os.path.join(logs, "worker_0.log"), encoding="utf-8", errors="replace") as handle:
            lines = [line for line in handle if line.startswith("{")]
        if done.returncode != 0 or not lines:
            raise RuntimeError(f"msrun failed (exit {done.returncode}):\n{done.stdout[-2000:]}")
    out = json.loads(lines[-1])
    result = Table("parallel", f"LeNet5 on {out['workers']} msrun CPU workers, {MICRO} samples per rank per "
                   f"micro-batch, K={K}, pre-loaded tensors", f"window ({K} x {MICRO} samples per rank)", BIG)
    result.rows = out["samples_ms"]
    return result


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--windows", type=int, default=8, help="windows per contender per round")
    args = parser.parse_args()
    worker(args.rounds, args.windows)
