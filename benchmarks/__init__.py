"""Benchmarks of ms_accum: run `python benchmarks/run_all.py` (see its --help). Not part of the package."""
# Before any benchmark loads MindSpore, so that `python -m benchmarks.X` runs oneDNN's kernels as the CLI and the
# library do (ms_accum.runtime caps the CPU ISA on AVX-512 CPUs; it imports no MindSpore itself).
import ms_accum.runtime  # noqa: F401
