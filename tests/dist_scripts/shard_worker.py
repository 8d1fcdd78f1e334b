"""One msrun worker of tests/test_sharding.py: the optimizer state sharded across the ranks, against the same run
unsharded, in one launch.

    msrun --worker_num=N --local_worker_num=N --master_port=P --join=True shard_worker.py OUT_DIR [STATE_FILE]
    python shard_worker.py OUT_DIR STATE_FILE          (one process)

Every case of `CASES` trains twice on this rank's share, unsharded then ``shard_optimizer=True``, and writes
OUT_DIR/<case>_<sharded|unsharded>_rank<r>.npz. The checkpoint runs (`RESUME`) write training states into
OUT_DIR/<run>/ and their final parameters; given STATE_FILE (a sharded state of another number of ranks), this
launch resumes from it, sharded and unsharded, instead. OUT_DIR/report_rank<r>.json holds the AllReduce launches
MindSpore's profiler counted during `PROFILED` and what the runs did.
"""
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import numpy as np  # noqa: E402
import mindspore as ms  # noqa: E402
import mindspore.dataset as ds  # noqa: E402
from mindspore import nn  # noqa: E402

from ms_accum import GradientAccumulation  # noqa: E402
from ms_accum.train.distributed import distributed_launch, init_data_parallel  # noqa: E402
from cached_models import build  # noqa: E402
from dp_cases import IN, OUT, global_micro_batches, make_net, params_of, rank_share  # noqa: E402
from dp_worker import allreduce_launches, profiler_dir, refuse_parallel_context  # noqa: E402


def optimizer_of(name, params):
    """The case's optimizer over `params` (the network's, or a rank's part of them for a factory)."""
    if name == "sgd":
        return nn.SGD(params, 0.1)
    if name == "momentum":
        return nn.Momentum(params, 0.05, 0.9, weight_decay=0.01)
    if name == "adam_schedule":
        return nn.Adam(params, nn.CosineDecayLR(0.001, 0.02, 6), weight_decay=0.001)
    weights = [p for p in params if p.name.endswith("weight")]
    biases = [p for p in params if not p.name.endswith("weight")]
    if name == "rmsprop":  # not one ms_accum rebuilds: sharded by its factory, this function; an empty group left out
        groups = [{"params": weights, "lr": 0.02}, {"params": biases, "weight_decay": 0.01}]
        return nn.RMSProp([g for g in groups if g["params"]] + [{"order_params": params}], 0.01, momentum=0.5,
                          centered=True)
    # AdamW with groups: decay on the weights only, its own learning rate for the biases.
    return nn.AdamWeightDecay([{"params": weights, "weight_decay": 0.1}, {"params": biases, "lr": 0.02}], 0.01)


# name -> settings; `sizes` are the ranks' micro-batch sizes (2 ranks), `micro` micro-batches per rank (a partial
# window where micro % k != 0), `k` an int or a schedule of the global samples consumed.
CASES = {
    "sgd_auto": dict(optimizer="sgd", structure="auto", k=2, micro=5, sizes=(2, 6)),
    "momentum_fused_clip": dict(optimizer="momentum", structure="fused", k=2, micro=4, sizes=(4, 4), clip_norm=0.5),
    "adamw_groups_window": dict(optimizer="adamw", structure="window", k=2, micro=5, sizes=(3, 5)),
    "adam_schedule_k_ramp": dict(optimizer="adam_schedule", structure="three_graphs", k={0: 1, 16: 2, 48: 4},
                                 micro=10, sizes=(2, 6)),
    # A NaN in rank 1's third micro-batch, under dynamic loss scaling: every rank skips that window and halves.
    "adamw_nan_loss_scale": dict(optimizer="adamw", structure="fused", k=2, micro=6, sizes=(2, 3), nan=(1, 2),
                                 loss_scale=2.0 ** 10),
    # shard_optimizer=factory, for an optimizer outside ms_accum's table.
    "rmsprop_factory": dict(optimizer="rmsprop", structure="fused", k=2, micro=4, sizes=(3, 5), factory=True),
}
PROFILED = "momentum_fused_clip"
RESUME = dict(batches=8, micro=4, k=2, save_every=1)  # per rank at 2 ranks: 8 batches of 4, windows of 2


def train_case(case, shares, shard):
    net = make_net()
    scaler = None
    if "loss_scale" in case:
        scaler = ms.amp.DynamicLossScaler(case["loss_scale"], scale_factor=2, scale_window=1000)
    if shard and case.get("factory"):
        shard = lambda params: optimizer_of(case["optimizer"], params)  # noqa: E731
    executor = GradientAccumulation(net, nn.SoftmaxCrossEntropyWithLogits(sparse=True, reduction="mean"),
                                    optimizer_of(case["optimizer"], net.trainable_params()),
                                    structure=case["structure"], clip_norm=case.get("clip_norm"), loss_scaler=scaler,
                                    shard_optimizer=shard)
    x = np.concatenate([s[0] for s in shares])
    y = np.concatenate([s[1] for s in shares])
    dataset = ds.NumpySlicesDataset({"x": x, "y": y}, shuffle=False).batch(len(shares[0][0]))
    result = executor.train_process(1, dataset, case["k"], checkpoints=None, verbose=False)
    return net, result


