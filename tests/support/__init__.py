"""Test helpers: the development Kafka broker and stream-worker helpers.

Not part of the wheel. Importable as ``support`` under pytest (``pythonpath`` in
pyproject.toml); ``benchmarks/bench_stream.py`` puts ``tests/`` on its path itself.
"""
