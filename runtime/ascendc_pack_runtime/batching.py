"""Batching requests along a bundle's batch dim: one decision, one merge, one split.

Every server path that batches (Triton's Python backend model, ``ascendc-pack serve``, the
Triton config written by ``export-triton``) asks one function, :func:`batch_spec`, whether a
bundle batches and how, and uses only the :class:`BatchSpec` it returns:

* the *batch dim* is dim 0 of every input and every output, one dynamic dim of the bundle
  (a static bundle has none: :func:`batch_spec` returns None and nothing batches; Triton's
  ``max_batch_size`` stays 0);
* a request carries ``rows`` items along it (1 from a client that sends one item) and the
  dims after it (the *item shape*) of the bundle;
* requests whose item shapes are equal are concatenated along dim 0 (:func:`merge`), run as
  one call of at most ``max_batch`` rows, and every output is cut back into each request's
  rows (:func:`split`). :func:`run_merged` does all three; :class:`Batcher` does it for
  concurrent asyncio callers within a short delay.

Where the bundle declares its batch dim: the manifest's ``dynamic`` section (the dynamic-shapes
format: ``dims`` with name/min/max, per input and per output the name of each dim's dynamic dim
or null, and ``buckets``, the tuned sizes). Bundles without it are static. A model batches only
when rows are independent along dim 0 (one request's rows never change another's outputs); a
dynamic batch dim declares exactly that.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import Awaitable, Callable, Mapping, Sequence

import torch

from .tensor_meta import DTYPES

ANY = -1
"""An item dim whose size may vary (another dynamic dim): requests batch only with equal sizes."""


class BatchError(ValueError):
    """A request's tensors do not fit the batch spec, or the model's outputs do not split."""


@dataclass(frozen=True)
class BatchedTensor:
    """An input or output that batches along dim 0: its name, dtype and item shape (the dims
    after the batch dim; :data:`ANY` for a dim whose size may vary)."""

    name: str
    dtype: torch.dtype
    item_shape: tuple[int, ...]

    def describe(self) -> str:
        dims = ", ".join("*" if d == ANY else str(d) for d in self.item_shape)
        return f"{self.name!r} ({str(self.dtype).removeprefix('torch.')}[rows{', ' if dims else ''}{dims}])"


@dataclass(frozen=True)
class BatchSpec:
    """How a bundle batches: every input and output along dim 0, 1..``max_batch`` rows a call.

    ``preferred``: batch sizes worth waiting for (the bundle's tuned buckets above 1), sorted.
    """

    inputs: tuple[BatchedTensor, ...]
    outputs: tuple[BatchedTensor, ...]
    max_batch: int
    preferred: tuple[int, ...] = ()
    min_batch: int = 1

    def __post_init__(self):
        if not self.inputs or not self.outputs:
            raise BatchError("a batch spec needs at least one input and one output")
        if not (isinstance(self.max_batch, int) and 1 <= self.min_batch <= self.max_batch):
            raise BatchError(f"batch range [{self.min_batch}, {self.max_batch}] is empty")
        bad = [p for p in self.preferred if not self.min_batch <= p <= self.max_batch]
        if bad or list(self.preferred) != sorted(set(self.preferred)):
            raise BatchError(f"preferred batch sizes {list(self.preferred)} must be increasing and inside "
                             f"[{self.min_batch}, {self.max_batch}]")

    def item_key(self, tensors: Sequence[torch.Tensor]) -> tuple[tuple[int, ...], ...]:
        """The item shapes of one request (requests with equal keys can share a call)."""
        return tuple(tuple(t.shape[1:]) for t in tensors)

    def rows(self, tensors: Sequence[torch.Tensor]) -> int:
        """Rows of one request, checked: every input has the batch dim, the same rows, the item
        shape and dtype of its spec, and the rows are in [min_batch, max_batch].

        Raises:
            BatchError: naming the input and what the model takes.
        """
        if len(tensors) != len(self.inputs):
            raise BatchError(f"{len(tensors)} input(s) given, the model takes {len(self.inputs)} "
                             f"({', '.join(b.describe() for b in self.inputs)})")
        rows = None
        for t, b in zip(tensors, self.inputs):
            shape = tuple(t.shape)
            if t.dtype != b.dtype:
                raise BatchError(f"input {b.name!r} is {t.dtype}, expected {b.describe()}")
            if len(shape) != 1 + len(b.item_shape) or any(
                    want not in (ANY, got) for want, got in zip(b.item_shape, shape[1:])):
                raise BatchError(f"input {b.name!r} has shape {list(shape)}, expected {b.describe()}")
            if rows is not None and shape[0] != rows:
                raise BatchError(f"input {b.name!r} has {shape[0]} rows, input {self.inputs[0].name!r} {rows}; "
                                 "every input of a request has the same rows (dim 0)")
            rows = shape[0]
        if not self.min_batch <= rows <= self.max_batch:
            raise BatchError(f"the request has {rows} rows (dim 0); this model takes {self.min_batch} to "
                             f"{self.max_batch} per request")
        return rows


def batch_spec(manifest: Mapping) -> BatchSpec | None:
    """How the bundle of ``manifest`` (its JSON, as ``Model.manifest``) batches; None when it does
    not: no ``dynamic`` section (every bundle with static shapes), or no dynamic dim that is dim 0
    of every input and every output."""
    dynamic = manifest.get("dynamic")
    if not dynamic:
        return None
    return _from_dynamic(dynamic, manifest["inputs"], manifest["outputs"])


def _from_dynamic(dynamic: Mapping, inputs: Sequence[Mapping], outputs: Sequence[Mapping]) -> BatchSpec | None:
    dims = {d["name"]: (int(d["min"]), int(d["max"])) for d in dynamic.get("dims", [])}
    in_decl = [list(d) for d in dynamic.get("inputs", [])]
    out_decl = [list(d) for d in dynamic.get("outputs", [])]
    if len(in_decl) != len(inputs) or len(out_decl) != len(outputs):
        return None
    leads = {decl[0] if decl else None for decl in in_decl + out_decl}
    if len(leads) != 1 or None in leads:
        return None
    (lead,) = leads
    lo, hi = dims[lead]
    position = [d["name"] for d in dynamic.get("dims", [])].index(lead)
    buckets = sorted({int(b[position]) for b in dynamic.get("buckets", []) if lo <= int(b[position]) <= hi})

    def batched(io: Mapping, decl: list) -> BatchedTensor:
        item = tuple(ANY if name is not None else int(n) for n, name in zip(io["shape"][1:], decl[1:]))
        return BatchedTensor(io["name"], DTYPES[io["dtype"]], item)

    return BatchSpec(tuple(batched(io, d) for io, d in zip(inputs, in_decl)),
                     tuple(batched(io, d) for io, d in zip(outputs, out_decl)),
                     max_batch=hi, min_batch=lo, preferred=tuple(b for b in buckets if b > 1))


def merge(requests: Sequence[Sequence[torch.Tensor]]) -> list[torch.Tensor]:
    """One call's inputs: each input of every request concatenated along dim 0, in order (one
    request: its own tensors, no copy)."""
    if len(requests) == 1:
        return list(requests[0])
    return [torch.cat(parts, dim=0) for parts in zip(*requests)]


def split(spec: BatchSpec, outputs: Sequence[torch.Tensor], rows: Sequence[int]) -> list[list[torch.Tensor]]:
    """Each request's outputs: rows ``[start, start + rows[k])`` of every output (views).

    Raises:
        BatchError: an output without ``sum(rows)`` rows along dim 0 (the model does not batch
        as its spec says).
    """
    total = sum(rows)
    if len(outputs) != len(spec.outputs):
        raise BatchError(f"the model returned {len(outputs)} outputs, its batch spec has {len(spec.outputs)}")
    for t, b in zip(outputs, spec.outputs):
        if t.dim() == 0 or t.shape[0] != total:
            raise BatchError(f"output {b.name!r} has shape {list(t.shape)} for a call of {total} rows; a batched "
                             f"output is {b.describe()} with the call's rows in dim 0")
    out, start = [], 0
    for n in rows:
        out.append([t.narrow(0, start, n) for t in outputs])
        start += n
    return out


def plan(spec: BatchSpec, keys: Sequence[tuple], rows: Sequence[int]) -> list[list[int]]:
    """Group requests (by index, in arrival order) into calls: equal item keys, at most
    ``max_batch`` rows each; a request is never split."""
    calls: list[list[int]] = []
    open_calls: dict[tuple, tuple[list[int], list[int]]] = {}   # key -> (indices, [rows so far])
    for i, (key, n) in enumerate(zip(keys, rows)):
        current = open_calls.get(key)
        if current is None or current[1][0] + n > spec.max_batch:
            current = ([], [0])
            open_calls[key] = current
            calls.append(current[0])
        current[0].append(i)
        current[1][0] += n
    return calls


def run_merged(run: Callable[..., Sequence[torch.Tensor]], spec: BatchSpec,
               requests: Sequence[Sequence[torch.Tensor]]) -> list[list[torch.Tensor] | Exception]:
    """Run ``requests`` (each a tuple of input tensors) in as few calls of ``run`` as
    :func:`plan` allows and return each request's outputs, or the exception that request got: a
    request that does not fit the spec gets its :class:`BatchError` and the others still run; a
    call that fails fails the requests it carried."""
    results: list = [None] * len(requests)
    good, keys, rows = [], [], []
    for i, tensors in enumerate(requests):
        try:
            rows.append(spec.rows(tensors))
        except BatchError as e:
            results[i] = e
            continue
        good.append(i)
        keys.append(spec.item_key(tensors))
    for call in plan(spec, keys, rows):
        members = [good[j] for j in call]
        try:
            outputs = list(run(*merge([requests[i] for i in members])))
            parts = split(spec, outputs, [rows[j] for j in call])
        except Exception as e:  # noqa: BLE001 - every request of the call gets the error
            for i in members:
                results[i] = e
            continue
        for i, part in zip(members, parts):
            results[i] = part
    return results


@dataclass
class _Pending:
    tensors: Sequence[torch.Tensor]
    rows: int
    key: tuple
    arrived: float
    future: asyncio.Future = field(repr=False)


class Batcher:
    """Batches concurrent asyncio callers: :meth:`submit` waits for its outputs.

    A request waits until the first waiting request has waited ``max_delay_s``, or until the
    waiting requests of its item shape fill ``max_batch`` rows (or reach the largest preferred
    size), and no longer than a free call slot takes (``slots`` calls run at once: one per model
    instance; while every slot is busy, arriving requests join the next call). ``run`` is the
    coroutine that runs one merged call (e.g. on a thread pool). ``max_delay_s`` 0 batches only
    what has queued while the slots were busy.

    Counters ``calls`` and ``requests`` say how many calls carried how many requests.
    """

    def __init__(self, spec: BatchSpec, run: Callable[[list[torch.Tensor]], Awaitable[Sequence[torch.Tensor]]], *,
                 max_delay_s: float = 0.002, slots: int = 1):
        if not max_delay_s >= 0:
            raise ValueError(f"max_delay_s must be >= 0, got {max_delay_s!r}")
        if not isinstance(slots, int) or slots < 1:
            raise ValueError(f"slots must be an integer >= 1, got {slots!r}")
        self.spec = spec
        self._run = run
        self.max_delay_s = max_delay_s
        self._target = spec.preferred[-1] if spec.preferred else spec.max_batch
        self._slots = asyncio.Semaphore(slots)
        self._queue: list[_Pending] = []
        self._arrival = asyncio.Event()
        self._loop_task: asyncio.Task | None = None
        self._tasks: set[asyncio.Task] = set()
        self.calls = 0
        self.requests = 0

    async def submit(self, tensors: Sequence[torch.Tensor]) -> list[torch.Tensor]:
        """This request's outputs, run in a call with whichever requests batch with it.

        Raises:
            BatchError: the request does not fit the spec (before it waits).
        """
        rows = self.spec.rows(tensors)
        loop = asyncio.get_running_loop()
        if self._loop_task is None or self._loop_task.done():
            self._loop_task = loop.create_task(self._dispatch())
        pending = _Pending(tensors, rows, self.spec.item_key(tensors), loop.time(), loop.create_future())
        self._queue.append(pending)
        self._arrival.set()
        return await pending.future

    def _ready_rows(self, key: tuple) -> int:
        return sum(p.rows for p in self._queue if p.key == key)

    async def _dispatch(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            while not self._queue:
                self._arrival.clear()
                await self._arrival.wait()
            await self._slots.acquire()
            try:
                first = self._queue[0]
                while self._ready_rows(first.key) < min(self._target, self.spec.max_batch):
                    left = first.arrived + self.max_delay_s - loop.time()
                    if left <= 0:
                        break
                    self._arrival.clear()
                    try:
                        await asyncio.wait_for(self._arrival.wait(), left)
                    except asyncio.TimeoutError:
                        break
                batch = self._take(first.key)
            except BaseException:
                self._slots.release()
                raise
            task = loop.create_task(self._call(batch))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

    def _take(self, key: tuple) -> list[_Pending]:
        """The waiting requests of ``key`` that fit one call, first come first served."""
        batch, rows, rest, full = [], 0, [], False
        for p in self._queue:
            if p.future.done():      # the caller went away
                continue
            if p.key == key and not full and rows + p.rows <= self.spec.max_batch:
                batch.append(p)
                rows += p.rows
            else:
                full = full or p.key == key
                rest.append(p)
        self._queue = rest
        return batch

    async def _call(self, batch: list[_Pending]) -> None:
        try:
            if not batch:
                return
            self.calls += 1
            self.requests += len(batch)
            try:
                outputs = list(await self._run(merge([p.tensors for p in batch])))
                parts = split(self.spec, outputs, [p.rows for p in batch])
            except Exception as e:  # noqa: BLE001 - every request of the call gets the error
                for p in batch:
                    if not p.future.done():
                        p.future.set_exception(e)
                return
            for p, part in zip(batch, parts):
                if not p.future.done():
                    p.future.set_result(part)
        finally:
            self._slots.release()

    async def close(self) -> None:
        """Stop dispatching; requests still waiting get a ``RuntimeError``."""
        if self._loop_task is not None:
            self._loop_task.cancel()
            try:
                await self._loop_task
            except asyncio.CancelledError:
                pass
        for p in self._queue:
            if not p.future.done():
                p.future.set_exception(RuntimeError("the server is stopping"))
        self._queue = []


__all__ = ["ANY", "BatchError", "BatchedTensor", "BatchSpec", "batch_spec", "merge", "split", "plan", "run_merged",
           "Batcher"]
