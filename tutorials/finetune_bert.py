"""Tutorial: fine-tuning a BERT-style classifier with gradient accumulation (docs/fine-tuning.md).

The recipe people accumulate for: a BERT-shaped encoder written out (token, position and token-type embeddings,
post-norm layers of Dense q/k/v attention with the padding mask, GELU feed-forward, LayerNorm, dropout 0.1) with three
inputs, `input_ids`, `attention_mask` and `token_type_ids`, and a classifier on [CLS]; AdamW with no weight decay on
biases and LayerNorm, a linear warm-up then linear decay over the optimizer steps, clipping at 1.0, K micro-batches of
B per update, the training state saved every N steps and resumable, a validation score every N steps and the best
network kept. The task comes from Tiny Shakespeare's turns of speech: given two consecutive lines, does line B go on
with line A's speech, or does a new speaker reply (a sentence-pair task, as BERT's next-sentence prediction; segments
A and B told apart by the token types)?

    python tutorials/finetune_bert.py                           # train, validate, save, reload the best network
    python tutorials/finetune_bert.py --resume                  # continue a killed run from its newest state
    python tutorials/finetune_bert.py --measure                 # peak memory: K x B against one step of K*B
    msrun --worker_num=2 --local_worker_num=2 --master_port=8118 --join=True tutorials/finetune_bert.py

`--help` lists the sizes. No download: the encoder starts from random weights, or from a checkpoint of your own with
`--init` (what fits the network by name and shape is loaded; a new classifier head starts fresh).
"""
import argparse
import json
import math
import os
import resource
import subprocess
import sys

import ms_accum  # first: importing ms_accum caps oneDNN's CPU ISA before MindSpore loads

import numpy as np  # noqa: E402
import mindspore as ms  # noqa: E402
import mindspore.dataset as ds  # noqa: E402
from mindspore import Tensor, nn, ops  # noqa: E402
from mindspore.common.initializer import TruncatedNormal  # noqa: E402
from mindspore.nn.learning_rate_schedule import LearningRateSchedule  # noqa: E402

from ms_accum import (CheckpointError, Checkpoints, GradientAccumulation, LogOptions,  # noqa: E402
                      Validation, WindowOptions, init_data_parallel, load_into)
from ms_accum.cli import positive_float, positive_int  # noqa: E402
from ms_accum.core import WithLossColumns, dropout_streams  # noqa: E402
from ms_accum.train import distributed_launch  # noqa: E402

# Configuration. Each value is a flag too (--help); the defaults train in a few minutes on 2 CPU cores.
MICRO_BATCH = 16       # B: pairs per forward/backward on each rank, what fits in memory at once
ACCUMULATE_STEP = 4   # K: micro-batches per optimizer step; the update sees K x B = 64 pairs, BERT fine-tuning's size
EPOCHS = 1             # passes over the training pairs
TRAIN_PAIRS = 12800    # pairs trained on (of 12,996 in Tiny Shakespeare): 200 updates of 64
EVAL_PAIRS = 512       # held-out pairs scored at every validation (of 1,444), from plays the training never sees
SEQ_LEN = 128          # [CLS] A [SEP] B [SEP]; Shakespeare's lines are at most 63 characters, cut at MAX_LINE
WIDTH = 128            # BERT-base is 768: the memory figures scale with it (--measure at your sizes)
HEADS = 4              # attention heads; must divide WIDTH (BERT-base: 12 of 64)
LAYERS = 2             # encoder layers (BERT-base: 12)
FFN_RATIO = 4          # the feed-forward block is this many times WIDTH wide, as in BERT
DROPOUT = 0.1          # BERT's, on the embeddings, the attention weights, each block's output and the pooled [CLS]
LEARNING_RATE = 1e-3   # the peak rate; from random weights. A pretrained BERT fine-tunes at 2e-5 to 5e-5
WEIGHT_DECAY = 0.01    # AdamW's decoupled decay, on weights only: biases and LayerNorm's gamma/beta are not shrunk
WARMUP = 0.1           # the first tenth of the optimizer steps ramps the rate up, the rest decays it linearly to 0
CLIP_NORM = 1.0        # each window's gradient (the mean over K x B pairs) clipped to this global norm
EVAL_EVERY = 50        # optimizer steps between validation scores (and after the last step)
SAVE_EVERY = 50        # optimizer steps between saved training states, to resume from
KEEP_LAST = 2          # training states kept: each holds parameters, AdamW's two moments and the buffer, ~4x the model
SEED = 0               # the same weights, pairs and order on every run and every rank
DEVICE = "CPU"         # or "GPU", "Ascend"
MAX_LINE = (SEQ_LEN - 3) // 2  # characters kept of each line: two lines and three special tokens fill SEQ_LEN
PAD, CLS, SEP, UNK = 0, 1, 2, 3  # special token ids; the characters follow
WHERE = ("Tiny Shakespeare's input.txt is karpathy/char-rnn's data/tinyshakespeare/input.txt "
            "(https://raw.githubusercontent.com/karpathy/char-rnn/master/data/tinyshakespeare/input.txt): pass it "
            "with --data or set MS_ACCUM_SHAKESPEARE.")


