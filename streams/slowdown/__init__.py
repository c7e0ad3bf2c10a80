"""Slowdowns the what-if cannot see: signals, baselines, diagnosis (docs/detection.md, §3)."""

SHELL: tuple[str, ...] = ()
