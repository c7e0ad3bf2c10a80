"""Stream workers: step assembly and the thin faust/embedded shells around the core."""
