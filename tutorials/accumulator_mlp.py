"""Tutorial: MindSpore's "Gradient Accumulation" page, with ms_accum's Accumulator.

The page trains its MLP on MNIST for 3 epochs with batch 32, accumulating 2 micro-batches per SGD(1e-2)
step (an effective batch of 64), and reports about 92.0% test accuracy. The same run here, written as on the
page: a `value_and_grad` forward function and an `@ms.jit` train step that hands each micro-batch's gradients
to the Accumulator. Unlike the page, the loss is NOT divided by the accumulate step: the Accumulator's
default `reduction="mean"` averages the window itself, so each update equals one step on the batch of 64.

    python tutorials/accumulator_mlp.py [--epochs 3] [--num-samples N] [--data DIR]
"""
import argparse

import ms_accum  # first: importing ms_accum caps oneDNN's CPU ISA before MindSpore loads

import mindspore as ms  # noqa: E402  (after ms_accum, on purpose)
from mindspore import nn, ops, value_and_grad  # noqa: E402

from ms_accum import Accumulator  # noqa: E402
from ms_accum.demo import DataError, MLP, check_mnist_dir, datapipe, evaluate, resolve_data_dir  # noqa: E402

# Configuration: the page's values.
EPOCHS = 3
BATCH_SIZE = 32
ACCUMULATE_STEP = 2
LEARNING_RATE = 1e-2
SEED = 0
DEVICE = "CPU"  # or "GPU", "Ascend"


def main(epochs: int, data: str, num_samples: int) -> float:
    ms_accum.set_device(DEVICE)
    ms.set_seed(SEED)
    data = resolve_data_dir(data)
    train_dataset = datapipe(data, BATCH_SIZE, usage="train", num_samples=num_samples)
    test_dataset = datapipe(data, BATCH_SIZE, usage="test")

    model = MLP()
    loss_fn = nn.CrossEntropyLoss()
    optimizer = nn.SGD(model.trainable_params(), LEARNING_RATE)
    accumulator = Accumulator(optimizer, ACCUMULATE_STEP)

    def forward_fn(data, label):
        return loss_fn(model(data), label)  # the plain mean: no "/ accumulate_step"

    grad_fn = value_and_grad(forward_fn, None, optimizer.parameters)

    @ms.jit
    def train_step(data, label):
        loss, grads = grad_fn(data, label)
        return ops.depend(loss, accumulator(grads))

    accuracy = 0.0
    for epoch in range(1, epochs + 1):
        print(f"Epoch {epoch}\n-------------------------------")
        model.set_train()
        size = train_dataset.get_dataset_size()
        for batch, (images, labels) in enumerate(train_dataset.create_tuple_iterator()):
            loss = train_step(images, labels)
            if batch % 100 == 0:
                print(f"loss: {loss.asnumpy():>7f} [{batch:>4d}/{size:>4d}]")
        model.set_train(False)
        result = evaluate(model, test_dataset, loss_fn)
        print(f"Test:\n {result}\n")
        accuracy = result.accuracy
    print("Done!")
    return accuracy


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--epochs", type=int, default=EPOCHS)
    parser.add_argument("--data", help="MNIST directory (default: $MS_ACCUM_MNIST, else ./datasets/MNIST_Data)")
    parser.add_argument("--num-samples", type=int, help="train on the first N images only")
    args = parser.parse_args()
    try:  # missing or broken MNIST: one line and exit status 2, as for any bad argument
        args.data = check_mnist_dir(resolve_data_dir(args.data))
    except DataError as err:
        parser.error(str(err))
    main(args.epochs, args.data, args.num_samples)
