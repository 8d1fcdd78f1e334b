"""Benchmarks of ms_accum: run `python benchmarks/run_all.py` (see its --help). Not part of the package."""
