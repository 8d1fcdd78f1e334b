"""Tutorial: a character-level Transformer on Tiny Shakespeare, with token-weighted gradient accumulation.

One speech per sequence (speeches are blank-line separated, 4 to 3,080 characters), padded and masked: micro-batches
hold very different numbers of real characters, so each one is weighted by its count (`TokenCrossEntropy` and
`WindowOptions(reduction="weighted_mean")`) and every update equals one step on the whole window, whose loss is the
mean over all its real characters. The same global batches are then trained without accumulation (K=1 on the
concatenated window) from the same start, and both validation losses are reported in bits per character: they agree
to noise. The accumulated run's checkpoint is evaluated again and writes a sample.

    python tutorials/char_transformer_shakespeare.py [--data input.txt] [--steps 150] [--ckpt-dir ckpt]
"""
import argparse
import hashlib
import itertools
import math
import os

import ms_accum  # first: importing ms_accum caps oneDNN's CPU ISA before MindSpore loads

import numpy as np  # noqa: E402
import mindspore as ms  # noqa: E402
import mindspore.dataset as ds  # noqa: E402
from mindspore import Tensor, nn  # noqa: E402

from ms_accum import (Checkpoints, GradientAccumulation, LogOptions, TokenCrossEntropy,  # noqa: E402
                      WindowOptions, load_into)
from ms_accum.cli import positive_int  # noqa: E402
from ms_accum.demo import CharTransformer  # noqa: E402

