"""One msrun worker of tests/test_distributed.py: trains every case of `dp_cases.CASES` on this rank's share.

    msrun --worker_num=2 --local_worker_num=2 --master_port=P --join=True dp_worker.py OUT_DIR
    msrun --worker_num=4 --local_worker_num=2 --node_rank=N --master_addr=127.0.0.1 --master_port=P --join=True \
        dp_worker.py OUT_DIR nodes         (N = 0 and 1: two nodes; only the cases of `dp_cases.NODE_CASES`)

Writes OUT_DIR/<case>_rank<r>.npz (the parameters after training) and OUT_DIR/report_rank<r>.json (the
AllReduce kernel launches MindSpore's profiler recorded during `PROFILED_CASE`, and what the run did).
"""
import glob
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.append(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # tests/: the Accumulator's train step

import numpy as np  # noqa: E402
import mindspore as ms  # noqa: E402
import mindspore.dataset as ds  # noqa: E402
from mindspore import Tensor, nn  # noqa: E402

from ms_accum import Accumulator, GradientAccumulation  # noqa: E402
from ms_accum.graphs import TrainAccumulationCell  # noqa: E402
from ms_accum.train.distributed import all_reduce_sum, init_data_parallel  # noqa: E402
from ms_accum.train.options import Checkpoints, LogOptions  # noqa: E402
from accumulator_step import accumulator_step  # noqa: E402
from dp_cases import (CASES, IN, NODE_CASES, NOISE_CASE, OUT, PROFILED_CASE, RAMP_CASE,  # noqa: E402
                      global_micro_batches, loss_fn, make_net, make_optimizer, params_of, rank_share,
                      regression_problem)


def train_cell(case, shares):
    net = make_net()
    cell = TrainAccumulationCell(nn.WithLossCell(net, loss_fn(case)), make_optimizer(case["optimizer"],
                                 net.trainable_params()), case["k"], case["clip_norm"], case["reduction"])
    cell.set_train()
    for x, y in shares:
        cell(Tensor(x), Tensor(y))
    return net


def train_accumulator(case, shares):
    net = make_net()
    optimizer = make_optimizer(case["optimizer"], net.trainable_params())
    accumulator = Accumulator(optimizer, case["k"], case["clip_norm"], case["reduction"])
    # Weighted by the real tokens the loss counts (mean over them, their count), else by the share's samples.
    weight = "returned" if case["reduction"] == "weighted_mean" else "rows"
    train_step = accumulator_step(net, loss_fn(case), accumulator, weight)
    for x, y in shares:
        train_step(Tensor(x), Tensor(y))
    accumulator.flush()  # from Python, outside the graph: the partial window's all-reduce runs eagerly
    return net


def train_executor(case, shares, out_dir):
    net = make_net()
    scaler = None
    if "loss_scale" in case:  # halved on overflow, doubled after 1000 clean windows
        scaler = ms.amp.DynamicLossScaler(case["loss_scale"], scale_factor=2, scale_window=1000)
    executor = GradientAccumulation(net, loss_fn(case), make_optimizer(case["optimizer"], net.trainable_params()),
                                    clip_norm=case["clip_norm"], reduction=case["reduction"],
                                    structure=case["structure"], loss_scaler=scaler)
    x = np.concatenate([s[0] for s in shares])
    y = np.concatenate([s[1] for s in shares])
    size = len(shares[0][0])
    dataset = ds.NumpySlicesDataset({"x": x, "y": y}, shuffle=False).batch(size)
    result = executor.train_process(1, dataset, case["k"], ckpt_dir=os.path.join(out_dir, "ckpt"),
                                    ckpt_name=case["structure"], verbose=True)
    return net, result


def ramp_runs(out_dir, rank):
    """`RAMP_CASE` on this rank's share: the ramped run, then its segments with fixed K; saves both parameter sets and
    returns the ramped run's (K, samples consumed) per step."""
    case = RAMP_CASE
    shares = [rank_share(case, batch, rank, i) for i, batch in enumerate(global_micro_batches(case))]
    x = np.concatenate([s[0] for s in shares])
    y = np.concatenate([s[1] for s in shares])
    size = len(shares[0][0])
    records = {}
    for name, runs in (("ramp", [(0, case["micro"], case["schedule"])]), ("ramp_segments", case["segments"])):
        net = make_net()
        executor = GradientAccumulation(net, loss_fn(), make_optimizer(case["optimizer"], net.trainable_params()),
                                        structure=case["structure"])
        steps = []
        for lo, hi, k in runs:
            data = {"x": x[lo * size:hi * size], "y": y[lo * size:hi * size]}
            result = executor.train_process(1, ds.NumpySlicesDataset(data, shuffle=False).batch(size), k,
                                            ckpt_dir=None, verbose=False)
            steps += [(r.accumulate_step, r.samples_consumed) for r in result.steps]
        np.savez(os.path.join(out_dir, f"{name}_rank{rank}.npz"), **params_of(net))
        records[name] = steps
    return records["ramp"]


def noise_scale_run(rank, ranks):
    """`NOISE_CASE` on this rank's shard, parameters held (learning rate 0): the estimate, and the exact value."""
    case = NOISE_CASE
    net, x, y, exact = regression_problem(case["samples"], case["noise_scale"])
    executor = GradientAccumulation(net, nn.MSELoss(), nn.SGD(net.trainable_params(), 0.0), noise_scale=True)
    ds.config.set_seed(1)
    dataset = ds.NumpySlicesDataset({"x": x, "y": y}, shuffle=True, num_shards=ranks, shard_id=rank)
    result = executor.train_process(1, dataset.batch(case["batch"]), case["k"], ckpt_dir=None, verbose=False)
    return {"estimate": result.steps[-1].noise_scale, "exact": exact, "windows": len(result.steps)}


def outlier_run(out_dir, rank):
    """40 micro-batches of 8 per rank, K=4; rank 1's batch 25 is a loss spike (inputs x1000, labels scrambled) and is
    left out there alone. Saves the parameters; returns the outliers this rank reported."""
    rng = np.random.default_rng(10 + rank)
    x = rng.standard_normal((320, IN)).astype(np.float32)
    y = rng.integers(0, OUT, 320).astype(np.int32)
    if rank == 1:
        x[200:208] *= 1000
        y[200:208] = (y[200:208] + 1) % OUT
    net = make_net()
    executor = GradientAccumulation(net, loss_fn(), make_optimizer("momentum", net.trainable_params()),
                                    skip_outliers=6.0, outlier_warmup=8)
    result = executor.train_process(1, ds.NumpySlicesDataset({"x": x, "y": y}, shuffle=False).batch(8), 4,
                                    ckpt_dir=None, verbose=False)
    np.savez(os.path.join(out_dir, f"outliers_rank{rank}.npz"), **params_of(net))
    return result.outliers


def dropout_runs(out_dir, rank, ranks):
    """A network with dropout, 2 epochs of 6 micro-batches of 4 per rank, K=2, Momentum: trained whole twice, and
    stopped after step 4 (its training state saved by rank 0) then resumed by a new network and executor. Saves each
    run's parameters (dropout_<run>_rank<r>.npz); returns the resumed run's file."""
    rng = np.random.default_rng(7)
    x = rng.standard_normal((48, IN)).astype(np.float32)
    y = rng.integers(0, OUT, 48).astype(np.int32)
    directory = os.path.join(out_dir, "dropout_ckpt")

    def run(name, stop_after=None, resume=None):
        ms.set_seed(0)  # the dropout seeds: the same on every rank and in every run
        ds.config.set_seed(0)
        net = nn.SequentialCell([nn.Dense(IN, 32), nn.ReLU(), nn.Dropout(p=0.3), nn.Dense(32, OUT)])
        executor = GradientAccumulation(net, loss_fn(), make_optimizer("momentum", net.trainable_params()))
        dataset = ds.NumpySlicesDataset({"x": x, "y": y}, shuffle=True, num_shards=ranks, shard_id=rank).batch(4)
        result = executor.train_process(
            2, dataset, 2, checkpoints=Checkpoints(directory=directory, name=name, save_every=2, resume=resume),
            log=LogOptions(verbose=False, on_step=lambda record: stop_after is not None and record.step == stop_after))
        np.savez(os.path.join(out_dir, f"dropout_{name}_rank{rank}.npz"), **params_of(net))
        return result

    run("whole")
    run("again")
    run("stopped", stop_after=4)
    all_reduce_sum(Tensor(np.ones(1, np.float32))).asnumpy()  # rank 0 has written the state before any rank reads it
    return run("stopped", resume=True).resumed_from


def mismatched_batches(rank):
    """Rank r gets 3 + r batches: the executor must refuse on every rank rather than hang; returns its message."""
    net = make_net()
    executor = GradientAccumulation(net, loss_fn(), make_optimizer("sgd", net.trainable_params()))
    rng = np.random.default_rng(rank)
    x = rng.standard_normal((2 * (3 + rank), IN)).astype(np.float32)
    y = rng.integers(0, OUT, (2 * (3 + rank),)).astype(np.int32)
    try:
        executor.train_process(1, ds.NumpySlicesDataset({"x": x, "y": y}, shuffle=False).batch(2), 2, ckpt_dir=None)
    except ValueError as err:
        return str(err)
    return None


def allreduce_launches(profile_dir):
    """AllReduce kernel executions in MindSpore's CPU profiler output (cpu_op_type_info_*.csv)."""
    files = glob.glob(os.path.join(profile_dir, "**", "cpu_op_type_info_*.csv"), recursive=True)
    if len(files) != 1:
        raise RuntimeError(f"expected one cpu_op_type_info csv under {profile_dir}, found {files}")
    with open(files[0], encoding="utf-8") as handle:
        header = handle.readline().strip().split(",")
        for line in handle:
            row = dict(zip(header, line.strip().split(",")))
            if row["op_type"] == "AllReduce":
                return int(row["type_occurrences"])
    return 0


def refuse_parallel_context(**kwargs):
    raise RuntimeError(f"set_auto_parallel_context({kwargs}) was called: data parallel must not need MindSpore's "
                       f"parallel context")


def main():
    out_dir = sys.argv[1]
    ms.set_context(mode=ms.GRAPH_MODE)
    # ms_accum's data parallel stands on plain collectives: MindSpore's parallel context, which 2.11 sunsets, is never
    # set (the call would raise here), and every case trains.
    ms.set_auto_parallel_context = ms.context.set_auto_parallel_context = refuse_parallel_context
    info = init_data_parallel()
    report = {"rank": info.rank, "group_size": info.group_size,
              "parallel_mode": ms.get_auto_parallel_context("parallel_mode")}
    nodes = sys.argv[2:] == ["nodes"]
    for name, case in (NODE_CASES if nodes else CASES).items():
        shares = [rank_share(case, batch, info.rank, i) for i, batch in enumerate(global_micro_batches(case))]
        profiler = None
        if name == PROFILED_CASE:
            profiler = ms.Profiler(output_path=os.path.join(out_dir, f"profile_rank{info.rank}"))
        if case["api"] == "cell":
            net = train_cell(case, shares)
        elif case["api"] == "accumulator":
            net = train_accumulator(case, shares)
        else:
            net, result = train_executor(case, shares, out_dir)
            report[name] = {"steps": len(result.steps), "checkpoint": result.checkpoint,
                            "skipped": [record.skipped for record in result.steps],
                            "loss_scale": [record.loss_scale for record in result.steps], "losses": result.losses}
        if profiler is not None:
            profiler.stop()
            profiler.analyse()
            report["profiled"] = {"case": name, "micro_steps": case["micro"], "windows": case["micro"] // case["k"],
                                  "tensors": len(net.trainable_params()),
                                  "allreduce_launches": allreduce_launches(profiler_dir(out_dir, info.rank))}
        np.savez(os.path.join(out_dir, f"{name}_rank{info.rank}.npz"), **params_of(net))
    if not nodes:
        report["mismatch_error"] = mismatched_batches(info.rank)
        report["ramp_steps"] = ramp_runs(out_dir, info.rank)
        report["noise_scale"] = noise_scale_run(info.rank, info.group_size)
        report["outliers"] = outlier_run(out_dir, info.rank)
        report["dropout_resumed_from"] = dropout_runs(out_dir, info.rank, info.group_size)
    with open(os.path.join(out_dir, f"report_rank{info.rank}.json"), "w", encoding="utf-8") as handle:
        json.dump(report, handle)
    print(f"rank {info.rank} done: {json.dumps(report)}", flush=True)


def profiler_dir(out_dir, rank):
    return os.path.join(out_dir, f"profile_rank{rank}")


if __name__ == "__main__":
    main()
