"""ascendc_pack_runtime.batching: the batch spec, merge/split, the call plan and the asyncio batcher,
around a model that genuinely takes a leading batch dim (a small eager MLP and a two-input,
two-output module); the requests' answers are compared with each request run on its own."""

from __future__ import annotations

import asyncio
import threading

import pytest
import torch

from ascendc_pack_runtime.batching import (ANY, BatchError, BatchedTensor, Batcher, BatchSpec, batch_spec, merge,
                                           plan, run_merged, split)

torch.manual_seed(0)
MLP = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.GELU(), torch.nn.Linear(32, 8)).eval()


class TwoByTwo(torch.nn.Module):
    """Inputs x [rows, 4], t [rows, *] (any length); outputs [rows] and [rows, 4]."""

    def forward(self, x, t):
        return (x.sum(1) + t.mean(1), x * t[:, :1])


def mlp_run(*inputs):
    with torch.no_grad():
        return [MLP(*inputs)]


def mlp_spec(max_batch=8, preferred=()):
    return BatchSpec((BatchedTensor("x", torch.float32, (16,)),), (BatchedTensor("y", torch.float32, (8,)),),
                     max_batch=max_batch, preferred=preferred)


def two_spec():
    return BatchSpec((BatchedTensor("x", torch.float32, (4,)), BatchedTensor("t", torch.float32, (ANY,))),
                     (BatchedTensor("s", torch.float32, ()), BatchedTensor("z", torch.float32, (4,))), max_batch=16)


def test_spec_checks_rows_item_shapes_and_dtypes():
    spec = two_spec()
    assert spec.rows([torch.zeros(3, 4), torch.zeros(3, 7)]) == 3
    with pytest.raises(BatchError, match=r"input 't' has 2 rows, input 'x' 3"):
        spec.rows([torch.zeros(3, 4), torch.zeros(2, 7)])
    with pytest.raises(BatchError, match=r"input 'x' has shape \[3, 5\], expected 'x' \(float32\[rows, 4\]\)"):
        spec.rows([torch.zeros(3, 5), torch.zeros(3, 7)])
    with pytest.raises(BatchError, match=r"'x' is torch.float64"):
        spec.rows([torch.zeros(3, 4, dtype=torch.float64), torch.zeros(3, 7)])
    with pytest.raises(BatchError, match="has 17 rows .* takes 1 to 16"):
        spec.rows([torch.zeros(17, 4), torch.zeros(17, 7)])
    with pytest.raises(BatchError, match="1 input.* takes 2"):
        spec.rows([torch.zeros(3, 4)])
    with pytest.raises(BatchError, match="increasing and inside"):
        mlp_spec(max_batch=8, preferred=(4, 16))


def test_merge_split_round_trip_matches_each_request_alone():
    spec = mlp_spec()
    requests = [(torch.randn(n, 16),) for n in (1, 3, 2)]
    outputs = mlp_run(*merge(requests))
    assert outputs[0].shape == (6, 8)
    parts = split(spec, outputs, [1, 3, 2])
    for (x,), (y,) in zip(requests, parts):
        torch.testing.assert_close(y, mlp_run(x)[0], rtol=1e-5, atol=1e-6)
    assert merge([requests[0]])[0] is requests[0][0]   # one request: no copy
    with pytest.raises(BatchError, match=r"output 'y' has shape \[6, 8\] for a call of 5 rows"):
        split(spec, outputs, [1, 3, 1])
    with pytest.raises(BatchError, match="returned 2 outputs"):
        split(spec, outputs * 2, [6])


def test_plan_groups_equal_item_shapes_within_max_batch_and_never_splits_a_request():
    spec = mlp_spec(max_batch=8)
    keys = ["a", "a", "b", "a", "a", "b"]
    rows = [3, 4, 8, 2, 5, 1]
    calls = plan(spec, keys, rows)
    assert calls == [[0, 1], [2], [3, 4], [5]]
    for call in calls:
        assert len({keys[i] for i in call}) == 1 and sum(rows[i] for i in call) <= 8


def test_run_merged_bad_requests_fail_alone_and_a_failing_call_fails_its_requests():
    spec = two_spec()
    model = TwoByTwo()
    calls = []

    def run(x, t):
        calls.append((tuple(x.shape), tuple(t.shape)))
        if t.shape[1] == 9:
            raise RuntimeError("kernel failed")
        return model(x, t)

    reqs = [(torch.randn(2, 4), torch.randn(2, 5)), (torch.randn(1, 4), torch.randn(1, 3)),
            (torch.randn(3, 4), torch.randn(3, 5)), (torch.randn(1, 5), torch.randn(1, 5)),
            (torch.randn(1, 4), torch.randn(1, 9))]
    results = run_merged(run, spec, reqs)
    assert sorted(calls) == sorted([((5, 4), (5, 5)), ((1, 4), (1, 3)), ((1, 4), (1, 9))])   # item shapes apart
    for k in (0, 1, 2):
        want = model(*reqs[k])
        assert len(results[k]) == 2
        for got, w in zip(results[k], want):
            torch.testing.assert_close(got, w)
    assert isinstance(results[3], BatchError) and "'x' has shape [1, 5]" in str(results[3])
    assert isinstance(results[4], RuntimeError) and "kernel failed" in str(results[4])