# ----------------------------------------------------------------------------------------------------------- the data
def read_speeches(path):
    """The file read and its speeches (blank-line separated passages) as lists of lines, the speaker's name left out;
    ValueError, one line, if the file is missing or not text."""
    path = path or os.environ.get("MS_ACCUM_SHAKESPEARE") or os.path.join(
        os.path.dirname(os.path.abspath(__file__)), "..", "..", "shared", "data", "tinyshakespeare", "input.txt")
    if not os.path.isfile(path):
        raise ValueError(f"'{path}' does not exist. {WHERE}")
    try:
        with open(path, encoding="utf-8") as f:
            text = f.read()
    except UnicodeDecodeError as err:
        raise ValueError(f"'{path}' is not UTF-8 text ({err.reason} at byte {err.start}).") from None
    speeches = []
    for passage in text.split("\n\n"):
        lines = [line for line in passage.strip().split("\n") if line.strip()]
        if len(lines) >= 2 and lines[0].endswith(":"):  # "ROMEO:" then what he says
            lines = lines[1:]
        if lines:
            speeches.append(lines)
    return path, speeches


def sentence_pairs(speeches, rng):
    """(line A, line B, label) for consecutive lines: label 1 when B opens the next speech (a new speaker replies to
    A), 0 when B goes on with A's speech. The continuations, about 3x as many, are subsampled to as many as the
    replies, and the pairs shuffled."""
    replies = [(a[-1], b[0], 1) for a, b in zip(speeches, speeches[1:])]
    goes_on = [(a, b, 0) for speech in speeches for a, b in zip(speech, speech[1:])]
    goes_on = [goes_on[i] for i in rng.permutation(len(goes_on))[:len(replies)]]
    pairs = replies + goes_on
    return [pairs[i] for i in rng.permutation(len(pairs))]


def encode(pairs, index):
    """The four columns of the pairs: `input_ids`, `attention_mask` (1 on real tokens), `token_type_ids` (0 for
    [CLS] A [SEP], 1 for B [SEP]) and `label`, each padded to SEQ_LEN so that the graphs compile once."""
    n = len(pairs)
    input_ids = np.full((n, SEQ_LEN), PAD, np.int32)
    token_type_ids = np.zeros((n, SEQ_LEN), np.int32)
    for row, (a, b, _) in enumerate(pairs):
        a, b = [index.get(c, UNK) for c in a[:MAX_LINE]], [index.get(c, UNK) for c in b[:MAX_LINE]]
        tokens = [CLS, *a, SEP, *b, SEP]
        input_ids[row, :len(tokens)] = tokens
        token_type_ids[row, len(a) + 2:len(tokens)] = 1
    attention_mask = (input_ids != PAD).astype(np.int32)
    label = np.array([p[2] for p in pairs], np.int32)
    return input_ids, attention_mask, token_type_ids, label


