"""Data parallel under msrun: two CPU workers equal one process on the concatenated global batch.

The msrun tests (marked `distributed`) start real workers: `dist_scripts/dp_worker.py` trains every case of
`dist_scripts/dp_cases.py` on each rank's share of the global micro-batches, including shares of unequal size, and
this process trains the single-process reference on the concatenation. The number of all-reduce kernels run is
taken from MindSpore's own CPU profiler in the workers. Two msrun launches act as two nodes of 2 workers (the
cases of `NODE_CASES`, and `ms-accum train`). `fault_scripts/resume_worker.py` under msrun is killed mid-window and
resumed, and resumed on one process with twice the K. The error paths are checked in-process.
"""
import functools
import glob
import json
import os
import signal
import socket
import subprocess
import sys
import time

import numpy as np
import pytest
import mindspore as ms
import mindspore.dataset as ds
from mindspore import Tensor, nn, ops

from ms_accum import GradientAccumulation, cli
from ms_accum.core import LossOnly
from ms_accum.train.checkpoint import load_checkpoint
from ms_accum.demo.data import make_synthetic_mnist
from ms_accum.core.parallel import data_parallel_info, in_buckets
from ms_accum.train.distributed import distributed_launch, init_data_parallel
from conftest import raises_exactly

SCRIPTS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "dist_scripts")
sys.path.insert(0, SCRIPTS)
from dp_cases import (CASES, NODE_CASES, NOISE_CASE, PAD, PROFILED_CASE, RAMP_CASE, global_micro_batches,  # noqa: E402
                      loss_fn, make_net, make_optimizer, nan_window, params_of, rank_share)

RTOL, ATOL = 1e-5, 1e-6
WORKERS = 2
MSRUN_TIMEOUT = 240  # seconds; a healthy run takes 20-40 s on 2 cores


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


# msrun starts the cluster's scheduler when --master_addr is an address of this machine. On a real second node it
# is not; on this machine it is for both launches, and the second scheduler fails to bind the port (msrun then exits
# 1 though training completes). So a node other than 0 runs msrun with the master address taken as remote, as it
# is on a real node (dist_scripts/remote_node.py).
REMOTE_NODE = os.path.join(SCRIPTS, "remote_node.py")


def start_msrun(log_dir, command, env=None, workers=WORKERS, local_workers=WORKERS, node=None, port=None):
    """Starts `msrun ... command`: `workers` CPU workers in all, `local_workers` of them on this node (`node`,
    with the master at 127.0.0.1, or None for a job on this machine alone)."""
    bin_dir = os.path.dirname(sys.executable)
    # msrun starts `python` from PATH: the venv's must come first.
    env = {**os.environ, "PATH": bin_dir + os.pathsep + os.environ.get("PATH", ""), "GLOG_v": "3", **(env or {})}
    launcher = [os.path.join(bin_dir, "msrun")] if not node else [sys.executable, REMOTE_NODE]
    nodes = [] if node is None else [f"--node_rank={node}", "--master_addr=127.0.0.1"]
    args = [*launcher, f"--worker_num={workers}", f"--local_worker_num={local_workers}",
            *nodes, f"--master_port={port or free_port()}", "--join=True", f"--log_dir={log_dir}", *command]
    # A session of its own, so a hung job (workers waiting on a dead peer) is killed whole, not just msrun.
    return subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env,
                            start_new_session=True)


def finish_msrun(proc, log_dir):
    """Waits for a started msrun; returns (returncode, msrun's output)."""
    try:
        output, _ = proc.communicate(timeout=MSRUN_TIMEOUT)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        output, _ = proc.communicate()
        pytest.fail(f"msrun did not finish in {MSRUN_TIMEOUT} s:\n{output[-3000:]}\n{worker_logs(log_dir)}")
    return proc.returncode, output


def msrun(log_dir, *command, env=None):
    """Runs `msrun ... command` with WORKERS CPU workers; returns (returncode, msrun's output)."""
    return finish_msrun(start_msrun(log_dir, command, env), log_dir)


def worker_logs(log_dir, tail=3000) -> str:
    text = []
    for path in sorted(glob.glob(os.path.join(log_dir, "*.log"))):
        with open(path, encoding="utf-8", errors="replace") as handle:
            lines = [line for line in handle if not line.startswith("[")]  # MindSpore's own log lines
        text.append(f"--- {os.path.basename(path)}\n{''.join(lines)[-tail:]}")
    return "\n".join(text)


def log_lines(log_dir, rank):
    with open(os.path.join(log_dir, f"worker_{rank}.log"), encoding="utf-8", errors="replace") as handle:
        return [line.rstrip("\n") for line in handle if not line.startswith("[")]


def two_node_msrun(log_prefix, command):
    """Runs `command` under two msrun launches acting as two nodes of 2 workers; returns each node's log dir."""
    port = free_port()
    logs = [f"{log_prefix}_node{node}" for node in (0, 1)]
    procs = [start_msrun(logs[node], command, workers=4, local_workers=2, node=node, port=port) for node in (0, 1)]
    for proc, log_dir in zip(procs, logs):
        code, output = finish_msrun(proc, log_dir)
        assert code == 0, f"msrun failed ({code}):\n{output[-3000:]}\n{worker_logs(log_dir)}"
    return logs


