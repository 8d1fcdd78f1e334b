"""Graph mode on the documented path, and PyNative without a log line per micro-batch.

MindSpore 2.10 starts in PyNative: `ms_accum.set_device` (what README's snippets, the CLI and the tutorials call)
selects
the device and graph mode. In PyNative, a Python number handed to a MultitypeFuncGraph makes MindSpore log its own
deprecation of `pytype_to_dtype` at every call (docs/mindspore.md, a Python number handed to a MultitypeFuncGraph); an epoch must print none.
"""
import subprocess
import sys
import textwrap

import pytest

SCRIPT = textwrap.dedent("""
    import sys
    import numpy as np
    import ms_accum
    import mindspore as ms
    import mindspore.dataset as ds
    from mindspore import nn
    from ms_accum import GradientAccumulation

    ms_accum.set_device("CPU", graph_mode=sys.argv[1] == "graph")
    print("MODE", "graph" if ms.get_context("mode") == ms.GRAPH_MODE else "pynative", ms.get_context("device_target"))
    net = nn.Dense(4, 2)
    rng = np.random.default_rng(0)
    data = ds.NumpySlicesDataset({"data": rng.standard_normal((64, 4)).astype(np.float32),
                                  "label": rng.integers(0, 2, 64).astype(np.int32)}, shuffle=False).batch(4)
    loss = nn.SoftmaxCrossEntropyWithLogits(sparse=True, reduction="mean")
    result = GradientAccumulation(net, loss, nn.SGD(net.trainable_params(), 0.1)).train_process(
        1, data, 4, ckpt_dir=None, verbose=False)
    print("STEPS", len(result.steps))
""")


@pytest.mark.slow  # make test-all: make test keeps the core (docs/testing.md)
@pytest.mark.parametrize("mode", ["graph", "pynative"])
def test_an_epoch_logs_no_line_per_micro_batch(tmp_path, mode):
    script = tmp_path / "epoch.py"
    script.write_text(SCRIPT)
    out = subprocess.run([sys.executable, str(script), mode], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    assert f"MODE {mode} CPU" in out.stdout
    assert "STEPS 4" in out.stdout  # 16 micro-batches in windows of 4
    assert "pytype_to_dtype" not in out.stdout + out.stderr
