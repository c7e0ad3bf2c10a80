"""Ready-made timing for PyTorch code, with no change to the training code's logic.

Nothing here imports torch: each helper wraps methods of objects the caller passes
(a pipeline stage, the ``torch.distributed.pipelining.schedules`` module, an optimizer,
an iterable), so the hooks' import path stays standard library + orjson.

- :func:`watch_pipeline`: per-microbatch forward/backward compute of
  ``torch.distributed.pipelining`` stages (their ``forward_one_chunk`` /
  ``backward_one_chunk``, every schedule calls them), and the schedules' batched
  point-to-point posts and waits. A batch is timed as a whole, from its post to the
  end of its wait (a gloo send's own wait absorbs the peer's delay, so per-op waits
  would lie); every op type in the batch gets one record with the batch's times. A
  batch of sends alone ends at its wait or, when the schedule waits late (GPipe,
  interleaved), at the end of the first compute op after which its works report
  completion, or at the post of the next send of its type, whichever comes first
  (the model runs each point-to-point type as one sequential stream).
- :func:`watch_gc`: collector pauses through ``gc.callbacks`` (on the training thread).
- :func:`timed_comm_hook`: a DDP communication hook's collectives (per bucket).
- :func:`timed_optimizer`, :func:`timed_call`: wrap a callable as one op (an explicit
  data-parallel all-reduce, a synchronisation).
- :func:`timed_batches`: time the waits of a data iterator. The ops contract has no
  op type for input waits: they are summed locally (``LocalTimings``) and, given the
  ``RankWatch``, sent in the next step's summary (``rank_steps.data_wait_ns``).
- :func:`watch_gc_pauses`: GC pauses as a per-step signal (not as ops), with the part
  that fell inside a timed op (docs/detection.md, section 3).
- :func:`linear_flops`, :func:`count_linear_flops`: FLOPs of linear layers from shapes,
  to declare with ``RankWatch.work``.
- :func:`announce_checkpoints`, :func:`announced`: checkpoint saves and loads (the
  ``save``/``load`` of ``torch`` and ``torch.distributed.checkpoint``) and any other
  long call (an evaluation) announced as phases, so that the hang detector gives them
  their own bound instead of a training step's (docs/detection.md, "Hangs").
"""

from __future__ import annotations

import functools
import gc
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any, TypeVar

from rankwatch.hooks.tracker import RankWatch

T = TypeVar("T")

_GET_OPS = {
    "get_fwd_recv_ops": "forward-recv",
    "get_fwd_send_ops": "forward-send",
    "get_bwd_recv_ops": "backward-recv",
    "get_bwd_send_ops": "backward-send",
}


@dataclass
class _Batch:
    optypes: list[tuple[str, int]]  # (optype, seq_id)
    step: int
    t0: int
    waiting: int
    works: list[Any]
    done: bool = False


@dataclass
class PipelineWatch:
    """State shared by the wrapped stages and schedule functions; ``undo()`` restores."""

    rw: RankWatch
    tags: dict[int, str] = field(default_factory=dict)
    batches: dict[int, _Batch] = field(default_factory=dict)
    sends: list[_Batch] = field(default_factory=list)
    """Send-only batches in flight: schedules wait for them late (GPipe after all
    forwards, interleaved at the next send), so they are also polled at compute ends."""
    undo_actions: list[Callable[[], None]] = field(default_factory=list)

    def undo(self) -> None:
        for action in reversed(self.undo_actions):
            action()
        self.undo_actions.clear()


def watch_pipeline(rw: RankWatch, stages: Iterable[Any], schedules: Any) -> PipelineWatch:
    """Time compute and p2p of ``stages`` (PipelineStage objects of this rank).

    ``schedules`` is the module ``torch.distributed.pipelining.schedules``: its
    ``_batch_p2p`` and ``_wait_batch_p2p`` are wrapped for this process.
    """
    watch = PipelineWatch(rw)
    pp = rw.identity.pp_size
    for stage in stages:
        _wrap_compute(watch, stage, "forward_one_chunk", "forward-compute", pp)
        _wrap_compute(watch, stage, "backward_one_chunk", "backward-compute", pp)
        for method, optype in _GET_OPS.items():
            _wrap_get_ops(watch, stage, method, optype)
    _wrap_p2p(watch, schedules)
    return watch


def _patch(watch: PipelineWatch, owner: Any, name: str, new: Any) -> None:
    had = name in vars(owner)
    old = vars(owner).get(name)
    setattr(owner, name, new)
    watch.undo_actions.append(
        (lambda: setattr(owner, name, old)) if had else (lambda: delattr(owner, name))
    )