def single_process(*command):
    """Runs `python command...` in a fresh process, as one worker without a launcher; returns the finished run."""
    return subprocess.run([sys.executable, *command], capture_output=True, text=True, timeout=MSRUN_TIMEOUT,
                          env={**os.environ, "GLOG_v": "3"})


def assert_checkpoints_close(expected_path, got_path):
    """Every parameter of the two checkpoints equal within float32 summation-order tolerance."""
    expected, _ = load_checkpoint(str(expected_path))
    got, _ = load_checkpoint(str(got_path))
    for name, value in expected.items():
        np.testing.assert_allclose(got[name].asnumpy(), value.asnumpy(), rtol=1e-5, atol=1e-7, err_msg=name)


def rank_reports(out, script: str, name: str) -> list:
    """Runs `dist_scripts/<script> OUT` under msrun; returns each rank's OUT/<name>_rank<r>.json, in rank order."""
    code, output = msrun(str(out / "logs"), os.path.join(SCRIPTS, script), str(out))
    assert code == 0, f"msrun failed ({code}):\n{output[-3000:]}\n{worker_logs(str(out / 'logs'))}"
    reports = []
    for rank in range(WORKERS):
        with open(out / f"{name}_rank{rank}.json", encoding="utf-8") as handle:
            reports.append(json.load(handle))
    return reports


@pytest.fixture(scope="module")
def dp_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("dp")
    return out, rank_reports(out, "dp_worker.py", "report")


@pytest.fixture(scope="module")
def two_nodes(tmp_path_factory):
    """Two msrun launches on this machine acting as two nodes: 4 workers, 2 per node, one master address."""
    out = tmp_path_factory.mktemp("nodes")
    two_node_msrun(str(out / "logs"), [os.path.join(SCRIPTS, "dp_worker.py"), str(out), "nodes"])
    return out


class ReferenceStep(nn.Cell):
    """One plain step on a whole window: loss gradient (times `scale`), optional clipping, the optimizer."""

    def __init__(self, network, optimizer, clip_norm, scale):
        super().__init__(auto_prefix=False)
        self.network = network
        self.network.set_grad()
        self.optimizer = optimizer
        self.weights = optimizer.parameters
        self.clip_norm = clip_norm
        self.scale = float(scale)
        self.grad = ops.GradOperation(get_by_list=True, sens_param=True)

    def construct(self, x, y):
        loss = self.network(x, y)
        grads = self.grad(self.network, self.weights)(x, y, ops.fill(ops.dtype(loss), ops.shape(loss), self.scale))
        if self.clip_norm is not None:
            grads = ops.clip_by_global_norm(grads, self.clip_norm)
        return ops.depend(loss, self.optimizer(grads))


def reference_run(case):
    """One process, one step per window on the window's concatenated global batch (a last partial one too): the
    parameters, and each window's loss (at the window's starting weights)."""
    net = make_net()
    batches = global_micro_batches(case)
    k = case["k"]
    windows = [batches[i:i + k] for i in range(0, len(batches), k)]
    if nan_window(case) is not None:  # skipped on every rank: the reference does not step on it
        del windows[nan_window(case)]
    # "sum" adds the window's micro-batch means over every rank, the sum over the global batch's micro-batches (no
    # parallel context, so no division by the ranks): with equal micro-batches, k x ranks times the window's mean.
    if case["reduction"] == "sum":
        assert all(len(w) == k for w in windows) and len(set(case["sizes"])) == 1
    scale = k * len(case["sizes"]) if case["reduction"] == "sum" else 1
    # A token case's large batch has the mean over all its real tokens as its loss.
    loss = LossOnly(loss_fn(case)) if case["reduction"] == "weighted_mean" else loss_fn(case)
    step = ReferenceStep(nn.WithLossCell(net, loss), make_optimizer(case["optimizer"], net.trainable_params()),
                         case["clip_norm"], scale)
    step.set_train()
    losses = [float(step(Tensor(np.concatenate([x for x, _ in window])),
                         Tensor(np.concatenate([y for _, y in window]))).asnumpy()) for window in windows]
    return params_of(net), losses


@functools.lru_cache(maxsize=None)
def reference_of(name):
    """`reference_run` of `CASES[name]`, once per module: two tests compare with each executor case's."""
    return reference_run(CASES[name])


@pytest.mark.slow  # make test-all (make test's msrun launch is the README's)
@pytest.mark.distributed
def test_dropout_under_data_parallel_is_the_same_in_every_run_and_resumes_bit_identical(dp_run):
    """Every rank draws its masks from ms_accum's streams: two whole runs end bit-identical, a run stopped after step 4
    and resumed from rank 0's state file by a new network and executor ends as the whole run, and the ranks agree."""
    out, reports = dp_run
    runs = {name: [dict(np.load(out / f"dropout_{name}_rank{rank}.npz")) for rank in range(WORKERS)]
            for name in ("whole", "again", "stopped")}
    assert all(report["dropout_resumed_from"].endswith("stopped-000000004.ckpt") for report in reports)
    for name in ("again", "stopped"):
        for rank in range(WORKERS):
            for key, value in runs["whole"][rank].items():
                assert np.array_equal(runs[name][rank][key], value), (name, rank, key)
    for key, value in runs["whole"][0].items():
        assert np.array_equal(runs["whole"][1][key], value), key


