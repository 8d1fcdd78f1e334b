"""Tutorial: fit a model of MindSpore's zoo (mindcv) to a memory budget: verify, plan, train.

A global batch that does not fit as one step is trained as K micro-batches of B. Which B and K fit, and which structure
is fastest there, `ms_accum.plan` finds by measuring the model's peak memory in fresh processes; whether the K
micro-batches give the big batch's update, `ms_accum.verify_equivalence` checks, and says why not. The model here is
mindcv's resnet18 (10 classes) on generated 64x64 images, each class a smooth pattern of its own under noise.

    pip install 'ms_accum[mindcv]'
    python tutorials/mindcv_plan.py [--model resnet18] [--image-size 64] [--global-batch 64] [--memory SIZE]
                                    [--windows 8]

Without --memory the budget lies halfway between what one step of a single image and one step of the global batch peak
at (measured first; a budget counts everything training holds, the model included), so accumulation is needed. The
steps:
1. one step of the global batch and one of a single image, each measured in a fresh process: the memory accumulation
   must save, and the least any plan takes;
2. the zoo's model verified as it is: BatchNorm normalizes each micro-batch by its own statistics, so the verifier
   fails and names the layers; with `replace_batchnorm` (GroupNorm, per sample) it passes: that model is trained;
3. the plan within the budget: every trial, the fitted line, B, K and the structure;
4. training with the plan in this process (`GradientAccumulation.from_plan`), the window losses;
5. what accumulation saved in memory and what it cost in time, from the trials (each in a fresh process).
"""
import argparse
import os

import ms_accum  # first: importing ms_accum caps oneDNN's CPU ISA before MindSpore loads

import numpy as np  # noqa: E402
import mindspore as ms  # noqa: E402
import mindspore.dataset as ds  # noqa: E402
from mindspore import nn  # noqa: E402

from ms_accum import GradientAccumulation, QUIET, plan, replace_batchnorm, verify_equivalence  # noqa: E402
from ms_accum.cli import positive_int  # noqa: E402
from ms_accum.tools import measure, parse_size  # noqa: E402

# Configuration. The factories run in fresh processes too, which read it from these variables (set by main).
MODEL = os.environ.get("MS_ACCUM_TUTORIAL_MODEL", "resnet18")
IMAGE_SIZE = int(os.environ.get("MS_ACCUM_TUTORIAL_IMAGE_SIZE", "64"))
CLASSES = 10
GLOBAL_BATCH = 64
WINDOWS = 8
VERIFY_K, VERIFY_B = 4, 4
LEARNING_RATE, MOMENTUM = 0.01, 0.9
BUDGET_SHARE = 0.5  # of the way from one image's step to the global batch's, when no --memory is given
SEED = 0
DEVICE = "CPU"  # or "GPU", "Ascend"


