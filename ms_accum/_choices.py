"""Every choice a user names by a string, and the defaults shared by several entry points, written once.

This module imports nothing, so the command line can offer the choices without loading MindSpore.
"""
DEVICES = ("CPU", "GPU", "Ascend")
# How a window becomes one update (`ms_accum.core.buffer.Reduction`): "mean" weighs each micro-batch by its samples,
# "sum" adds the micro-batches' losses, "weighted_mean" by the weight the loss returns with itself (its real tokens).
REDUCTIONS = ("mean", "sum", "weighted_mean")
# What a non-finite micro-batch costs (`ms_accum.core.guard`): its whole window, or itself alone.
POLICIES = ("skip_window", "skip_microbatch")
# How the executor runs micro-batches (docs/structures.md). "auto" runs AUTO_STRUCTURE: the structure with the least
# peak memory at every K measured (benchmarks/README.md).
TIMED_STRUCTURES = ("three_graphs", "fused", "window")
# "cached": gradient caching for losses that couple the batch (ms_accum.graphs.cached); chosen by name, never "auto".
STRUCTURES = ("auto",) + TIMED_STRUCTURES + ("cached",)
AUTO_STRUCTURE = "three_graphs"
# An epoch's last window, when K does not divide its batches: applied as the mean over what it holds, or dropped.
PARTIAL_WINDOWS = ("apply", "drop")
# The checkpoint files' formats, told apart by their extension: MindSpore's own, and safetensors (MindFormers 2,
# Hugging Face tools).
CHECKPOINT_FORMATS = ("ckpt", "safetensors")
# How `AdaptiveK` moves the learning rate with the batch (`ms_accum.train.adaptive`).
LR_RULES = ("none", "linear", "sqrt", "adascale")
# Micro-batches taken into the running statistics before `skip_outliers` judges any.
OUTLIER_WARMUP = 100
# The demo networks a command names by a short name, each a factory (``package.module:function``, see
# `ms_accum.tools.factory`) like a user's own: the tools take them without importing the demo.
DEMO_FACTORIES = {"lenet5": "ms_accum.demo.models:lenet5", "mlp": "ms_accum.demo.models:mlp"}