@pytest.mark.slow  # make test-all (make test's msrun launch is the README's)
@pytest.mark.distributed
def test_a_ramp_under_data_parallel_equals_its_fixed_k_segments_and_one_process(dp_run):
    # K from the global samples consumed: the ranks' micro-batches of 2 and 6 count as 8, so both ranks open the same
    # windows; the ramped run equals its fixed-K segments bit for bit on each rank, and one process on the global
    # micro-batches with the same schedule.
    out, reports = dp_run
    runs = {name: [dict(np.load(out / f"{name}_rank{rank}.npz")) for rank in range(WORKERS)]
            for name in ("ramp", "ramp_segments")}
    for key in runs["ramp"][0]:
        assert np.array_equal(runs["ramp"][0][key], runs["ramp"][1][key]), key
        for rank in range(WORKERS):
            assert np.array_equal(runs["ramp"][rank][key], runs["ramp_segments"][rank][key]), (rank, key)
    assert reports[0]["ramp_steps"] == reports[1]["ramp_steps"] == [[1, 8], [1, 16], [2, 32], [2, 48], [4, 80]]
    net = make_net()
    executor = GradientAccumulation(net, loss_fn(), make_optimizer(RAMP_CASE["optimizer"], net.trainable_params()),
                                    structure=RAMP_CASE["structure"])
    batches = global_micro_batches(RAMP_CASE)
    data = {"x": np.concatenate([x for x, _ in batches]), "y": np.concatenate([y for _, y in batches])}
    executor.train_process(1, ds.NumpySlicesDataset(data, shuffle=False).batch(sum(RAMP_CASE["sizes"])),
                           RAMP_CASE["schedule"], ckpt_dir=None, verbose=False)
    for key, value in params_of(net).items():
        np.testing.assert_allclose(runs["ramp"][0][key], value, rtol=RTOL, atol=ATOL, err_msg=key)


@pytest.mark.slow  # make test-all (make test's msrun launch is the README's)
@pytest.mark.distributed
def test_an_outlier_on_one_rank_is_left_out_there_and_the_ranks_stay_identical(dp_run):
    out, reports = dp_run
    assert reports[0]["outliers"] == [] and reports[1]["outliers"] == [[1, 25]]
    ranks = [dict(np.load(out / f"outliers_rank{rank}.npz")) for rank in range(WORKERS)]
    for key in ranks[0]:
        assert np.array_equal(ranks[0][key], ranks[1][key]), key


@pytest.mark.slow  # make test-all (make test's msrun launch is the README's)
@pytest.mark.distributed
def test_noise_scale_under_data_parallel_matches_the_exact_value(dp_run):
    # K=2 micro-batches of 4 on each of 2 ranks: B_small 4, B_big 16, the micro-batches' norms all-reduced.
    _, reports = dp_run
    estimates = [report["noise_scale"]["estimate"] for report in reports]
    exact = reports[0]["noise_scale"]["exact"]
    assert estimates[0] == estimates[1] and reports[0]["noise_scale"]["windows"] == NOISE_CASE["samples"] // 16
    assert abs(estimates[0] / exact - 1) < 0.10, (estimates, exact)


@pytest.mark.slow  # make test-all (make test's msrun launch is the README's)
@pytest.mark.distributed
@pytest.mark.parametrize("name", list(CASES))
def test_ranks_equal_single_process_on_global_batch(dp_run, name):
    out, reports = dp_run
    # Trained with MindSpore's parallel context never set (dp_worker makes set_auto_parallel_context raise).
    assert [r["parallel_mode"] for r in reports] == ["stand_alone"] * WORKERS
    ranks = [dict(np.load(out / f"{name}_rank{rank}.npz")) for rank in range(WORKERS)]
    for key in ranks[0]:
        # Both ranks apply the same all-reduced window: bit-identical parameters.
        assert np.array_equal(ranks[0][key], ranks[1][key]), f"{name}: '{key}' differs between the ranks"
    expected, _ = reference_of(name)
    start = params_of(make_net())
    for key, value in expected.items():
        assert not np.allclose(value, start[key]), f"{name}: '{key}' did not train"
        np.testing.assert_allclose(ranks[0][key], value, rtol=RTOL, atol=ATOL, err_msg=f"{name}: '{key}'")