def _wrap_compute(watch: PipelineWatch, stage: Any, method: str, optype: str, pp: int) -> None:
    original = getattr(stage, method)
    index = int(stage.stage_index)
    rw = watch.rw

    def timed(chunk_id: int, *args: Any, **kwargs: Any) -> Any:
        try:
            with rw.op(optype, mb=chunk_id, chunk=index // pp, gmc=index):
                return original(chunk_id, *args, **kwargs)
        finally:
            if watch.sends:
                _poll_sends(watch)

    _patch(watch, stage, method, timed)


def _poll_sends(watch: PipelineWatch) -> None:
    """Close the send batches whose works all completed (gloo ``Work.is_completed``)."""
    t1 = watch.rw.clock.read()
    still = []
    for batch in watch.sends:
        if batch.done:
            continue
        if all(_completed(w) for w in batch.works):
            _close(watch.rw, batch, t1)
        else:
            still.append(batch)
    watch.sends[:] = still


def _close_overlapped(watch: PipelineWatch, new: _Batch, t0: int) -> None:
    """A send still open when the next send of its type is posted ends at that post.

    The what-if model runs each point-to-point type as one sequential stream; schedules
    that keep several sends in flight (GPipe, interleaved) would otherwise record sends
    that overlap their successors, and the model would chain them end to start.
    """
    kinds = {o for o, _ in new.optypes}
    for batch in watch.sends:
        if not batch.done and kinds & {o for o, _ in batch.optypes}:
            _close(watch.rw, batch, t0)


def _completed(work: Any) -> bool:
    try:
        return bool(work.is_completed())
    except Exception:  # a Work without the call: wait for the schedule's wait
        return False


def _close(rw: RankWatch, batch: _Batch, t1: int) -> None:
    batch.done = True
    for optype, seq in batch.optypes:
        rw.emit(optype, seq, batch.t0, t1, step=batch.step)


def _wrap_get_ops(watch: PipelineWatch, stage: Any, method: str, optype: str) -> None:
    original = getattr(stage, method)

    def tagged(chunk_id: int, *args: Any, **kwargs: Any) -> Any:
        ops = original(chunk_id, *args, **kwargs)
        for op in ops:
            watch.tags[id(op)] = optype
        return ops

    _patch(watch, stage, method, tagged)


def _wrap_p2p(watch: PipelineWatch, schedules: Any) -> None:
    post, wait = schedules._batch_p2p, schedules._wait_batch_p2p
    rw = watch.rw

    def batch_p2p(p2p_ops: list[Any], *args: Any, **kwargs: Any) -> Any:
        optypes = sorted({t for op in p2p_ops if (t := watch.tags.pop(id(op), None))})
        t0 = rw.clock.read()
        works = post(p2p_ops, *args, **kwargs)
        if optypes and works and rw.enabled:
            batch = _Batch([(o, rw.next_seq(o)) for o in optypes], rw.step, t0, len(works), works)
            for w in works:
                watch.batches[id(w)] = batch
            if all(o.endswith("send") for o in optypes):
                _close_overlapped(watch, batch, t0)
                watch.sends.append(batch)
        return works

    def wait_batch_p2p(works: list[Any], *args: Any, **kwargs: Any) -> Any:
        result = wait(works, *args, **kwargs)
        t1 = rw.clock.read()
        for w in works:
            batch = watch.batches.pop(id(w), None)
            if batch is None:
                continue
            batch.waiting -= 1
            if batch.waiting == 0 and not batch.done:
                _close(rw, batch, t1)
        return result

    _patch(watch, schedules, "_batch_p2p", batch_p2p)
    _patch(watch, schedules, "_wait_batch_p2p", wait_batch_p2p)


def timed_comm_hook(
    rw: RankWatch, hook: Callable[[Any, Any], Any], optype: str = "grads-reduce-scatter"
) -> Callable[[Any, Any], Any]:
    """Wrap a DDP communication hook (``ddp.register_comm_hook(state, timed)``): each
    bucket's collective is one ``optype`` op, from the hook call to its future's
    completion. The completion callback runs on the backend's thread, so it only
    queues the times; the training thread emits them at step end (a collector).
    """
    done: deque[tuple[str, int, int, int, int]] = deque()

    def emit_done() -> None:
        while done:
            name, seq, t0, t1, step = done.popleft()
            rw.emit(name, seq, t0, t1, step=step)

    rw.collectors.append(emit_done)

    def timed(state: Any, bucket: Any) -> Any:
        if not rw.enabled:
            return hook(state, bucket)
        seq, step, t0 = rw.next_seq(optype), rw.step, rw.clock.read()

        def finished(fut: Any) -> Any:
            done.append((optype, seq, t0, rw.clock.read(), step))
            return fut.value()

        return hook(state, bucket).then(finished)

    return timed


def watch_gc(rw: RankWatch) -> Callable[[], None]:
    """Record collector pauses on the calling thread as ``gc`` ops; returns an undo.

    The what-if model expects the same ops in every step, with ``gc`` after the last
    compute (Megatron collects manually there). Automatic collections land anywhere
    and not in every step: with them on, steps' op sets differ and the stream cannot
    simulate them. Prefer ``gc.disable()`` plus a timed ``gc.collect`` per step (as
    ``workload/`` does), or use this only for diagnosis.
    """
    thread = threading.get_ident()
    open_ops: list[Any] = []

    def callback(phase: str, info: dict[str, Any]) -> None:
        if threading.get_ident() != thread or not rw.enabled:
            return
        if phase == "start":
            open_ops.append(rw.begin("gc"))
        elif open_ops:
            rw.end(open_ops.pop())

    gc.callbacks.append(callback)
    return lambda: gc.callbacks.remove(callback)


def timed_call(rw: RankWatch, optype: str, fn: Callable[..., T]) -> Callable[..., T]:
    """``fn`` timed as one ``optype`` op per call."""

    def timed(*args: Any, **kwargs: Any) -> T:
        with rw.op(optype):
            return fn(*args, **kwargs)

    return timed


def timed_optimizer(rw: RankWatch, optimizer: Any) -> Callable[[], None]:
    """Time ``optimizer.step`` as the ``optimizer`` op; returns an undo."""
    original = optimizer.step
    optimizer.step = timed_call(rw, "optimizer", original)
    return lambda: setattr(optimizer, "step", original)


@dataclass
class LocalTimings:
    """Summed waits of a kind that has no op type in the contract (kept in-process)."""

    count: int = 0
    total_ns: int = 0


def timed_batches(
    iterable: Iterable[T],
    timings: LocalTimings,
    read: Callable[[], int] = time.perf_counter_ns,
    rw: RankWatch | None = None,
) -> Iterator[T]:
    """Yield from ``iterable``, adding the time each ``next`` took to ``timings`` (and
    to ``rw``'s current step notes: the wait precedes the step it feeds)."""
    it = iter(iterable)
    while True:
        t0 = read()
        try:
            item = next(it)
        except StopIteration:
            return
        waited = read() - t0
        timings.count += 1
        timings.total_ns += waited
        if rw is not None:
            rw.note_data_wait(waited)
        yield item


def watch_gc_pauses(rw: RankWatch) -> Callable[[], None]:
    """Sum Python GC pauses of the calling thread into the step notes; returns an undo.

    Unlike :func:`watch_gc` nothing becomes an op, so automatic collections that land
    anywhere do not change a step's op set (the what-if stays valid); a pause inside a
    timed op is also noted against that op type, whose FLOP/s then leaves it out.
    """
    thread = threading.get_ident()
    read = rw.clock.read
    started: list[int] = []

    def callback(phase: str, info: dict[str, Any]) -> None:
        if threading.get_ident() != thread or not rw.enabled:
            return
        if phase == "start":
            started.append(read())
        elif started:
            rw.note_gc(read() - started.pop())

    gc.callbacks.append(callback)
    return lambda: gc.callbacks.remove(callback)


def linear_flops(tokens: int, in_features: int, out_features: int) -> int:
    """Forward FLOPs of a linear layer on ``tokens`` rows: one multiply and one add per
    weight per row, ``2 * tokens * in * out`` (the bias add is left out, as is usual)."""
    return 2 * tokens * in_features * out_features


def count_linear_flops(module: Any, run: Callable[[], object]) -> tuple[int, str]:
    """Forward FLOPs of every ``Linear`` inside ``module`` during one call of ``run``
    (forward hooks read the input shapes once; call it at start-up, not per step), and
    the dtype seen. Backward is about twice the forward (two matmuls per weight)."""
    total, dtype = 0, ""
    handles = []

    def hook(layer: Any, inputs: tuple[Any, ...], output: Any) -> None:
        nonlocal total, dtype
        shape = inputs[0].shape
        tokens = 1
        for size in shape[:-1]:
            tokens *= int(size)
        total += linear_flops(tokens, layer.in_features, layer.out_features)
        dtype = str(inputs[0].dtype).removeprefix("torch.")

    for layer in module.modules():
        if type(layer).__name__ == "Linear":
            handles.append(layer.register_forward_hook(hook))
    try:
        run()
    finally:
        for handle in handles:
            handle.remove()
    return total, dtype


CHECKPOINT_CALLS = {"save": "checkpoint-save", "load": "checkpoint-load"}
"""The module functions :func:`announce_checkpoints` wraps, and their phase names."""


def announced(
    rw: RankWatch, phase: str, fn: Callable[..., T], bound_s: float | None = None
) -> Callable[..., T]:
    """``fn`` run inside the phase ``phase`` (``RankWatch.phase``), e.g.
    ``evaluate = announced(rw, "evaluation", evaluate, bound_s=900)``."""

    @functools.wraps(fn)
    def inside(*args: Any, **kwargs: Any) -> T:
        with rw.phase(phase, bound_s):
            return fn(*args, **kwargs)

    return inside


def announce_checkpoints(
    rw: RankWatch, *modules: Any, bound_s: float | None = None
) -> Callable[[], None]:
    """Announce each call of the ``save`` and ``load`` of ``modules`` (pass ``torch`` and
    ``torch.distributed.checkpoint``) as a ``checkpoint-save`` / ``checkpoint-load``
    phase; returns an undo. Calls through a name bound before this (``from torch
    import save``) are not seen: announce those with :func:`announced`."""
    patched: list[tuple[Any, str, Any]] = []
    for module in modules:
        for name, phase in CHECKPOINT_CALLS.items():
            original = getattr(module, name, None)
            if callable(original):
                setattr(module, name, announced(rw, phase, original, bound_s))
                patched.append((module, name, original))

    def undo() -> None:
        for module, name, original in reversed(patched):
            setattr(module, name, original)

    return undo
