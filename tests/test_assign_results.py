"""No graph uses the return value of Assign, AssignAdd or AssignSub: MindSpore deprecates it (docs/mindspore.md,
Assign's return value). An assignment is made for its effect and the Parameter read afterwards, or its result handed
to `ops.depend` as the second argument.

Two checks: one over the package's source, on every MindSpore; and, on the releases whose compiler warns about such a
use (2.8; 2.9 and 2.10 have no such check), a fresh process that compiles every kind of graph ms_accum builds and finds
no warning that points into ms_accum, beside a control that does use a return value and is warned about.
"""
import ast
import os
import subprocess
import sys
from pathlib import Path

import mindspore as ms
import pytest

from ms_accum._mindspore import release

PACKAGE = Path(__file__).resolve().parents[1] / "ms_accum"
ASSIGNS = {"assign", "assign_add", "assign_sub"}  # ops.assign..., F.assign...
PRIMITIVES = {"Assign", "AssignAdd", "AssignSub"}  # P.Assign()(...), ops.AssignAdd()(...)
WARNING = "the return value of Assign/AssignAdd/AssignSub"


def _is_assign(call: ast.Call) -> bool:
    func = call.func
    if isinstance(func, ast.Attribute) and func.attr in ASSIGNS:
        return True
    return (isinstance(func, ast.Call) and isinstance(func.func, (ast.Attribute, ast.Name))
            and getattr(func.func, "attr", getattr(func.func, "id", None)) in PRIMITIVES)


def _is_depend(node: ast.AST) -> bool:
    func = node.func if isinstance(node, ast.Call) else None
    return getattr(func, "attr", getattr(func, "id", None)) == "depend"


def used_assign_results(source: str, filename: str) -> list:
    """`file:line` of each assignment call in `source` whose result is used: anything but a bare statement or the
    second argument of `depend`."""
    tree = ast.parse(source, filename)
    parents = {child: node for node in ast.walk(tree) for child in ast.iter_child_nodes(node)}
    found = []
    for node in ast.walk(tree):
        if not (isinstance(node, ast.Call) and _is_assign(node)):
            continue
        parent = parents[node]
        if isinstance(parent, ast.Expr):
            continue
        if _is_depend(parent) and len(parent.args) == 2 and parent.args[1] is node:
            continue
        found.append(f"{filename}:{node.lineno}")
    return found


def test_the_source_check_finds_a_used_result():
    source = ("def f(p, x):\n"
              "    ops.assign(p, x)\n"                           # an effect: fine
              "    y = ops.depend(x, ops.assign_add(p, x))\n"    # ordering only: fine
              "    a = ops.assign(p, x)\n"                       # used
              "    b = P.AssignSub()(p, x) * 2\n"                # used
              "    return ops.depend(ops.assign_add(p, x), y)\n")  # used: Depend's first argument is its value
    assert used_assign_results(source, "f.py") == ["f.py:4", "f.py:5", "f.py:6"]


def test_no_source_uses_an_assign_result():
    found = [hit for path in sorted(PACKAGE.rglob("*.py"))
             for hit in used_assign_results(path.read_text(encoding="utf-8"), str(path.relative_to(PACKAGE.parent)))]
    assert not found, f"Assign results used (docs/mindspore.md, Assign's return value): {found}"