@pytest.mark.slow  # make test-all
@pytest.mark.distributed
@pytest.mark.parametrize("name", list(NODE_CASES))
def test_two_nodes_of_two_workers_equal_single_process_on_global_batch(two_nodes, name):
    ranks = [dict(np.load(two_nodes / f"{name}_rank{rank}.npz")) for rank in range(4)]
    reports = [json.loads((two_nodes / f"report_rank{rank}.json").read_text()) for rank in range(4)]
    assert [r["group_size"] for r in reports] == [4] * 4 and sorted(r["rank"] for r in reports) == [0, 1, 2, 3]
    expected, _ = reference_run(NODE_CASES[name])
    for key, value in expected.items():
        for rank in range(1, 4):
            assert np.array_equal(ranks[0][key], ranks[rank][key]), f"{name}: '{key}' differs on rank {rank}"
        np.testing.assert_allclose(ranks[0][key], value, rtol=RTOL, atol=ATOL, err_msg=f"{name}: '{key}'")


def test_token_cases_give_the_ranks_very_different_token_counts():
    for name, case in CASES.items():
        if "lengths" in case:
            shares = [[rank_share(case, batch, rank) for batch in global_micro_batches(case)] for rank in range(2)]
            counts = [sum(int((y != PAD).sum()) for _, y in share) for share in shares]
            assert counts[0] >= 4 * counts[1], (name, counts)  # a per-rank mean would weight rank 1's tokens more


@pytest.mark.slow  # make test-all (make test's msrun launch is the README's)
@pytest.mark.distributed
@pytest.mark.parametrize("name", ["executor_fused", "executor_window", "executor_three_graphs", "executor_tokens"])
def test_the_logged_loss_is_the_global_windows(dp_run, name):
    # Ranks holding different numbers of samples (or tokens) log the same loss: the global batch's, not their share's.
    _, reports = dp_run
    _, expected = reference_of(name)
    assert reports[0][name]["losses"] == reports[1][name]["losses"]
    np.testing.assert_allclose(reports[0][name]["losses"], expected, rtol=1e-5)


@pytest.mark.slow  # make test-all (make test's msrun launch is the README's)
@pytest.mark.distributed
def test_a_nan_on_one_rank_skips_the_window_and_scales_down_on_every_rank(dp_run):
    _, reports = dp_run
    runs = [report["executor_nan_on_one_rank"] for report in reports]
    # Window 2 holds rank 1's NaN: both ranks skip it and halve the dynamic scale together (parameters: above).
    assert runs[0]["skipped"] == runs[1]["skipped"] == [False, True, False]
    assert runs[0]["loss_scale"] == runs[1]["loss_scale"] == [1024.0, 512.0, 512.0]