def dataset(columns, batch, shuffle, rank=0, ranks=1):
    """A MindSpore dataset of batches of the four columns; in data parallel, this rank's shard of it."""
    names = ["input_ids", "attention_mask", "token_type_ids", "label"]
    return ds.NumpySlicesDataset(dict(zip(names, columns)), shuffle=shuffle, num_shards=ranks,
                                 shard_id=rank).batch(batch)


# ---------------------------------------------------------------------------------------------------------- the model
class Embeddings(nn.Cell):
    """Token + position + token-type embeddings, LayerNorm, dropout (BERT's)."""

    def __init__(self, vocab, width, seq_len, dropout):
        super().__init__()
        self.word = nn.Embedding(vocab, width, embedding_table=TruncatedNormal(0.02))
        self.position = nn.Embedding(seq_len, width, embedding_table=TruncatedNormal(0.02))
        self.token_type = nn.Embedding(2, width, embedding_table=TruncatedNormal(0.02))
        self.norm = nn.LayerNorm((width,), epsilon=1e-12)
        self.dropout = nn.Dropout(p=dropout)

    def construct(self, input_ids, token_type_ids):
        positions = ops.arange(input_ids.shape[1]).astype(ms.int32)
        x = self.word(input_ids) + self.position(positions) + self.token_type(token_type_ids)
        return self.dropout(self.norm(x))


class EncoderLayer(nn.Cell):
    """One post-norm BERT layer written out: multi-head self-attention (Dense q/k/v, matmul, softmax, the padding
    mask), then a GELU feed-forward block, each with dropout, a residual sum and LayerNorm. Written out because
    MindSpore's own nn.TransformerEncoderLayer holds many times the memory on CPU (docs/memory.md)."""

    def __init__(self, width, heads, ffn, dropout):
        super().__init__()
        self.heads, self.head_width = heads, width // heads
        self.scale = 1.0 / math.sqrt(self.head_width)
        self.query, self.key, self.value = nn.Dense(width, width), nn.Dense(width, width), nn.Dense(width, width)
        self.output = nn.Dense(width, width)
        self.attention_dropout, self.output_dropout = nn.Dropout(p=dropout), nn.Dropout(p=dropout)
        self.attention_norm = nn.LayerNorm((width,), epsilon=1e-12)
        self.ffn_in, self.ffn_out = nn.Dense(width, ffn), nn.Dense(ffn, width)
        self.gelu = nn.GELU(approximate=False)
        self.ffn_dropout = nn.Dropout(p=dropout)
        self.ffn_norm = nn.LayerNorm((width,), epsilon=1e-12)

    def split_heads(self, x, batch, length):
        return ops.transpose(ops.reshape(x, (batch, length, self.heads, self.head_width)), (0, 2, 1, 3))

    def construct(self, x, mask):
        batch, length, width = x.shape
        q = self.split_heads(self.query(x), batch, length)
        k = self.split_heads(self.key(x), batch, length)
        v = self.split_heads(self.value(x), batch, length)
        scores = ops.matmul(q, ops.transpose(k, (0, 1, 3, 2))) * self.scale + mask  # mask: -10000 on padding keys
        weights = self.attention_dropout(ops.softmax(scores, -1))
        context = ops.reshape(ops.transpose(ops.matmul(weights, v), (0, 2, 1, 3)), (batch, length, width))
        x = self.attention_norm(x + self.output_dropout(self.output(context)))
        return self.ffn_norm(x + self.ffn_dropout(self.ffn_out(self.gelu(self.ffn_in(x)))))


class BertClassifier(nn.Cell):
    """The encoder and a classifier on the pooled [CLS] token: (input_ids, attention_mask, token_type_ids) ->
    logits (N, classes)."""

    def __init__(self, vocab, width, heads, layers, ffn, seq_len, dropout, classes=2):
        super().__init__()
        self.embeddings = Embeddings(vocab, width, seq_len, dropout)
        self.layers = nn.CellList([EncoderLayer(width, heads, ffn, dropout) for _ in range(layers)])
        self.pooler = nn.Dense(width, width, activation="tanh")
        self.dropout = nn.Dropout(p=dropout)
        self.classifier = nn.Dense(width, classes)

    def construct(self, input_ids, attention_mask, token_type_ids):
        # (N, L) of 1/0 -> (N, 1, 1, L) added to every head's scores: padding gets no attention.
        mask = (1.0 - attention_mask.astype(ms.float32)).reshape(attention_mask.shape[0], 1, 1, -1) * -10000.0
        x = self.embeddings(input_ids, token_type_ids)
        for layer in self.layers:
            x = layer(x, mask)
        return self.classifier(self.dropout(self.pooler(x[:, 0])))


