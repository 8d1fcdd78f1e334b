"""Parameter-heavy factories for tests/test_plan.py and benchmarks/plan_budget.py (``parameter_heavy:encoder``,
imported from this directory), with the ``dataset`` that ``ms-accum train --plan`` reads."""
import mindspore.dataset as ds

from ms_accum.demo import models

SAMPLES = {"train": 128, "eval": 32}  # train: 4 windows of a global batch of 32


def _with_dataset(network, loss_fn, optimizer, sample):
    def dataset(batch_size, usage, shard_id, num_shards):
        data, label = sample(SAMPLES[usage])
        return ds.NumpySlicesDataset({"data": data, "label": label}, shuffle=False, num_shards=num_shards,
                                     shard_id=shard_id).batch(batch_size, drop_remainder=True)
    return network, loss_fn, optimizer, sample, dataset


def encoder():
    """`ms_accum.demo.models.encoder` small enough to plan in a test: 2 written-out layers of width 256 at sequence
    128 over BERT's 30,522-token vocabulary (36 MiB of parameters, 30 of them the embedding), AdamW. Its parameter
    side (the parameters, the buffer, the gradients and AdamW's two moments, about 5x the parameters, and a state
    save) is about as large as what one window of B=8 adds in activations."""
    return _with_dataset(*models.encoder("adamw", layers=2, seq=128, width=256))


def encoder_4x768():
    """Issue 45's model: 4 written-out encoder layers of width 768 at sequence 128 over an 8,192-token vocabulary
    (132 MiB of parameters), AdamW."""
    return _with_dataset(*models.encoder("adamw", layers=4, seq=128, width=768, vocab=8192))