def test_the_buffer_is_all_reduced_in_buckets_big_tensors_alone():
    # What the host all-reduces in one launch each (`Closer.all_reduce`): a graph holds its reduced copies until it
    # ends, so no bucket is above the cap unless it is one tensor, and small networks' tensors share a launch.
    mib = 2 ** 20
    tensors = [Tensor(np.zeros(n // 4, np.float32)) for n in (5 * mib, 40, 3 * mib, mib, 28, 4 * mib, 2 * mib)]
    index = {id(t): i for i, t in enumerate(tensors)}
    assert [[index[id(t)] for t in bucket] for bucket in in_buckets(tensors, cap=4 * mib)] == [[0], [5], [1, 2],
                                                                                                [3, 4, 6]]
    assert [[index[id(t)] for t in bucket] for bucket in in_buckets(tensors[1:3])] == [[1, 2]] and not in_buckets([])


@pytest.mark.slow  # make test-all (make test's msrun launch is the README's)
@pytest.mark.distributed
def test_one_all_reduce_per_tensor_per_window_not_per_micro_batch(dp_run):
    _, reports = dp_run
    for report in reports:
        profiled = report["profiled"]
        assert profiled["case"] == PROFILED_CASE
        windows, tensors, micro_steps = profiled["windows"], profiled["tensors"], profiled["micro_steps"]
        # MindSpore's profiler counts AllReduce kernel executions: each window all-reduces its buffer (one per
        # parameter tensor), its sample count and the guard's two counts (one stacked tensor), once. Reducing
        # every micro-batch's gradients instead, as nn.DistributedGradReducer in a train-one-step Cell does, would
        # run micro_steps * tensors of them.
        assert profiled["allreduce_launches"] == windows * (tensors + 2)
        assert micro_steps == 4 * windows and profiled["allreduce_launches"] < micro_steps * tensors


@pytest.mark.slow  # make test-all (make test's msrun launch is the README's)
@pytest.mark.distributed
def test_executor_saves_on_rank_0_only_and_refuses_uneven_shards(dp_run):
    out, reports = dp_run
    for name in ("executor_fused", "executor_window", "executor_three_graphs"):
        assert reports[0][name]["checkpoint"] == str(out / "ckpt" / f"{CASES[name]['structure']}.ckpt")
        assert reports[1][name]["checkpoint"] is None
        assert reports[0][name]["steps"] == reports[1][name]["steps"] == 3  # two full windows and a partial one
    assert sorted(os.listdir(out / "ckpt")) == ["fused.ckpt", "three_graphs.ckpt", "window.ckpt"]
    for report in reports:
        assert report["mismatch_error"] == (
            "For 'GradientAccumulation.train_process', the number of batches of 'train_dataset' must be the same "
            "on every rank, but got [3, 4] on ranks 0 to 1.")
    log = "\n".join(log_lines(str(out / "logs"), 0))
    assert "epoch: 1 step: 3 loss is" in log
    assert "loss is" not in "\n".join(log_lines(str(out / "logs"), 1))


@pytest.mark.slow  # make test-all
@pytest.mark.distributed
def test_cli_train_under_msrun(tmp_path):
    # No MNIST where the CLI looks: each worker falls back to a synthetic set of its own.
    missing = tmp_path / "nowhere" / "MNIST_Data"
    ckpt_dir = tmp_path / "ckpt"
    ms_accum = os.path.join(os.path.dirname(sys.executable), "ms-accum")
    code, output = msrun(str(tmp_path / "logs"), ms_accum, "train", "--model", "lenet5", "--accumulate-step", "2",
                         "--batch-size", "32", "--num-samples", "512", "--synthetic-fallback",
                         "--ckpt-dir", str(ckpt_dir), "--json", "--quiet", env={"MS_ACCUM_MNIST": str(missing)})
    assert code == 0, f"msrun failed ({code}):\n{output[-3000:]}\n{worker_logs(str(tmp_path / 'logs'))}"
    summary = json.loads(log_lines(str(tmp_path / "logs"), 0)[-1])
    # 512 images in global micro-batches of 32 (16 per worker), two per window: 8 optimizer steps.
    assert summary["world_size"] == 2 and summary["optimizer_steps"] == 8 and summary["synthetic"]
    assert summary["data"] == str(tmp_path / "nowhere" / "synthetic" / "rank0" / "MNIST_Data")
    assert sorted(os.listdir(tmp_path / "nowhere" / "synthetic")) == ["rank0", "rank1"]
    assert sorted(os.listdir(ckpt_dir)) == ["lenet5.ckpt", "lenet5_loss.png"]
    _, meta = load_checkpoint(str(ckpt_dir / "lenet5.ckpt"))
    assert (meta["world_size"], meta["batch_size"], meta["step"]) == (2, 32, 8)
    assert log_lines(str(tmp_path / "logs"), 1) == []  # rank 1 prints nothing, not even the fallback notice


@pytest.mark.slow  # make test-all
@pytest.mark.distributed
def test_a_refused_checkpoint_directory_ends_every_rank_each_saying_why(tmp_path):
    # Rank 0 alone saves, yet every rank decides, and they share their verdicts before any waits in a collective:
    # rank 1 refuses too, instead of waiting for rank 0 until msrun gives up (46-50 s), and each worker's log says why.
    (tmp_path / "a_file").write_text("")
    ms_accum = os.path.join(os.path.dirname(sys.executable), "ms-accum")
    code, _ = msrun(str(tmp_path / "logs"), ms_accum, "train", "--model", "mlp", "--accumulate-step", "2",
                    "--batch-size", "32", "--num-samples", "256", "--synthetic-fallback", "--quiet",
                    "--ckpt-dir", str(tmp_path / "a_file" / "ckpt"),
                    env={"MS_ACCUM_MNIST": str(tmp_path / "nowhere" / "MNIST_Data")})
    assert code != 0
    for rank in range(WORKERS):
        last = log_lines(str(tmp_path / "logs"), rank)[-1]
        refused = f"must be a writable directory, but '{tmp_path / 'a_file' / 'ckpt'}' cannot be created: Not a directory."
        assert last.startswith("ms-accum train: error: ") and "--ckpt-dir" in last and last.endswith(refused), rank


@pytest.mark.slow  # make test-all
@pytest.mark.distributed
def test_any_error_on_one_rank_before_the_shared_verdict_ends_every_rank_in_seconds(tmp_path):
    # Rank 1's check raises a KeyError, no refusal of ms_accum's: it must still take part in the verdicts' all-reduce,
    # or rank 0 waits in it for good. Both end within a minute of the start (init takes 5-12 s a worker), each log
    # ending with why; msrun's scheduler then waits out its heartbeats (30 s more), so it is not waited for.
    logs = str(tmp_path / "logs")
    proc = start_msrun(logs, [os.path.join(SCRIPTS, "refuse_worker.py")])
    expected = ["ms_accum._validation.ArgumentValueError: the training state to resume from was refused on rank(s) "
                "[1], whose log says why: no rank starts.", "KeyError: \"'step' missing from the file read on rank 1\""]
    deadline, last = time.monotonic() + 60, None
    try:
        while time.monotonic() < deadline:
            last = [(log_lines(logs, rank) or [""])[-1] if os.path.exists(os.path.join(logs, f"worker_{rank}.log"))
                    else "" for rank in range(WORKERS)]
            if all(line.endswith(("Error", "rank 1\"", "starts.")) for line in last):
                break
            time.sleep(0.5)
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.communicate()
    assert last == expected, worker_logs(logs)
    assert all("started" not in log_lines(logs, rank) for rank in range(WORKERS))


# --- Error paths, in this process (no launcher) ---

@pytest.fixture
def no_launcher(monkeypatch):
    for key in ("MS_ROLE", "MS_WORKER_NUM"):
        monkeypatch.delenv(key, raising=False)


@pytest.fixture
def restore_parallel_context():
    yield
    ms.reset_auto_parallel_context()


def test_distributed_launch_reads_msrun_environment():
    assert distributed_launch({}) is None
    assert distributed_launch({"MS_WORKER_NUM": "2"}) is None  # not a role msrun gives
    assert distributed_launch({"MS_ROLE": "MS_WORKER", "MS_WORKER_NUM": "2"}) == 2
    assert distributed_launch({"MS_ROLE": "MS_SCHED", "MS_WORKER_NUM": "4"}) == 4
    with raises_exactly(ValueError, "For 'distributed_launch', the environment variable 'MS_WORKER_NUM' must be a "
                                    "positive int, but got 'two'."):
        distributed_launch({"MS_ROLE": "MS_WORKER", "MS_WORKER_NUM": "two"})


def test_init_without_launcher_is_refused(no_launcher):
    with raises_exactly(RuntimeError, "For 'init_data_parallel', distributed mode requested without a launcher: start "
                                      "it with msrun in front of its command, e.g. 'msrun --worker_num=2 "
                                      "--local_worker_num=2 --master_port=8118 --join=True <command>' (the environment "
                                      "variables MS_ROLE and MS_WORKER_NUM are not set)."):
        init_data_parallel()


def test_cli_distributed_flag_without_launcher(no_launcher, tmp_path, capsys):
    assert cli.main(["train", "--distributed", "--ckpt-dir", str(tmp_path), "--quiet"]) == 1
    assert capsys.readouterr().err == (
        "ms-accum train: error: For 'ms-accum train', distributed mode requested without a launcher: start it with "
        "msrun in front of its command, e.g. 'msrun --worker_num=2 --local_worker_num=2 --master_port=8118 --join=True "
        "<command>' (the environment variables MS_ROLE and MS_WORKER_NUM are not set).\n")
    assert not os.listdir(tmp_path)


def test_cli_world_size_must_divide_global_batch(monkeypatch, tmp_path, capsys):
    monkeypatch.setenv("MS_ROLE", "MS_WORKER")
    monkeypatch.setenv("MS_WORKER_NUM", "2")
    assert cli.main(["train", "--batch-size", "33", "--ckpt-dir", str(tmp_path), "--quiet"]) == 1
    assert capsys.readouterr().err.strip() == (
        "ms-accum train: error: For 'ms-accum train', the argument '--batch-size' (the global micro-batch) must be "
        "divisible by the world size 2, but got 33.")


def test_unsupported_parallel_mode_is_refused(restore_parallel_context):
    from ms_accum import Accumulator, GradientAccumulation
    from ms_accum.graphs import TrainAccumulationCell
    net = nn.Dense(3, 2)
    optimizer = nn.SGD(net.trainable_params(), 0.1)
    ms.set_auto_parallel_context(parallel_mode=ms.ParallelMode.SEMI_AUTO_PARALLEL)
    message = "the parallel mode must be 'stand_alone' or 'data_parallel', but got 'semi_auto_parallel'."
    with raises_exactly(ValueError, f"For 'Accumulator', {message}"):
        Accumulator(optimizer, 2)
    with raises_exactly(ValueError, f"For 'TrainAccumulationCell', {message}"):
        TrainAccumulationCell(nn.WithLossCell(net, nn.MSELoss()), optimizer, 2)
    with raises_exactly(ValueError, f"For 'GradientAccumulation', {message}"):
        GradientAccumulation(net, nn.MSELoss(), optimizer)


def test_data_parallel_before_init_is_refused(restore_parallel_context):
    ms.set_auto_parallel_context(parallel_mode=ms.ParallelMode.DATA_PARALLEL)
    message = ("the parallel mode is 'data_parallel', which needs mindspore.communication.init() first, but it was "
               "not called.")
    with raises_exactly(ValueError, f"For 'data_parallel_info', {message}"):
        data_parallel_info()
    from ms_accum import Accumulator  # what the user called, not the check inside it
    with raises_exactly(ValueError, f"For 'Accumulator', {message}"):
        Accumulator(nn.SGD(nn.Dense(3, 2).trainable_params(), 0.1), 2)


RESUME_WORKER = os.path.join(os.path.dirname(SCRIPTS), "fault_scripts", "resume_worker.py")


@pytest.mark.slow  # make test-all
@pytest.mark.distributed
def test_a_worker_killed_mid_window_then_resumed_under_msrun_is_bit_identical(tmp_path):
    def launch(ckpt_dir, fault):
        return msrun(str(ckpt_dir / f"logs_{fault.replace(':', '_').replace('@', '_')}"), RESUME_WORKER,
                     str(ckpt_dir), "three_graphs", fault)

    reference = tmp_path / "reference"
    code, output = launch(reference, "none")
    assert code == 0, output[-3000:]
    expected = [dict(np.load(reference / f"params_rank{rank}.npz")) for rank in range(WORKERS)]

    killed = tmp_path / "killed"
    # Rank 1 dies by SIGKILL after its 8th micro-batch, two thirds into the third window (2 steps saved): msrun
    # then ends the job, rank 0 included, without a final checkpoint.
    code, output = launch(killed, "micro:8@1")
    assert code != 0 and not os.path.exists(killed / "run.ckpt"), output[-3000:]
    # The state of step 2, which rank 0 alone writes (the save plan of other ranks is empty), and every rank reads.
    assert sorted(os.listdir(killed)) == ["logs_micro_8_1", "run-000000002.ckpt"]

    code, output = launch(killed, "none")  # the same command: it resumes from the newest state, on every rank
    assert code == 0, output[-3000:]
    summary = json.loads(log_lines(str(killed / "logs_none"), 0)[-1])
    assert summary["resumed_from"] == str(killed / "run-000000002.ckpt") and summary["steps"][0] == 3
    final, _ = load_checkpoint(str(killed / "run.ckpt"))
    reference_final, _ = load_checkpoint(str(reference / "run.ckpt"))
    for rank in range(WORKERS):
        got = dict(np.load(killed / f"params_rank{rank}.npz"))
        for name, value in expected[rank].items():
            assert np.array_equal(got[name], value), f"rank {rank}: '{name}'"
    for name, value in reference_final.items():
        assert np.array_equal(final[name].asnumpy(), value.asnumpy()), name


@pytest.mark.slow  # make test-all
@pytest.mark.distributed
def test_adaptive_k_decides_the_same_k_on_every_rank(tmp_path):
    # AdaptiveK from K=1 (two ranks give the noise scale two batch sizes), the rate scaled linearly, outliers left out
    # on each rank: every rank decides from the one all-reduced estimate, so the Ks and the parameters agree.
    code, output = msrun(str(tmp_path / "logs"), RESUME_WORKER, str(tmp_path), "three_graphs", "none",
                         "adaptive:1:8:linear", "480")
    assert code == 0, f"msrun failed ({code}):\n{output[-3000:]}\n{worker_logs(str(tmp_path / 'logs'))}"
    ranks = [json.loads(log_lines(str(tmp_path / "logs"), rank)[-1]) for rank in range(WORKERS)]
    assert len(set(ranks[0]["k"])) > 2, ranks[0]["k"]  # K moved
    for rank in ranks[1:]:
        assert (rank["k"], rank["noise_scale"], rank["lr_scale"]) == (ranks[0]["k"], ranks[0]["noise_scale"],
                                                                     ranks[0]["lr_scale"])
    params = [dict(np.load(tmp_path / f"params_rank{rank}.npz")) for rank in range(WORKERS)]
    for name, value in params[0].items():
        assert np.array_equal(params[1][name], value), name


@pytest.mark.slow  # make test-all
@pytest.mark.distributed
def test_a_two_rank_run_resumes_on_one_process_with_twice_the_micro_batches(tmp_path):
    # 192 samples, micro-batches of 8 per rank: 2 ranks with K=3 and 1 process with K=6 both update on 48 samples,
    # the same ones (DistributedSampler: rank r of n reads r, r + n, ... of one shuffled order).
    def single(ckpt_dir, mini_steps, resume):
        return single_process(RESUME_WORKER, str(ckpt_dir), "three_graphs", "none", str(mini_steps), "192", "0",
                              resume)

    ranks = tmp_path / "ranks"
    code, output = msrun(str(ranks / "logs"), RESUME_WORKER, str(ranks), "three_graphs", "none", "3", "192", "0",
                         "latest")
    assert code == 0, output[-3000:]
    state = str(ranks / "run-000000002.ckpt")  # two windows into the first of two epochs of 4 windows
    refused = single(tmp_path / "refused", 4, state)
    assert refused.returncode != 0
    assert refused.stderr.strip().splitlines()[-1] == (  # the last line of the worker's traceback
        f"ms_accum.train.checkpoint.CheckpointError: Checkpoint '{state}' was saved with a global batch of 48 samples "
        f"per update (accumulate_step=3 x batch_size=8 x 2 rank(s)), but this run has 32 (accumulate_step=4 x "
        f"batch_size=8 x 1 rank(s)): resuming would not continue the same training; mini_steps=6 keeps it.")
    resumed = single(tmp_path / "one", 6, state)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert json.loads(resumed.stdout.strip().splitlines()[-1])["steps"] == [3, 4, 5, 6, 7, 8]
    assert_checkpoints_close(ranks / "run.ckpt", tmp_path / "one" / "run.ckpt")


@pytest.mark.slow  # make test-all
@pytest.mark.distributed
def test_cli_train_on_two_nodes_equals_one_process(tmp_path):
    # The same global micro-batch of 32 (8 on each of 4 ranks, or 32 in one process), read in the same order: the
    # data pipeline shards with MindSpore's DistributedSampler, 1 shard in one process.
    data = make_synthetic_mnist(str(tmp_path / "data"), num_train=512, num_test=64)
    train = ["train", "--model", "lenet5", "--accumulate-step", "2", "--batch-size", "32", "--data", data,
             "--no-eval", "--json", "--quiet"]
    ms_accum = os.path.join(os.path.dirname(sys.executable), "ms-accum")
    logs = two_node_msrun(str(tmp_path / "logs"), [ms_accum, *train, "--ckpt-dir", str(tmp_path / "nodes")])
    nodes = json.loads(log_lines(logs[0], 0)[-1])
    assert nodes["world_size"] == 4 and nodes["optimizer_steps"] == 8
    single = single_process("-m", "ms_accum.cli", *train, "--ckpt-dir", str(tmp_path / "one"))
    assert single.returncode == 0, single.stderr[-3000:]
    one = json.loads(single.stdout.strip().splitlines()[-1])
    assert one["world_size"] == 1 and one["optimizer_steps"] == 8
    np.testing.assert_allclose(nodes["final_loss"], one["final_loss"], rtol=1e-5)  # the global loss on both
    assert_checkpoints_close(tmp_path / "one" / "lenet5.ckpt", tmp_path / "nodes" / "lenet5.ckpt")


@pytest.mark.slow  # make test-all
@pytest.mark.distributed
def test_cli_run_on_two_workers_resumes_on_one_process(tmp_path):
    # --batch-size is the global micro-batch: 16 on each of 2 workers, then 32 in one process, the same 32 samples.
    data = make_synthetic_mnist(str(tmp_path / "data"), num_train=512, num_test=64)
    train = ["train", "--model", "lenet5", "--accumulate-step", "2", "--batch-size", "32", "--data", data,
             "--no-eval", "--json", "--quiet", "--save-every", "2", "--keep-last", "4"]  # step 2's state kept
    ms_accum = os.path.join(os.path.dirname(sys.executable), "ms-accum")
    code, output = msrun(str(tmp_path / "logs"), ms_accum, *train, "--ckpt-dir", str(tmp_path / "two"))
    assert code == 0, f"msrun failed ({code}):\n{output[-3000:]}\n{worker_logs(str(tmp_path / 'logs'))}"
    state = str(tmp_path / "two" / "lenet5-000000002.ckpt")
    single = single_process("-m", "ms_accum.cli", *train, "--ckpt-dir", str(tmp_path / "one"), "--resume", state)
    assert single.returncode == 0, single.stderr[-3000:]
    summary = json.loads(single.stdout.strip().splitlines()[-1])
    assert summary["resumed_from"] == state and summary["optimizer_steps"] == 6 and summary["world_size"] == 1
    assert_checkpoints_close(tmp_path / "two" / "lenet5.ckpt", tmp_path / "one" / "lenet5.ckpt")


@pytest.mark.slow  # make test-all
@pytest.mark.distributed
def test_cli_trains_your_model_under_msrun_as_one_process_on_the_global_batch(tmp_path):
    # A factory's dataset(batch_size, usage, shard_id, num_shards), sharded by MindSpore's DistributedSampler without
    # shuffling: the two workers' micro-batches of 8 together are the one process's micro-batch of 16. Its batches are
    # (input_ids, attention_mask, token_type_ids, label) (fixtures/tokens.py), scored every 8 steps over both shards.
    fixtures = os.path.join(os.path.dirname(os.path.abspath(__file__)), "fixtures")
    env = {"PYTHONPATH": os.pathsep.join([fixtures, os.environ.get("PYTHONPATH", "")])}
    train = ["train", "--model", "tokens:three_inputs", "--accumulate-step", "2", "--batch-size", "16",
             "--eval-every", "8", "--json", "--quiet"]
    ms_accum = os.path.join(os.path.dirname(sys.executable), "ms-accum")
    code, output = msrun(str(tmp_path / "logs"), ms_accum, *train, "--ckpt-dir", str(tmp_path / "two"), env=env)
    assert code == 0, f"msrun failed ({code}):\n{output[-3000:]}\n{worker_logs(str(tmp_path / 'logs'))}"
    two = json.loads(log_lines(str(tmp_path / "logs"), 0)[-1])
    assert two["world_size"] == 2 and two["optimizer_steps"] == 16 and two["accuracy"] is not None
    single = subprocess.run([sys.executable, "-m", "ms_accum.cli", *train, "--ckpt-dir", str(tmp_path / "one")],
                            capture_output=True, text=True, timeout=MSRUN_TIMEOUT,
                            env={**os.environ, "GLOG_v": "3", **env})
    assert single.returncode == 0, single.stderr[-3000:]
    one = json.loads(single.stdout.strip().splitlines()[-1])
    np.testing.assert_allclose(two["final_loss"], one["final_loss"], rtol=1e-5)
    np.testing.assert_allclose(two["loss"], one["loss"], rtol=1e-4)  # the evaluation, on rank 0
    assert two["accuracy"] == one["accuracy"]
    assert [v["step"] for v in two["validation"]] == [v["step"] for v in one["validation"]] == [8, 16]
    for scored, alone in zip(two["validation"], one["validation"]):  # each rank its shard, totalled over both
        np.testing.assert_allclose(scored["loss"], alone["loss"], rtol=1e-4)
        assert scored["accuracy"] == alone["accuracy"]
    assert_checkpoints_close(tmp_path / "one" / "tokens_three_inputs.ckpt",
                             tmp_path / "two" / "tokens_three_inputs.ckpt")