def sample(n: int):
    """`n` generated images with their labels: class c is pattern c (8x8 blocks of smooth noise) plus noise."""
    patterns = np.random.default_rng(SEED).standard_normal((CLASSES, 3, 8, 8)).astype(np.float32)
    scale = -(-IMAGE_SIZE // 8)
    patterns = np.kron(patterns, np.ones((1, 1, scale, scale), np.float32))[:, :, :IMAGE_SIZE, :IMAGE_SIZE]
    rng = np.random.default_rng(n)
    labels = rng.integers(0, CLASSES, n).astype(np.int32)
    return patterns[labels] + rng.standard_normal((n, 3, IMAGE_SIZE, IMAGE_SIZE)).astype(np.float32), labels


def zoo_model():
    """The factory of the zoo's model as it is: (network, loss, optimizer, sample)."""
    import mindcv
    ms.set_seed(SEED)
    network = mindcv.create_model(MODEL, num_classes=CLASSES)
    return _with_training_parts(network)


def exact_model():
    """The same model with GroupNorm for BatchNorm (`replace_batchnorm`), so accumulation equals the big batch."""
    network = zoo_model()[0]
    replace_batchnorm(network)
    return _with_training_parts(network)


def _with_training_parts(network: nn.Cell):
    return (network, nn.SoftmaxCrossEntropyWithLogits(sparse=True, reduction="mean"),
            nn.Momentum(network.trainable_params(), LEARNING_RATE, MOMENTUM), sample)


def verify(factory) -> bool:
    network, loss_fn, optimizer, _ = factory()
    report = verify_equivalence(network, loss_fn, optimizer, sample(VERIFY_K * VERIFY_B), VERIFY_K)
    print(f"{factory.__name__}: {report}\n")
    return report.passed


def main(global_batch: int, memory, windows: int) -> dict:
    ms_accum.set_device(DEVICE)
    print(f"1. One step of the global batch: {MODEL}, {global_batch} images of 3x{IMAGE_SIZE}x{IMAGE_SIZE}, "
          f"in a fresh process")
    whole, one = measure(exact_model, global_batch, 1), measure(exact_model, 1, 1)
    if whole.peak_mib is None or one.peak_mib is None:
        print(f"   it failed ({whole.error or one.error}): accumulation is the only way to train this global batch.")
        budget = memory  # None: the planner's own default, the device's free memory
    else:
        print(f"   peak {whole.peak_mib:.0f} MiB, {whole.ms_per_window:.0f} ms per step; one image's step "
              f"{one.peak_mib:.0f} MiB")
        share = one.peak_mib + BUDGET_SHARE * (whole.peak_mib - one.peak_mib)
        budget = memory if memory is not None else int(share * 2 ** 20)
    within = "the device's free memory" if budget is None else f"{budget / 2 ** 20:.0f} MiB"
    print(f"   budget: {within}\n\n2. Does accumulating K={VERIFY_K} micro-batches of {VERIFY_B} "
          f"give the update of one batch of {VERIFY_K * VERIFY_B}?")
    verify(zoo_model)
    if not verify(exact_model):
        raise SystemExit("the model with GroupNorm should accumulate exactly; see the report above")

    print(f"3. The plan for a global batch of {global_batch} within {within} (each trial in a fresh process)")
    try:
        chosen = plan(exact_model, global_batch, budget, log=lambda line: print(f"   {line}", flush=True))
    except ValueError as err:  # e.g. a budget below one image's step: the message gives the smallest that works
        raise SystemExit(f"mindcv_plan: error: {err}") from None
    print(f"{chosen}\n\n4. Training {windows} windows with the plan in this process")
    ms.set_context(mode=ms.GRAPH_MODE)
    network, loss_fn, optimizer, _ = exact_model()
    images, labels = sample(global_batch * windows)
    dataset = ds.NumpySlicesDataset({"image": images, "label": labels}, shuffle=False).batch(chosen.batch_size)
    executor = GradientAccumulation.from_plan(chosen, network, loss_fn, optimizer)
    result = executor.train_process(1, dataset, checkpoints=None, log=QUIET)
    print("   window losses: " + " ".join(f"{loss:.3f}" for loss in result.losses))

    used = next(t for t in chosen.trials if (t.batch_size, t.structure) == (chosen.batch_size, chosen.structure))
    summary = {"batch_size": chosen.batch_size, "accumulate_step": chosen.accumulate_step,
               "structure": chosen.structure, "peak_mib": used.peak_mib, "ms_per_window": used.ms_per_window,
               "global_step_peak_mib": whole.peak_mib, "global_step_ms": whole.ms_per_window,
               "one_sample_peak_mib": one.peak_mib,
               "budget_mib": None if budget is None else round(budget / 2 ** 20, 1),
               "losses": result.losses}
    print("\n5. What accumulation saved and what it cost (fresh-process trials)")
    if whole.peak_mib is not None:
        print(f"   memory: {used.peak_mib:.0f} MiB instead of {whole.peak_mib:.0f} MiB, "
              f"{whole.peak_mib - used.peak_mib:.0f} MiB ({1 - used.peak_mib / whole.peak_mib:.0%}) saved")
        print(f"   time per update of {global_batch}: {used.ms_per_window:.0f} ms instead of "
              f"{whole.ms_per_window:.0f} ms ({used.ms_per_window / whole.ms_per_window:.2f}x)")
    else:
        print(f"   memory: {used.peak_mib:.0f} MiB, where one step of the global batch failed; "
              f"{used.ms_per_window:.0f} ms per update of {global_batch}")
    return summary


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default=MODEL, help="a mindcv model name (default resnet18)")
    parser.add_argument("--image-size", type=positive_int, default=IMAGE_SIZE, metavar="S")
    parser.add_argument("--global-batch", type=positive_int, default=GLOBAL_BATCH, metavar="N")
    parser.add_argument("--memory", help="the budget, e.g. 400MiB (default: halfway from one image's step to one global-batch step)")
    parser.add_argument("--windows", type=positive_int, default=WINDOWS, metavar="W",
                        help="windows trained with the plan")
    parser.add_argument("--json", action="store_true", help="also print the summary as one JSON line")
    args = parser.parse_args()
    # For this process and the fresh ones the planner starts: they import this file and read the configuration.
    os.environ["MS_ACCUM_TUTORIAL_MODEL"] = MODEL = args.model
    os.environ["MS_ACCUM_TUTORIAL_IMAGE_SIZE"] = str(args.image_size)
    IMAGE_SIZE = args.image_size
    try:
        budget_bytes = None if args.memory is None else parse_size(args.memory, "--memory")
    except ValueError as err:
        parser.error(str(err))
    out = main(args.global_batch, budget_bytes, args.windows)
    if args.json:
        import json
        print(json.dumps(out))
