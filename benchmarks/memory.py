"""Section f: bytes of Parameters each accumulator adds, as a multiple of the trainable parameters' bytes.

"Adds" = Parameters reachable from the object (attributes, Cells, ParameterTuples, lists) that are neither
the network's nor the optimizer's. Counting, not timing: exact and independent of load.
"""
from __future__ import annotations

from .common import K, lenet


def _reachable(obj, seen=None):
    """Every Parameter reachable from `obj`, each once."""
    from mindspore import Parameter, nn
    seen = set() if seen is None else seen
    if id(obj) in seen:
        return
    seen.add(id(obj))
    if isinstance(obj, Parameter):
        yield obj
    elif isinstance(obj, nn.Cell):
        yield from obj.get_parameters()
        for value in vars(obj).values():       # ParameterTuples and plain objects held by the Cell
            if not isinstance(value, (nn.Cell, dict)):
                yield from _reachable(value, seen)
    elif isinstance(obj, (list, tuple)):
        for item in obj:
            yield from _reachable(item, seen)
    elif isinstance(obj, dict):
        for item in obj.values():
            yield from _reachable(item, seen)
    elif hasattr(obj, "__dict__") and type(obj).__module__.split(".")[0] in ("ms_accum", "benchmarks"):
        yield from _reachable(vars(obj), seen)


def added_bytes(obj, net, opt) -> int:
    owned = {id(p) for p in net.get_parameters()} | {id(p) for p in opt.get_parameters()}
    unique = {id(p): p for p in _reachable(obj) if id(p) not in owned}
    return sum(p.nbytes for p in unique.values())


def accumulator_memory():
    """Rows (name, added bytes, multiple of trainable bytes) and the trainable bytes."""
    from mindspore import nn
    from ms_accum import Accumulator, TrainAccumulationCell, TrainWindowCell
    from . import doc_impls

    def measure(make):
        net, loss, opt = lenet()
        return added_bytes(make(net, loss, opt), net, opt)

    trainable = sum(p.nbytes for p in lenet()[0].trainable_params())
    rows = [
        ("docs page: @jit_class Accumulator (inner_grads + zeros)",
         measure(lambda net, loss, opt: doc_impls.DocAccumulator(opt, K))),
        ("docs tutorial: GradientAccumulation (grad_sum + zeros)",
         measure(lambda net, loss, opt: doc_impls.DocGradientAccumulation(net, loss, opt))),
        ("ms_accum Accumulator", measure(lambda net, loss, opt: Accumulator(opt, K))),
        ("ms_accum TrainAccumulationCell",
         measure(lambda net, loss, opt: TrainAccumulationCell(nn.WithLossCell(net, loss), opt, K))),
        ("ms_accum GradientAccumulation (fused + three graphs, one buffer)",
         measure(lambda net, loss, opt: _executor_with_fused_cell(net, loss, opt))),
        ("ms_accum TrainWindowCell (the same buffer)",
         measure(lambda net, loss, opt: TrainWindowCell(nn.WithLossCell(net, loss), opt, K))),
        ("for scale: the Momentum optimizer's own state", _momentum_state_bytes()),
    ]
    return [(name, size, size / trainable) for name, size in rows], trainable


def _executor_with_fused_cell(net, loss, opt):
    # The fused Cell beside the three graphs on one buffer: "auto" alone would build no further Cell.
    from ms_accum import GradientAccumulation
    executor = GradientAccumulation(net, loss, opt, structure="fused")
    executor.runner(K)
    return executor


def _momentum_state_bytes() -> int:
    net, _, opt = lenet()
    trainable = {id(p) for p in net.trainable_params()}
    return sum(p.nbytes for p in opt.get_parameters() if id(p) not in trainable and p.name.startswith("moments"))


def render(rows, trainable: int) -> str:
    lines = [f"== f. memory the accumulator adds (LeNet5: {trainable} trainable bytes; Parameters it owns beyond "
             f"the network's and the optimizer's)",
             f"   {'accumulator':<66}{'bytes':>10}{'x params':>10}"]
    lines += [f"   {name:<66}{size:>10}{multiple:>10.3f}" for name, size, multiple in rows]
    lines.append("   note: the documented 2.0x is the zeros copy.")
    return "\n".join(lines)


# (row name, peak_memory.py contender)
PEAK_ROWS = [("nn.TrainOneStepCell, 4 steps (no accumulation)", "one_step"),
             ("ms_accum three graphs (the executor's default), 4 + 2 calls", "three_graphs"),
             ("ms_accum three graphs, statistics=True", "three_graphs_statistics"),
             ("ms_accum three graphs, clip_norm=1.0", "three_graphs_clip"),
             ("ms_accum three graphs, policy='skip_microbatch'", "three_graphs_skip_microbatch"),
             ("ms_accum three graphs, skip_outliers=6", "three_graphs_outliers"),
             ("ms_accum TrainAccumulationCell, 4 calls", "fused"),
             ("ms_accum TrainWindowCell, 1 call", "window"),
             ("ms_accum Accumulator in an @ms.jit step, 4 calls", "accumulator"),
             ("ms_accum Accumulator, each micro-batch weighted by num_samples", "accumulator_weighted")]


def peak_rss():
    """Rows (name, peak RSS growth in bytes, multiple of the trainable bytes), one fresh process per row."""
    from .common import peak_in_fresh_process
    rows = []
    for name, contender in PEAK_ROWS:
        run = peak_in_fresh_process("peak_memory", contender)
        peak, params = run["peak"], run["params"]
        rows.append((name, peak, peak / params))
    return rows, params


def render_peak(rows, params: int) -> str:
    lines = [f"== f2. peak resident memory while training (MLP 3 x 4096^2, {params / 2**20:.0f} MiB of parameters, "
             f"b8, K=4, SGD; growth of VmHWM from before the Cell is built, one process per row)",
             f"   {'structure':<66}{'MiB':>10}{'x params':>10}"]
    lines += [f"   {name:<66}{size / 2**20:>10.1f}{multiple:>10.2f}" for name, size, multiple in rows]
    base = rows[0][2]
    lines.append("   overhead over plain training, x params (goal <= 1.10; the buffer alone is 1.00): " +
                 ", ".join(f"{contender} {multiple - base:.2f}" for (_, _, multiple), (_, contender)
                           in zip(rows[1:], PEAK_ROWS[1:])))
    lines.append("   note: includes the gradients and the graphs' temporaries, not the parameters' own memory "
                 "(allocated before).")
    return "\n".join(lines)
