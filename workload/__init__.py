"""A real multi-process PyTorch training job (gloo, CPU) with the hooks on.

Pipeline parallel (torch.distributed.pipelining: 1F1B, GPipe, interleaved 1F1B) x data
parallel, a small transformer-like model. It is the demo workload and the fixture of
the hooks' integration tests and of the what-if validation (``rankwatch.validation``).
A torch program using the hooks, not part of them (``rankwatch.hooks`` never imports
torch); start it with :func:`launch.run_job`. It imports only the hooks: the analysis
of its output lives in the app (``rankwatch.ingest``, ``rankwatch.validation``).
"""
