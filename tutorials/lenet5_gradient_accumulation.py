"""Tutorial: MindSpore's Cell-graph gradient-accumulation tutorial (LeNet5 on MNIST), with ms_accum.

The tutorial trains LeNet5 for 3 epochs with batch 32, stepping Momentum(0.01, 0.9) every 4 micro-batches,
saves `gradient_accumulation.ckpt` and reports 96.9% test accuracy. Its `train_process` sums the 4 mean
losses, so every step is 4x the large-batch step; ms_accum's `GradientAccumulation` keeps the signature but
applies the mean over the window, exactly one step on the batch of 128 (set LEARNING_RATE to 0.04 to
reproduce the tutorial's larger steps). The checkpoint goes into `ckpt/` and is then evaluated.

    python tutorials/lenet5_gradient_accumulation.py [--epochs 3] [--num-samples N] [--data DIR] [--ckpt-dir DIR]
"""
import argparse

import ms_accum  # first: importing ms_accum caps oneDNN's CPU ISA before MindSpore loads

import mindspore as ms  # noqa: E402  (after ms_accum, on purpose)
from mindspore import nn  # noqa: E402

from ms_accum import Checkpoints, GradientAccumulation, LogOptions  # noqa: E402
from ms_accum.demo import (DataError, LeNet5, check_mnist_dir, create_dataset,  # noqa: E402
                           evaluate_checkpoint, recorded_data_dir, resolve_data_dir)

# Configuration: the tutorial's values.
EPOCHS = 3
BATCH_SIZE = 32
MINI_STEPS = 4
LEARNING_RATE = 0.01
MOMENTUM = 0.9
SEED = 0
CKPT_DIR = "ckpt"
CKPT_NAME = "gradient_accumulation"
DEVICE = "CPU"  # or "GPU", "Ascend"


def main(epochs: int, data: str, num_samples: int, ckpt_dir: str) -> float:
    ms_accum.set_device(DEVICE)
    ms.set_seed(SEED)
    data = resolve_data_dir(data)
    ds_train = create_dataset(data, BATCH_SIZE, usage="train", seed=SEED, num_samples=num_samples)

    net = LeNet5(10)
    net_loss = nn.SoftmaxCrossEntropyWithLogits(sparse=True, reduction="mean")
    net_opt = nn.Momentum(net.trainable_params(), LEARNING_RATE, MOMENTUM)
    model = GradientAccumulation(net, net_loss, net_opt)

    print("============== Starting Training ==============")
    checkpoints = Checkpoints(directory=ckpt_dir, name=CKPT_NAME,
                              metadata={"model": "lenet5", "accumulate_step": MINI_STEPS, "batch_size": BATCH_SIZE,
                                        "data_dir": recorded_data_dir(data, ckpt_dir)})
    result = model.train_process(epochs, ds_train, mini_steps=MINI_STEPS, checkpoints=checkpoints,
                                 log=LogOptions(every=50))
    print(f"Saved {result.checkpoint} after {len(result.steps)} optimizer steps")

    print("============== Starting Testing ==============")
    evaluation, _ = evaluate_checkpoint(result.checkpoint)
    print(evaluation)
    return evaluation.accuracy


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--epochs", type=int, default=EPOCHS)
    parser.add_argument("--data", help="MNIST directory (default: $MS_ACCUM_MNIST, else ./datasets/MNIST_Data)")
    parser.add_argument("--num-samples", type=int, help="train on the first N images only")
    parser.add_argument("--ckpt-dir", default=CKPT_DIR)
    args = parser.parse_args()
    try:  # missing or broken MNIST: one line and exit status 2, as for any bad argument
        args.data = check_mnist_dir(resolve_data_dir(args.data))
    except DataError as err:
        parser.error(str(err))
    main(args.epochs, args.data, args.num_samples, args.ckpt_dir)
