"""Helpers of ``benchmarks/run.py``: machine description, timing, GEMM ceilings, training step and
sampling measurements."""
