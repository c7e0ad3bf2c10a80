"""Hang detection (docs/detection.md, "1. Hangs"): heartbeats and stack dumps in, hangs out.

:class:`~rankwatch.streams.hang.detector.HangDetector` decides which ranks are
stalled and when a job is hung, and names culprits, waiters and suspects;
:func:`~rankwatch.streams.hang.stacks.merge_stacks` folds many ranks' stacks into
distinct call paths. No clock reads, no I/O in the core: the caller passes ``now_ns``.

Pure core: ``detector``, ``stacks``, ``ranges`` and ``service`` (messages in, hang
rows and alerts out). Shell: ``worker`` (the faust agent and its state).
"""

SHELL = ("worker",)