def test_batch_spec_is_none_without_a_dynamic_section_and_reads_the_batch_dim():
    io = {"inputs": [{"name": "x", "shape": [4, 16], "dtype": "float32"}],
          "outputs": [{"name": "y", "shape": [4, 8], "dtype": "float32"}]}
    assert batch_spec(io) is None
    dyn = {"dims": [{"name": "batch", "min": 1, "max": 32}], "inputs": [["batch", None]], "outputs": [["batch", None]],
           "buckets": [[1], [4], [16]]}
    spec = batch_spec(dict(io, dynamic=dyn))
    assert spec == BatchSpec((BatchedTensor("x", torch.float32, (16,)),), (BatchedTensor("y", torch.float32, (8,)),),
                             max_batch=32, min_batch=1, preferred=(4, 16))
    # a dynamic dim that is not dim 0 of every input and output is no batch dim
    seq = dict(dyn, dims=[{"name": "seq", "min": 1, "max": 64}], inputs=[[None, "seq"]], outputs=[[None, "seq"]])
    assert batch_spec(dict(io, dynamic=seq)) is None
    other = dict(dyn, dims=dyn["dims"] + [{"name": "seq", "min": 2, "max": 64}], inputs=[["batch", "seq"]],
                 outputs=[["batch", None]], buckets=[[4, 8]])
    spec = batch_spec(dict(io, dynamic=other))
    assert spec.inputs[0].item_shape == (ANY,) and spec.preferred == (4,)


def _submit_all(batcher, requests):
    async def go():
        return await asyncio.gather(*[batcher.submit(r) for r in requests], return_exceptions=True)
    return go()


def test_batcher_merges_concurrent_requests_and_answers_each_with_its_rows():
    spec = mlp_spec(max_batch=8)
    sizes = []
    pool_lock = threading.Lock()

    async def run(inputs):
        sizes.append(inputs[0].shape[0])
        return await asyncio.get_running_loop().run_in_executor(None, lambda: _locked(pool_lock, inputs))

    def _locked(lock, inputs):
        with lock:
            return mlp_run(*inputs)

    async def main():
        batcher = Batcher(spec, run, max_delay_s=0.5, slots=1)
        requests = [(torch.randn(1, 16),) for _ in range(16)]
        results = await _submit_all(batcher, requests)
        await batcher.close()
        return batcher, requests, results

    batcher, requests, results = asyncio.run(main())
    assert batcher.requests == 16 and batcher.calls == len(sizes) < 16
    assert max(sizes) <= 8 and sum(sizes) == 16
    for (x,), (y,) in zip(requests, results):
        torch.testing.assert_close(y, mlp_run(x)[0], rtol=1e-5, atol=1e-6)


def test_batcher_joins_requests_that_arrive_while_the_model_is_busy_even_without_delay():
    spec = mlp_spec(max_batch=64)
    sizes = []

    async def main():
        gate = asyncio.Event()

        async def run(inputs):
            sizes.append(inputs[0].shape[0])
            if len(sizes) == 1:
                await gate.wait()   # the first call holds the only slot until the others queued
            return mlp_run(*inputs)

        batcher = Batcher(spec, run, max_delay_s=0.0, slots=1)
        first = asyncio.ensure_future(batcher.submit((torch.randn(1, 16),)))
        while not sizes:
            await asyncio.sleep(0)
        rest = [asyncio.ensure_future(batcher.submit((torch.randn(2, 16),))) for _ in range(5)]
        await asyncio.sleep(0)
        gate.set()
        out = await asyncio.gather(first, *rest)
        await batcher.close()
        return out

    out = asyncio.run(main())
    assert sizes == [1, 10] and [o[0].shape[0] for o in out] == [1, 2, 2, 2, 2, 2]


def test_batcher_refuses_a_bad_request_at_once_and_a_failing_call_fails_only_its_requests():
    spec = mlp_spec(max_batch=4)

    async def run(inputs):
        if inputs[0].shape[0] == 4:
            raise RuntimeError("boom")
        return mlp_run(*inputs)

    async def main():
        batcher = Batcher(spec, run, max_delay_s=0.05, slots=1)
        with pytest.raises(BatchError, match="has shape"):
            await batcher.submit((torch.randn(1, 15),))
        # 2 + 2 fill one call of 4 (fails), the 1-row request after them gets its own call
        results = await _submit_all(batcher, [(torch.randn(2, 16),), (torch.randn(2, 16),), (torch.randn(1, 16),)])
        await batcher.close()
        return results

    results = asyncio.run(main())
    assert [type(r).__name__ for r in results[:2]] == ["RuntimeError", "RuntimeError"]
    assert isinstance(results[2], list) and results[2][0].shape == (1, 8)


def test_batcher_keeps_item_shapes_apart():
    spec = two_spec()
    model = TwoByTwo()
    seen = []

    async def run(inputs):
        seen.append(tuple(inputs[1].shape))
        return list(model(*inputs))

    async def main():
        batcher = Batcher(spec, run, max_delay_s=0.05, slots=2)
        reqs = [(torch.randn(1, 4), torch.randn(1, 3 if k % 2 else 5)) for k in range(6)]
        results = await _submit_all(batcher, reqs)
        await batcher.close()
        return reqs, results

    reqs, results = asyncio.run(main())
    assert sorted(seen) == [(3, 3), (3, 5)]
    for r, got in zip(reqs, results):
        for g, w in zip(got, model(*r)):
            torch.testing.assert_close(g, w)