# ------------------------------------------------------------------------------------------- optimizer and schedule
class WarmUpLinearDecay(LearningRateSchedule):
    """`peak` x (step + 1) / warmup for the first `warmup` optimizer steps, then linearly down to 0 at `total`.

    MindSpore's optimizers call it with their own `global_step`, which advances once per update. Under ms_accum an
    update is a window of K micro-batches, so this schedule runs on windows: with a fixed K, each holds K x B x ranks
    samples, and a step count is a sample count. (Only when K changes during training, a batch ramp-up, do steps and
    samples part: then drive the schedule by samples with `ms_accum.SamplesLR`, docs/schedules.md.)"""

    def __init__(self, peak, warmup, total):
        super().__init__()
        self.peak, self.warmup, self.total = peak, float(warmup), float(total)
        self.decay_steps = float(max(total - warmup, 1))

    def construct(self, global_step):
        step = global_step.astype(ms.float32)
        warm = (step + 1.0) / self.warmup
        decay = (self.total - step) / self.decay_steps
        return self.peak * ops.maximum(ops.minimum(warm, decay), 0.0)


def adamw(network, schedule, weight_decay):
    """AdamW with two parameter groups: weights decay, biases and LayerNorm's gamma and beta do not (BERT's rule:
    decay would pull a LayerNorm's scale towards 0 and gains nothing on biases)."""
    params = network.trainable_params()
    no_decay = [p for p in params if p.name.endswith((".bias", ".gamma", ".beta"))]
    decay = [p for p in params if not p.name.endswith((".bias", ".gamma", ".beta"))]
    return nn.AdamWeightDecay([{"params": decay, "weight_decay": weight_decay},
                               {"params": no_decay, "weight_decay": 0.0},
                               {"order_params": params}],
                              learning_rate=schedule, beta1=0.9, beta2=0.999, eps=1e-6)


def accuracy(network, columns, batch):
    """The fraction of pairs classified right, dropout off."""
    network.set_train(False)
    correct = 0
    for start in range(0, len(columns[3]), batch):
        inputs = [Tensor(c[start:start + batch]) for c in columns[:3]]
        correct += int((network(*inputs).asnumpy().argmax(-1) == columns[3][start:start + batch]).sum())
    network.set_train(True)
    return correct / len(columns[3])


# ---------------------------------------------------------------------------------------------------------- the run
def split(speeches):
    """Training pairs from the first 90% of the speeches, held-out pairs from the last 10% (later plays, never trained
    on), each shuffled."""
    rng = np.random.default_rng(SEED)
    cut = len(speeches) * 9 // 10
    return sentence_pairs(speeches[:cut], rng), sentence_pairs(speeches[cut:], rng)


def prepare(args):
    """The vocabulary size and the encoded training and held-out pairs."""
    train_pairs, eval_pairs = args.pairs[0][:args.train_pairs], args.pairs[1][:args.eval_pairs]
    chars = sorted({c for a, b, _ in train_pairs for c in a + b})
    index = {c: i + 4 for i, c in enumerate(chars)}  # after [PAD] [CLS] [SEP] [UNK]
    return len(index) + 4, encode(train_pairs, index), encode(eval_pairs, index)


