"""The stream workers: one wing per worker over one shell kit.

- ``kit``: what every worker's shell shares (faust app, topic bootstrap, ClickHouse
  store and sink, health file, restart snapshots) and the pure shapes every core
  returns (``kit.output``: rows, publications, dead letters);
- ``ops``: the ops what-if worker (op batches in, steps, attributions and straggler
  alerts out), and its embedded runner;
- ``hang``: the hang detector (heartbeats and stack dumps in, hangs out);
- ``minder``: the faulty-machine detector (host metrics in, machine faults out), and
  its offline training;
- ``slowdown``: slowdowns the what-if cannot see (a pure core the ops pipeline runs).

Each wing's ``__init__`` names its shell modules in ``SHELL`` (those that touch faust,
Kafka, ClickHouse, files or torch); every other module of the wing is pure core, which
tests/unit/test_layering.py checks.
"""
