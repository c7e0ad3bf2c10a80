"""Per-rank hooks that run inside training processes (standard library + orjson only)."""