SCRIPT = '''
import numpy as np
import mindspore as ms
import mindspore.dataset as ds
from mindspore import Parameter, Tensor, amp, nn, ops

from ms_accum import (Accumulator, GradientAccumulation, GuardOptions, StatisticsOptions, TrainClear,
                      TrainForwardBackward, TrainOptim, WindowOptions)
from ms_accum.core import AccumulationBuffer
from ms_accum.graphs import TrainAccumulationCell, TrainWindowCell

ms.set_context(mode=ms.GRAPH_MODE)
rng = np.random.default_rng(0)
x = rng.standard_normal((8, 5)).astype(np.float32)
x[6, 0] = np.inf  # the second window is not finite: the clearing graphs run too
y = rng.standard_normal((8, 3)).astype(np.float32)


def dense():
    net = nn.Dense(5, 3)
    return net, nn.Momentum(net.trainable_params(), 0.1, 0.9)


# Each option's graphs once, with the default structure; the other structures' own graphs once.
skip_microbatch = {"guard": GuardOptions(policy="skip_microbatch")}
for structure, options in (("three_graphs", {}), ("three_graphs", {"window": WindowOptions(clip_norm=1.0)}),
                           ("three_graphs", skip_microbatch),
                           ("three_graphs", {"statistics": StatisticsOptions(skip_outliers=3.0, outlier_warmup=8)}),
                           ("three_graphs", {"guard": GuardOptions(loss_scaler=amp.DynamicLossScaler(1024.0, 2, 2))}),
                           ("fused", {}), ("window", skip_microbatch)):
    net, opt = dense()
    GradientAccumulation(net, nn.MSELoss(), opt, structure=structure, **options).train_process(
        1, ds.NumpySlicesDataset({"x": x, "y": y}, shuffle=False).batch(2), 2, ckpt_dir=None, verbose=False)
    print("trained", flush=True)

net, opt = dense()
with_loss = nn.WithLossCell(net, nn.MSELoss())
for cell in (TrainAccumulationCell(with_loss, opt, 2, clip_norm=1.0), TrainWindowCell(with_loss, opt, 2)):
    for i in range(0, 8, 4):
        if isinstance(cell, TrainWindowCell):
            cell(Tensor(x[i:i + 4].reshape(2, 2, 5)), Tensor(y[i:i + 4].reshape(2, 2, 3)))
        else:
            cell(Tensor(x[i:i + 2]), Tensor(y[i:i + 2]))
            cell(Tensor(x[i + 2:i + 4]), Tensor(y[i + 2:i + 4]))
    print("trained", flush=True)

for clear in (False, True):
    buffer = AccumulationBuffer(opt.parameters, prefix=f"optim{clear}")
    forward_backward = TrainForwardBackward(with_loss, opt, buffer)
    optim, clearing = TrainOptim(opt, buffer, clear=clear), TrainClear(buffer)
    for i in range(0, 8, 2):
        forward_backward(Tensor(x[i:i + 2]), Tensor(y[i:i + 2]))
        if i % 4 == 2:
            optim()
            if not clear:
                clearing()
    print("trained", flush=True)

accumulator = Accumulator(opt, 2)
grad_fn = ms.value_and_grad(with_loss, None, opt.parameters)


@ms.jit
def step(inputs, labels):
    loss, grads = grad_fn(inputs, labels)
    return ops.depend(loss, accumulator(grads, 2))


for i in range(0, 8, 2):
    step(Tensor(x[i:i + 2]), Tensor(y[i:i + 2]))
print("trained", flush=True)


class Control(nn.Cell):
    """Uses an AssignAdd's result, as ms_accum must not: the compiler's warning must show here."""

    def __init__(self):
        super().__init__()
        self.count = Parameter(Tensor(0, ms.int32), name="control")

    def construct(self):
        return ops.assign_add(self.count, ops.ones((), ms.int32))


Control()()
print("trained", flush=True)
'''


@pytest.mark.skipif(release(ms.__version__) >= (2, 9),
                    reason="MindSpore 2.9 and later do not check Assign's return value (no such warning in 2.9.0 and "
                           "2.10.0); the source check stands for it")
def test_no_graph_is_warned_about_an_assign_result(tmp_path):
    # Graph mode compiles from source files, so the script is one; MindSpore logs the warning to stderr.
    script = tmp_path / "graphs.py"
    script.write_text(SCRIPT, encoding="utf-8")
    env = {**os.environ, "GLOG_v": "2"}  # MindSpore's warnings on
    run = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, env=env, timeout=600,
                         cwd=tmp_path)
    assert run.returncode == 0, run.stderr[-3000:]
    assert run.stdout.count("trained") == 13
    # The control's warning alone. Each names a place, "Please check your code:In file <path>:<line>, ..." (the
    # control's is MindSpore's own `ops.assign_add`, which returns the primitive's result): none is ms_accum's.
    places = [line.split("In file ", 1)[1] for line in run.stderr.splitlines() if "check your code:In file" in line]
    assert run.stderr.count(WARNING) == 1, run.stderr[-3000:]
    assert not [place for place in places if place.startswith(str(PACKAGE))], places
