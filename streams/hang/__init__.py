"""Hang detection (docs/detection.md, "1. Hangs"): pure core, fed heartbeats and stack dumps.

:class:`~rankwatch.streams.hang.detector.HangDetector` decides which ranks are
stalled and when a job is hung, and names culprits, waiters and suspects;
:func:`~rankwatch.streams.hang.stacks.merge_stacks` folds many ranks' stacks into
distinct call paths. No clock reads, no I/O: the caller passes ``now_ns``.
"""
