"""The benchmark suite of ms_accum: ``python -m benchmarks`` (see README.md beside it). Not part of the package."""
# Before any section loads MindSpore: ms_accum chooses oneDNN's CPU ISA (AVX2 on AVX-512 CPUs, docs/mindspore.md),
# which MindSpore reads only when it loads, so the figures are those of the library as users run it.
import ms_accum.runtime  # noqa: F401
