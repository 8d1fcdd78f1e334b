"""A parameter-heavy factory for tests/test_plan.py (``parameter_heavy:encoder``, imported from this directory)."""
from ms_accum.demo import models


def encoder():
    """`ms_accum.demo.models.encoder` small enough to plan in a test: 2 written-out layers of width 256 at sequence
    128 over BERT's 30,522-token vocabulary (36 MiB of parameters, 30 of them the embedding), AdamW. Its parameter
    side (the buffer, the gradients and AdamW's two moments, about 4x the parameters) is about half of what one
    window of B=8 adds, the activations the other half."""
    return models.encoder("adamw", layers=2, seq=128, width=256)
