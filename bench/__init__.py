"""Benchmarks for npud. Run with ``python -m bench`` (``make bench``)."""