def cached_case(shard, rank, ranks):
    """Gradient caching (a contrastive loss over the whole window) with AdamW."""
    net, loss, data = build("infonce")
    x, y = data(4 * 4 * ranks)
    dataset = ds.NumpySlicesDataset({"data": x, "label": y}, shuffle=False, num_shards=ranks, shard_id=rank).batch(4)
    optimizer = nn.AdamWeightDecay(net.trainable_params(), 1e-2, weight_decay=0.01)
    GradientAccumulation(net, loss, optimizer, structure="cached", shard_optimizer=shard).train_process(
        1, dataset, 2, checkpoints=None, verbose=False)
    return net


def resume_dataset(rank, ranks):
    """The resume runs' data: 2-rank batches of RESUME["micro"], the same global batches on any number of ranks
    (each rank reads its shard, MindSpore's `num_shards`)."""
    ds.config.set_seed(7)  # saved with the states: every run and resume the same
    global_micro = RESUME["micro"] * 2
    rng = np.random.default_rng(5)
    x = rng.standard_normal((RESUME["batches"] * global_micro, IN)).astype(np.float32)
    y = rng.integers(0, OUT, (len(x),)).astype(np.int32)
    return ds.NumpySlicesDataset({"x": x, "y": y}, shuffle=False, num_shards=ranks,
                                 shard_id=rank).batch(global_micro // ranks)


def resume_run(out_dir, name, rank, ranks, shard, resume=None):
    """An AdamW run over `resume_dataset` saving its training state after every window; from `resume` if given."""
    net = make_net()
    executor = GradientAccumulation(net, nn.SoftmaxCrossEntropyWithLogits(sparse=True, reduction="mean"),
                                    optimizer_of("adamw", net.trainable_params()), shard_optimizer=shard)
    result = executor.train_process(1, resume_dataset(rank, ranks), RESUME["k"], ckpt_dir=os.path.join(out_dir, name),
                                    ckpt_name="run", save_every=RESUME["save_every"], keep_last=None,
                                    resume=resume, verbose=False)
    np.savez(os.path.join(out_dir, f"{name}_rank{rank}.npz"), **params_of(net))
    return {"resumed_from": result.resumed_from, "steps": [record.step for record in result.steps]}


def main():
    out_dir = sys.argv[1]
    os.makedirs(out_dir, exist_ok=True)
    ms.set_context(mode=ms.GRAPH_MODE)
    ms.set_auto_parallel_context = ms.context.set_auto_parallel_context = refuse_parallel_context
    info = init_data_parallel() if distributed_launch() else None  # one process: resuming only
    rank, ranks = (0, 1) if info is None else (info.rank, info.group_size)
    report = {"rank": rank}
    if len(sys.argv) > 2:  # resume a 2-rank sharded state on this number of ranks, sharded and not
        for shard in (True, False):
            name = f"resumed_{ranks}_{'sharded' if shard else 'unsharded'}"
            report[name] = resume_run(out_dir, name, rank, ranks, shard, resume=sys.argv[2])
    else:
        for name, case in CASES.items():
            shares = [rank_share(case, batch, rank, i) for i, batch in enumerate(global_micro_batches(case))]
            for shard in (False, True):
                profiler, where = None, f"{profiler_dir(out_dir, rank)}_{'sharded' if shard else 'unsharded'}"
                if name == PROFILED:
                    profiler = ms.Profiler(output_path=where)
                net, result = train_case(case, shares, shard)
                if profiler is not None:
                    profiler.stop()
                    profiler.analyse()
                    report[f"profiled_{shard}"] = {"windows": len(result.steps), "micro_steps": case["micro"],
                                                   "tensors": len(net.trainable_params()),
                                                   "allreduce_launches": allreduce_launches(where)}
                report[f"{name}_{shard}"] = {"skipped": [r.skipped for r in result.steps],
                                             "loss_scale": [r.loss_scale for r in result.steps]}
                np.savez(os.path.join(out_dir, f"{name}_{'sharded' if shard else 'unsharded'}_rank{rank}.npz"),
                         **params_of(net))
        for shard in (False, True):
            np.savez(os.path.join(out_dir, f"cached_{'sharded' if shard else 'unsharded'}_rank{rank}.npz"),
                     **params_of(cached_case(shard, rank, ranks)))
        for shard in (True, False):
            name = "sharded" if shard else "unsharded"
            report[name] = resume_run(out_dir, name, rank, ranks, shard)
        state = os.path.join(out_dir, "sharded", "run-000000002.ckpt")
        report["sharded_from_sharded"] = resume_run(out_dir, "sharded_from_sharded", rank, ranks, True, state)
        report["unsharded_from_sharded"] = resume_run(out_dir, "unsharded_from_sharded", rank, ranks, False, state)
        state = os.path.join(out_dir, "unsharded", "run-000000002.ckpt")
        report["sharded_from_unsharded"] = resume_run(out_dir, "sharded_from_unsharded", rank, ranks, True, state)
    with open(os.path.join(out_dir, f"report_rank{rank}.json"), "w", encoding="utf-8") as handle:
        json.dump(report, handle)
    print(f"rank {rank} done: {json.dumps(report)}", flush=True)


if __name__ == "__main__":
    main()
