"""The graphs built on the window: the @jit_class Accumulator and the Cells."""