def build(args, vocab, total_steps):
    """The network, its loss, and AdamW on the warm-up-then-decay schedule over `total_steps` optimizer steps."""
    ms.set_seed(SEED)
    network = BertClassifier(vocab, args.width, args.heads, args.layers, FFN_RATIO * args.width, SEQ_LEN,
                             args.dropout)
    if args.init:  # e.g. a pretrained encoder: what fits by name and shape loads, the rest (a new head) starts fresh
        own = {p.name: p for p in network.trainable_params()}
        fits = {name: value for name, value in args.init_params.items()
                if name in own and tuple(value.shape) == tuple(own[name].shape)}
        if not fits:
            fail(f"argument --init: no parameter of '{args.init}' fits the network by name and shape")
        ms.load_param_into_net(network, fits, strict_load=False)
        print(f"--init {args.init}: {len(fits)} parameter(s) loaded, {len(own) - len(fits)} fresh")
    warmup = max(1, round(WARMUP * total_steps))
    optimizer = adamw(network, WarmUpLinearDecay(args.lr, warmup, total_steps), WEIGHT_DECAY)
    loss_fn = nn.SoftmaxCrossEntropyWithLogits(sparse=True, reduction="mean")
    return network, loss_fn, optimizer


def main(args):
    info = init_data_parallel() if distributed_launch() else None  # under msrun: first, before any work
    rank, ranks = (info.rank, info.group_size) if info else (0, 1)
    ms_accum.set_device(DEVICE)
    ds.config.set_seed(SEED)  # every rank shuffles the same order and reads its own shard of it
    vocab, train_columns, eval_columns = prepare(args)
    train_data = dataset(train_columns, args.micro_batch, True, rank, ranks)
    eval_data = dataset(eval_columns, args.micro_batch, False, rank, ranks)  # larger batches: a larger eval graph
    k = args.accumulate_step
    total_steps = args.epochs * math.ceil(train_data.get_dataset_size() / k)  # the schedule's clock: updates
    network, loss_fn, optimizer = build(args, vocab, total_steps)
    if rank == 0:
        print(f"{len(train_columns[3])} training pairs ({train_columns[3].mean():.0%} replies), "
              f"{len(eval_columns[3])} held out; {vocab} tokens; {total_steps} updates of K={k} x B="
              f"{args.micro_batch}{f' x {ranks} ranks' if ranks > 1 else ''} = {k * args.micro_batch * ranks} pairs")

    executor = GradientAccumulation(network, loss_fn, optimizer, window=WindowOptions(clip_norm=CLIP_NORM))
    checkpoints = Checkpoints(args.ckpt_dir, "finetune_bert", save_every=args.save_every, keep_last=KEEP_LAST,
                              resume=args.resume or None, metadata={"width": args.width, "layers": args.layers})

    def show(record):  # the window's loss, the rate its update used (global_step is past it), the validation
        lr = float(optimizer.learning_rate(Tensor(record.step - 1, ms.int32)).asnumpy())
        print(f"step {record.step:4d}: loss {record.loss:.4f}, lr {lr:.2e}; validation loss "
              f"{record.validation['loss']:.4f}, accuracy {record.validation['accuracy']:.4f}", flush=True)

    def on_step(record):
        if rank == 0 and record.validation:
            show(record)

    result = executor.train_process(args.epochs, train_data, k, checkpoints=checkpoints,
                                    log=LogOptions(verbose=False, on_step=on_step), eval_dataset=eval_data,
                                    eval_every=Validation(every=args.eval_every, keep_best="accuracy"))
    if rank != 0:
        return
    if result.resumed_from:
        print(f"(resumed from {result.resumed_from})")
    if result.steps and result.steps[-1].step % args.eval_every:  # the last step is scored after its on_step
        show(result.steps[-1])
    best = os.path.join(args.ckpt_dir, "finetune_bert-best.ckpt")
    restored = BertClassifier(vocab, args.width, args.heads, args.layers, FFN_RATIO * args.width, SEQ_LEN,
                             args.dropout)
    step = load_into(restored, best)["step"]  # strict: every parameter must fit
    print(f"final network: {result.checkpoint}\nbest network: {best} (step {step}), held-out accuracy "
          f"{accuracy(restored, eval_columns, args.micro_batch):.4f}")


