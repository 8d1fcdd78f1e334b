"""The optimizer state sharded across msrun ranks: peak memory per rank and a window's time, sharded or not.

    python -m benchmarks --only sharding            (starts msrun itself)
    msrun --worker_num=N --local_worker_num=N --master_port=P --join=True --log_dir=DIR \\
        benchmarks/sharding.py NET sharded|unsharded [--windows W]     (or `python benchmarks/sharding.py ...`: one
                                                                          process on the same per-rank work)

The networks users shard for are parameter-heavy: `mlp` is 12 layers of 2048 x 2048 (192 MiB of parameters), `encoder`
4 transformer layers of width 768 (`tests/plan_scripts/parameter_heavy.py`, 132 MiB). AdamW, K=4 micro-batches of 8
per rank, through `GradientAccumulation.train_process` over a dataset, in a fresh process each. Every rank prints its
peak resident memory (VmHWM) and its windows' times as one JSON line.
"""
import argparse
import json
import os
import socket
import subprocess
import sys
import tempfile
import time

import numpy as np

if __name__ == "__main__":  # started by msrun or alone as a script: this checkout first
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

K, MICRO = 4, 8


def peak_mib() -> float:
    with open("/proc/self/status", encoding="utf-8") as status:
        return next(int(line.split()[1]) for line in status if line.startswith("VmHWM")) / 1024


def build(net_name: str):
    """The network, its loss, and a function of n giving n samples `(x, y)`."""
    import mindspore as ms
    from mindspore import nn
    ms.set_seed(0)
    if net_name in ("mlp", "mlp1"):
        net = nn.SequentialCell([nn.Dense(2048, 2048) for _ in range(12 if net_name == "mlp" else 1)])
        return net, nn.MSELoss(), lambda n: (np.ones((n, 2048), np.float32), np.zeros((n, 2048), np.float32))
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "tests",
                                    "plan_scripts"))
    from parameter_heavy import encoder_4x768  # noqa: E402  (the plan_budget benchmark's encoder)
    net, loss, _, sample, _ = encoder_4x768()
    return net, loss, sample


def worker(net_name: str, sharded: bool, windows: int, save: bool = False) -> None:
    import mindspore.dataset as ds
    from mindspore import nn
    from ms_accum import GradientAccumulation, set_device
    from ms_accum.train.distributed import distributed_launch, init_data_parallel
    from ms_accum.train.options import Checkpoints, LogOptions
    info = init_data_parallel() if distributed_launch() else None
    set_device("CPU")
    net, loss, data = build(net_name)
    optimizer = nn.AdamWeightDecay(net.trainable_params(), 1e-4, weight_decay=0.01)
    executor = GradientAccumulation(net, loss, optimizer, shard_optimizer=sharded)
    x, y = data(K * MICRO * windows)
    times = []

    def on_step(record):
        times.append(time.perf_counter())

    dataset = ds.NumpySlicesDataset({"x": x, "y": y}, shuffle=False).batch(MICRO)
    with tempfile.TemporaryDirectory() as directory:  # with `save`, the training state saved after every window
        checkpoints = Checkpoints(directory, save_every=1, keep_last=1) if save else None
        executor.train_process(1, dataset, K, checkpoints=checkpoints, log=LogOptions(verbose=False, on_step=on_step))
    steps = np.diff(times)[1:]  # the first windows compile
    params = sum(p.size * 4 for p in net.trainable_params()) / 2 ** 20
    print("SHARDING " + json.dumps({"rank": 0 if info is None else info.rank, "peak_mib": round(peak_mib(), 1),
                                    "params_mib": round(params, 1), "window_s": float(np.median(steps))}), flush=True)


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def launch(net_name: str, sharded: bool, ranks: int, windows: int, save: bool = False, timeout: float = 1200) -> list:
    """Every rank's JSON line of one fresh run (`ranks` = 1: one process, no msrun)."""
    from benchmarks.common import REPO
    args = [__file__, net_name, "sharded" if sharded else "unsharded", "--windows", str(windows),
            *(["--save"] if save else [])]
    env = {**os.environ, "GLOG_v": "3", "PYTHONPATH": REPO}
    with tempfile.TemporaryDirectory() as log_dir:
        if ranks == 1:
            done = subprocess.run([sys.executable, *args], capture_output=True, text=True, env=env, timeout=timeout,
                                  check=True)
            text = done.stdout
        else:
            bin_dir = os.path.dirname(sys.executable)
            subprocess.run([os.path.join(bin_dir, "msrun"), f"--worker_num={ranks}", f"--local_worker_num={ranks}",
                            f"--master_port={_free_port()}", "--join=True", f"--log_dir={log_dir}", *args],
                           capture_output=True, text=True, timeout=timeout, check=True,
                           env={**env, "PATH": bin_dir + os.pathsep + os.environ.get("PATH", "")})
            text = "".join(open(os.path.join(log_dir, f"worker_{r}.log"), encoding="utf-8",
                                errors="replace").read() for r in range(ranks))
    return [json.loads(line.split("SHARDING ", 1)[1]) for line in text.splitlines() if "SHARDING " in line]