# Configuration: small enough to train in a few minutes on 2 CPU cores.
MICRO_BATCH = 8          # speeches per micro-batch
ACCUMULATE_STEPS = 4     # K: an update sees 32 speeches, about 4,900 characters
STEPS = 150              # optimizer steps per run
MAX_LEN = 256            # longer speeches are cut here (about 10 % of them); shorter ones are padded
BUCKETS = (64, 128, 256)  # padded lengths: a micro-batch is padded to the smallest bucket that holds it
WIDTH, HEADS, LAYERS = 64, 4, 2
LEARNING_RATE = 3e-3
SEED = 0
DEVICE = "CPU"  # or "GPU", "Ascend"
IGNORE = -100  # target of padding positions
VAL_BATCH = 32  # held-out speeches per validation batch
PROMPT = "ROMEO:\n"  # the sample's opening
# The fewest speeches that hold a validation batch (a tenth of them) and one training window (the rest).
MIN_SPEECHES = next(n for n in itertools.count(1) if n // 10 >= VAL_BATCH
                    and (n - n // 10) // MICRO_BATCH >= ACCUMULATE_STEPS)
MD5 = "6fb458f1232090904fb40fe944165e91"  # of input.txt, from its README
WHERE = ("Tiny Shakespeare's input.txt is karpathy/char-rnn's data/tinyshakespeare/input.txt "
         "(https://raw.githubusercontent.com/karpathy/char-rnn/master/data/tinyshakespeare/input.txt, MD5 " + MD5 +
         "): pass it with --data or set MS_ACCUM_SHAKESPEARE.")


def read_speeches(path):
    """The corpus's speeches (blank-line separated passages of 2 characters or more); ValueError, one line, when the
    file is missing, not text, or too small for the tutorial."""
    path = path or os.environ.get("MS_ACCUM_SHAKESPEARE") or os.path.join(
        os.path.dirname(os.path.abspath(__file__)), "..", "..", "shared", "data", "tinyshakespeare", "input.txt")
    if not os.path.isfile(path):
        raise ValueError(f"'{path}' does not exist. {WHERE}")
    with open(path, "rb") as f:
        raw = f.read()
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as err:
        raise ValueError(f"'{path}' is not UTF-8 text ({err.reason} at byte {err.start}).") from None
    speeches = [s for s in text.split("\n\n") if len(s) >= 2]
    if len(speeches) < MIN_SPEECHES:
        raise ValueError(f"'{path}' holds {len(speeches)} speeches (blank-line separated passages of 2 characters or "
                         f"more), the tutorial needs at least {MIN_SPEECHES}: a tenth held out for one validation "
                         f"batch of {VAL_BATCH}, the rest for one window of {ACCUMULATE_STEPS} micro-batches of "
                         f"{MICRO_BATCH}.")
    if hashlib.md5(raw).hexdigest() != MD5:
        print(f"note: '{path}' is not the MD5-checked Tiny Shakespeare; training on it anyway.")
    return speeches


def encode(speeches, index):
    """Each speech as character ids, at most MAX_LEN long (inputs and targets are cut from it in `batches`)."""
    return [np.array([index[c] for c in s[:MAX_LEN]], np.int32) for s in speeches]


def batches(encoded, rng, size):
    """Micro-batches of `size` speeches of similar length, each padded to its bucket, in shuffled order."""
    order = sorted(range(len(encoded)), key=lambda i: len(encoded[i]))
    groups = [order[i:i + size] for i in range(0, len(order) - size + 1, size)]
    rng.shuffle(groups)
    out = []
    for group in groups:
        length = next(b for b in BUCKETS if b >= max(len(encoded[i]) for i in group) - 1)
        tokens = np.zeros((size, length), np.int32)
        targets = np.full((size, length), IGNORE, np.int32)
        for row, i in enumerate(group):
            seq = encoded[i]
            tokens[row, :len(seq) - 1] = seq[:-1]
            targets[row, :len(seq) - 1] = seq[1:]
        out.append((tokens, targets))
    return out


def concatenated(micro_batches, k):
    """The same data as windows of one batch each: K micro-batches padded to the longest and stacked."""
    out = []
    for start in range(0, len(micro_batches) - k + 1, k):
        window = micro_batches[start:start + k]
        length = max(t.shape[1] for t, _ in window)
        pad = [(np.pad(t, ((0, 0), (0, length - t.shape[1]))), np.pad(y, ((0, 0), (0, length - y.shape[1])),
                                                                        constant_values=IGNORE)) for t, y in window]
        out.append((np.concatenate([t for t, _ in pad]), np.concatenate([y for _, y in pad])))
    return out


def dataset(micro_batches):
    return ds.GeneratorDataset(micro_batches, column_names=["tokens", "targets"], shuffle=False)


def bits_per_char(network, val_batches):
    """Validation loss over all real characters, in bits."""
    loss_fn = TokenCrossEntropy(IGNORE)
    network.set_train(False)
    total, count = 0.0, 0.0
    for tokens, targets in val_batches:
        loss, n = loss_fn(network(Tensor(tokens)), Tensor(targets))
        total, count = total + float(loss.asnumpy()) * float(n.asnumpy()), count + float(n.asnumpy())
    network.set_train(True)
    return total / count / math.log(2)


def train(vocab, micro_batches, k, steps, ckpt_dir, name):
    """One run of `steps` optimizer steps from the same start, saved in `ckpt_dir` (None: not saved); returns the
    network and its result."""
    from tqdm import tqdm
    ms.set_seed(SEED)
    network = CharTransformer(vocab, WIDTH, HEADS, LAYERS, MAX_LEN)
    optimizer = nn.Adam(network.trainable_params(), LEARNING_RATE)
    executor = GradientAccumulation(network, TokenCrossEntropy(IGNORE), optimizer,
                                    window=WindowOptions(reduction="weighted_mean"))
    with tqdm(total=steps, desc=name, unit="step") as bar:
        def on_step(record):
            bar.update(1)
            bar.set_postfix(bpc=f"{record.loss / math.log(2):.3f}", refresh=False)
        result = executor.train_process(1, dataset(micro_batches), k, partial_window="drop",
                                        checkpoints=None if ckpt_dir is None else Checkpoints(ckpt_dir, name),
                                        log=LogOptions(verbose=False, on_step=on_step))
    return network, result


def sample(network, index, prompt, length, rng):
    """Characters drawn one at a time from the trained model (temperature 0.8), after `prompt`."""
    chars = {i: c for c, i in index.items()}
    tokens = [index[c] for c in prompt]
    network.set_train(False)
    for _ in range(length):
        window = np.zeros((1, MAX_LEN), np.int32)  # one padded shape: the graph compiles once
        context = tokens[-MAX_LEN:]
        window[0, :len(context)] = context
        logits = network(Tensor(window)).asnumpy()[0, len(context) - 1] / 0.8
        p = np.exp(logits - logits.max())
        tokens.append(int(rng.choice(len(p), p=p / p.sum())))
    return "".join(chars.get(t, "") for t in tokens)


def main(speeches, steps, ckpt_dir):
    ms_accum.set_device(DEVICE)
    rng = np.random.default_rng(SEED)
    vocab_chars = sorted(set("".join(speeches)))
    index = {c: i + 1 for i, c in enumerate(vocab_chars)}  # 0 pads the inputs
    encoded = encode(speeches, index)
    order = rng.permutation(len(encoded))
    held_out = len(encoded) // 10
    val = batches([encoded[i] for i in order[:held_out]], rng, VAL_BATCH)
    train_micro = batches([encoded[i] for i in order[held_out:]], rng, MICRO_BATCH)[:steps * ACCUMULATE_STEPS]
    counts = [int((y != IGNORE).sum()) for _, y in train_micro]
    print(f"{len(speeches)} speeches, {len(vocab_chars)} characters; {len(train_micro)} micro-batches of "
          f"{MICRO_BATCH}, real characters per micro-batch {min(counts)} to {max(counts)}")
    os.makedirs(ckpt_dir, exist_ok=True)

    accumulated, acc_result = train(len(index) + 1, train_micro, ACCUMULATE_STEPS, steps, ckpt_dir, "char_transformer")
    plain, plain_result = train(len(index) + 1, concatenated(train_micro, ACCUMULATE_STEPS), 1, steps, None,
                                "no_accumulation")
    acc_bpc, plain_bpc = bits_per_char(accumulated, val), bits_per_char(plain, val)
    print(f"validation: {acc_bpc:.4f} bits per character accumulated (K={ACCUMULATE_STEPS} x {MICRO_BATCH}), "
          f"{plain_bpc:.4f} without accumulation (batches of {ACCUMULATE_STEPS * MICRO_BATCH}); difference "
          f"{acc_bpc - plain_bpc:+.4f}")

    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, ax = plt.subplots(figsize=(6, 3.5))
    for result, label in ((acc_result, f"K={ACCUMULATE_STEPS} x {MICRO_BATCH}"), (plain_result, "no accumulation")):
        ax.plot([loss / math.log(2) for loss in result.losses], label=label, linewidth=1)
    ax.set_xlabel("optimizer step")
    ax.set_ylabel("training bits per character")
    ax.legend()
    fig.tight_layout()
    plot = os.path.join(ckpt_dir, "char_transformer_loss.png")
    fig.savefig(plot, dpi=100)
    print(f"Checkpoint: {acc_result.checkpoint}\nLoss curves: {plot}")

    restored = CharTransformer(len(index) + 1, WIDTH, HEADS, LAYERS, MAX_LEN)
    load_into(restored, acc_result.checkpoint)
    print(f"checkpoint evaluated again: {bits_per_char(restored, val):.4f} bits per character")
    prompt = PROMPT if set(PROMPT) <= set(index) else speeches[0][:len(PROMPT)]  # another text: its own opening
    print("sample:\n" + sample(restored, index, prompt, 200, np.random.default_rng(SEED)))
    return acc_bpc, plain_bpc


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data", help="Tiny Shakespeare's input.txt (default: $MS_ACCUM_SHAKESPEARE, else "
                                       "../shared/data/tinyshakespeare/input.txt beside the checkout)")
    parser.add_argument("--steps", type=positive_int, default=STEPS, help="optimizer steps per run")
    parser.add_argument("--ckpt-dir", default="ckpt")
    args = parser.parse_args()
    try:
        text = read_speeches(args.data)
    except ValueError as err:
        parser.error(f"argument --data: {err}")  # one line, exit status 2
    main(text, args.steps, args.ckpt_dir)