# ---------------------------------------------------------------------------------------------------- peak memory
MEASURED = {"micro_step": "one step of B, MindSpore's dropout",
            "micro_step_seeded": "one step of B, dropout seeded as ms_accum does",
            "accumulated": "ms_accum: K x B, GradientAccumulation",
            "global_step": "one step of K x B, MindSpore's dropout"}


class ClippedStep(nn.TrainOneStepCell):
    """One plain training step with the same clipping as the windows, for the comparison."""

    def construct(self, *inputs):
        loss = self.network(*inputs)
        grads = self.grad_no_sens(self.network, self.weights)(*inputs)
        return ops.depend(loss, self.optimizer(ops.clip_by_global_norm(grads, CLIP_NORM)))


def measure_one(args, mode):
    """This process's peak resident memory (ru_maxrss) before and after training on 2 x K x B pairs in `mode`: two
    windows of K x B, 2K plain steps of B, or two plain steps of K x B."""
    ms_accum.set_device(DEVICE)
    ds.config.set_seed(SEED)
    k, b = args.accumulate_step, args.micro_batch
    vocab, train_columns, _ = prepare(args)
    network, loss_fn, optimizer = build(args, vocab, total_steps=2)
    batch = k * b if mode == "global_step" else b
    data = dataset([c[:2 * k * b] for c in train_columns], batch, True)
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    if mode == "accumulated":
        executor = GradientAccumulation(network, loss_fn, optimizer, window=WindowOptions(clip_norm=CLIP_NORM))
        executor.train_process(1, data, k, checkpoints=None, log=LogOptions(verbose=False))
    else:
        # The executor's own dropout on CPU, reproducible and resumable; MindSpore's for "micro_step".
        streams = dropout_streams(network if mode == "micro_step_seeded" else nn.Cell())
        step = ClippedStep(WithLossColumns(network, loss_fn), optimizer).set_train()
        with streams.drawing():
            for columns in data.create_tuple_iterator(num_epochs=1):
                step(*columns)
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    print(json.dumps({"before_mib": before / 1024, "peak_mib": peak / 1024}))


def measure(args, argv):
    """Each configuration in a fresh process (a process's peak only grows), then the comparison."""
    k, b = args.accumulate_step, args.micro_batch
    print(f"peak resident memory (ru_maxrss) of a fresh process over the same {2 * k * b} pairs (two updates); "
          f"width {args.width}, {args.layers} layers, sequence {SEQ_LEN}, K={k}, B={b}")
    peak = {}
    for mode, what in MEASURED.items():
        out = subprocess.run([sys.executable, os.path.abspath(__file__), *argv, "--measure-one", mode],
                             capture_output=True, text=True)
        if out.returncode < 0:  # the kernel's out-of-memory killer, most likely: that configuration does not fit
            print(f"  {what:48s} killed by signal {-out.returncode}: it does not fit")
            continue
        if out.returncode != 0:
            sys.exit(f"{mode} failed:\n{out.stderr[-3000:]}")
        figures = json.loads(out.stdout.strip().splitlines()[-1])
        peak[mode] = figures["peak_mib"]
        print(f"  {what:48s} peak {peak[mode]:7.0f} MiB, {peak[mode] - figures['before_mib']:+7.0f} MiB while training")
    if "accumulated" in peak and "global_step" in peak:
        saved = peak["global_step"] - peak["accumulated"]
        print(f"K x B saves {saved:.0f} MiB ({saved / peak['global_step']:.0%}) of one {k * b}-pair step's peak; it "
              f"costs {peak['accumulated'] - peak['micro_step']:+.0f} MiB over one step of B, "
              f"{peak['accumulated'] - peak['micro_step_seeded']:+.0f} MiB over one with the same dropout")
    return peak


# ------------------------------------------------------------------------------------------------------ the flags
def fail(message):
    """Ends the run with one line, as argparse does for a bad flag (exit status 2)."""
    sys.stderr.write(f"{os.path.basename(sys.argv[0])}: error: {message}\n")
    sys.exit(2)


def probability(text):
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be a probability in [0, 1), but got '{text}'") from None
    if not 0.0 <= value < 1.0:
        raise argparse.ArgumentTypeError(f"must be a probability in [0, 1), but got {text}")
    return value


