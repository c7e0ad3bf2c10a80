"""The what-if engine: pure numpy, no I/O."""
