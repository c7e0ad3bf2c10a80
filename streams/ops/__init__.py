"""The ops worker: op batches in; steps, what-if figures and straggler alerts out.

Pure core: ``pipeline`` (decode -> assemble -> analyse -> rows), ``assembly`` (per-rank
batches into steps), ``identity`` (a job's layout fixed once), ``jobs`` (the ``jobs``
row), ``analyser`` (the live what-if of a step), ``window`` (rolling windows),
``alerts`` (straggler alerts), ``blame`` (the smallest group that explains a
slowdown), ``analysing`` (the pipeline as every path builds it), ``live`` (the live
figures of a whole trace),
``replay`` (a trace as the hooks would send it), ``handover`` (a job's state as one
``jobstate`` message, for the worker its partition moves to).

Shell: ``worker`` (the faust agent), ``worker_state`` (acks, sink, recovery and
publishing between the agent and the pipeline), ``recovery`` (what the store
remembers of a job), ``embedded`` (the pipeline in-process, no Kafka: the demo,
``rankwatch replay``), ``publish`` (op batches to Kafka).
"""

SHELL = ("worker", "worker_state", "recovery", "embedded", "publish")