def parse(argv):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data", help="Tiny Shakespeare's input.txt (default: $MS_ACCUM_SHAKESPEARE, else "
                                       "../shared/data/tinyshakespeare/input.txt beside the checkout)")
    parser.add_argument("--micro-batch", type=positive_int, default=MICRO_BATCH, metavar="B",
                        help=f"pairs per micro-batch on each rank (default {MICRO_BATCH})")
    parser.add_argument("--accumulate-step", type=positive_int, default=ACCUMULATE_STEP, metavar="K",
                        help=f"micro-batches per update (default {ACCUMULATE_STEP})")
    parser.add_argument("--epochs", type=positive_int, default=EPOCHS, help=f"default {EPOCHS}")
    parser.add_argument("--train-pairs", type=positive_int, default=TRAIN_PAIRS, metavar="N",
                        help=f"train on the first N pairs (default {TRAIN_PAIRS})")
    parser.add_argument("--eval-pairs", type=positive_int, default=EVAL_PAIRS, metavar="N",
                        help=f"score the first N held-out pairs (default {EVAL_PAIRS})")
    parser.add_argument("--width", type=positive_int, default=WIDTH, help=f"model width (default {WIDTH})")
    parser.add_argument("--heads", type=positive_int, default=HEADS, help=f"attention heads (default {HEADS})")
    parser.add_argument("--layers", type=positive_int, default=LAYERS, help=f"encoder layers (default {LAYERS})")
    parser.add_argument("--dropout", type=probability, default=DROPOUT, help=f"default {DROPOUT}")
    parser.add_argument("--lr", type=positive_float, default=LEARNING_RATE,
                        help=f"the peak learning rate (default {LEARNING_RATE:g})")
    parser.add_argument("--eval-every", type=positive_int, default=EVAL_EVERY, metavar="N",
                        help=f"score the held-out pairs every N updates (default {EVAL_EVERY})")
    parser.add_argument("--save-every", type=positive_int, default=SAVE_EVERY, metavar="N",
                        help=f"save the training state every N updates (default {SAVE_EVERY})")
    parser.add_argument("--ckpt-dir", default="ckpt", help="where checkpoints go (default ckpt)")
    parser.add_argument("--resume", action="store_true", help="continue from the newest training state in --ckpt-dir")
    parser.add_argument("--init", metavar="CKPT", help="start from these weights (what fits by name and shape)")
    parser.add_argument("--measure", action="store_true",
                        help="measure the peak memory of K x B against one step of K*B, each in a fresh process")
    parser.add_argument("--measure-one", choices=tuple(MEASURED), help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.width % args.heads:
        parser.error(f"argument --heads: must divide --width ({args.width}), but got {args.heads}")
    if args.init and not os.path.isfile(args.init):
        parser.error(f"argument --init: '{args.init}' does not exist")
    if args.init:
        try:
            args.init_params = ms.load_checkpoint(args.init)
        except ValueError:  # missing, truncated or not a checkpoint: MindSpore says "Failed to read the checkpoint"
            parser.error(f"argument --init: '{args.init}' is not a readable MindSpore checkpoint")
    try:
        path, speeches = read_speeches(args.data)
    except ValueError as err:
        parser.error(f"argument --data: {err}")  # one line, exit status 2
    args.pairs = split(speeches)
    if len(args.pairs[0]) < args.micro_batch or not args.pairs[1]:
        parser.error(f"argument --data: '{path}' gives {len(args.pairs[0])} training and {len(args.pairs[1])} "
                     f"held-out pairs of consecutive lines, the tutorial needs at least {args.micro_batch} (one "
                     f"micro-batch) and 1")
    return parser, args


if __name__ == "__main__":
    parser, args = parse(sys.argv[1:])
    if args.measure_one:
        measure_one(args, args.measure_one)
    elif args.measure:
        measure(args, [a for a in sys.argv[1:] if a != "--measure"])
    else:
        try:
            main(args)
        except CheckpointError as err:  # --resume from a state that cannot continue this run (other sizes)
            fail(str(err))