def measure(nets=("mlp", "encoder"), windows: int = 6, rounds: int = 3, log=print) -> list:
    """Peak memory per rank at 1, 2 and 4 ranks, sharded or not, and the window's time at 2 ranks over `rounds`
    alternated launches: one row per network."""
    rows = []
    for net_name in nets:
        log(f"sharding: {net_name}, one process")
        one = launch(net_name, False, 1, windows)[0]
        row = {"net": net_name, "params_mib": one["params_mib"], "one_process_mib": one["peak_mib"]}
        for ranks in (2, 4):
            for sharded in (False, True):
                log(f"sharding: {net_name}, {ranks} ranks, {'sharded' if sharded else 'unsharded'}")
                row[f"{ranks}_{sharded}"] = max(r["peak_mib"] for r in launch(net_name, sharded, ranks, windows))
        for sharded in (False, True):  # saving the training state after every window, at 2 ranks
            log(f"sharding: {net_name}, 2 ranks, {'sharded' if sharded else 'unsharded'}, saving")
            row[f"save_{sharded}"] = max(r["peak_mib"] for r in launch(net_name, sharded, 2, windows, save=True))
        times = {False: [], True: []}
        for _ in range(rounds):  # alternated, so a slower spell of the machine falls on both
            for sharded in (False, True):
                times[sharded].append(max(r["window_s"] for r in launch(net_name, sharded, 2, windows)))
        row["window_s"] = times
        row["time_ratio"] = float(np.median(np.asarray(times[True]) / np.asarray(times[False])))
        rows.append(row)
    return rows


def render(rows: list) -> str:
    lines = ["== sharding. AdamW, K=4 x B=8 per rank, through train_process: the peak RSS of the largest rank (MiB), "
             "and in units of the parameters above one process on the same per-rank work; the sharded rank's saving "
             "against the unsharded one; a window's time sharded / unsharded at 2 ranks (median of alternated "
             "launches' ratios)",
             "network  | params | 1 process | ranks | unsharded        | sharded          | saving | window time"]
    for row in rows:
        params = row["params_mib"]

        def over(peak):
            return f"{peak:7.0f} ({(peak - row['one_process_mib']) / params:+.2f}x)"

        for ranks in (2, 4):
            plain, sharded = row[f"{ranks}_False"], row[f"{ranks}_True"]
            time_ratio = f"{row['time_ratio']:.3f}x" if ranks == 2 else ""
            lines.append(f"{row['net']:8} | {params:6.0f} | {row['one_process_mib']:9.0f} | {ranks:5} | "
                         f"{over(plain):16} | {over(sharded):16} | {(plain - sharded) / params:5.2f}x | {time_ratio}")
        plain, sharded = row["save_False"], row["save_True"]
        lines.append(f"{row['net']:8} | {params:6.0f} | {row['one_process_mib']:9.0f} | 2, saving every window | "
                     f"{over(plain):16} | {over(sharded):16} | {(plain - sharded) / params:5.2f}x |")
    return "\n".join(line.rstrip() for line in lines)


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("net", choices=("mlp", "mlp1", "encoder"))
    parser.add_argument("mode", choices=("sharded", "unsharded"))
    parser.add_argument("--windows", type=int, default=6)
    parser.add_argument("--save", action="store_true", help="save the training state after every window")
    options = parser.parse_args()
    worker(options.net, options.mode == "sharded", options.windows, options.save)
