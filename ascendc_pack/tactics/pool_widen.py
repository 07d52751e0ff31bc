"""A widening cast before a max pooling moves after it (part of the lowering, after
:mod:`ascendc_pack.tactics.lower`).

A bfloat16 convolution lowered by :mod:`~ascendc_pack.tactics.lower_casts` returns bfloat16 and
widens it to float32 in an ATen step, which the fuser makes a kernel of its own when the next
step is a tactic (a max pooling): a pass over the convolution's whole output. Widening is exact
and monotone, so ``max_pool(float(y)) == float(max_pool(y))`` bit for bit (NaN included): where a
lowered generated max pooling (family ``maxpool``) is the only reader of such a cast, the pooling
reads ``y`` itself with the bfloat16 twin of its chosen kernel (same tiling: compiled here,
cached like any kernel, verified in the kernel sandbox before use) and the cast widens the
pooled values (a quarter of them for a 3x3/2 pool). The twin joins the step's candidates in the
manifest, untimed (its float32 sibling's timing chose the tiling).

resnet18's stem in a ``--precision bf16`` build: the 124 µs widening of ``[1, 64, 112, 112]`` and a
108 µs float32 pooling become a bfloat16 pooling and a widening of ``[1, 64, 56, 56]``
(docs/TACTICS.md "Max pooling").
"""

from __future__ import annotations

import dataclasses
import logging

import torch

from ascendc_pack.ir.program import AtenStep, ModelProgram, Ref, TacticStep, TensorSpec
from ascendc_pack.kernels import family
from ascendc_pack.kernels.pool import maxpool
from ascendc_pack.tactics.decide import TacticResult
from ascendc_pack.tactics.families.base import KernelTactic
from ascendc_pack.tactics.families.pool import POOL, PoolRunner, nhwc_strides
from ascendc_pack.toolchain.compiler import compile_kernels

log = logging.getLogger("ascendc_pack")

WIDEN = "aten._to_copy.default"


def widen_after_pools(model: ModelProgram, choices: dict, config) -> ModelProgram:
    """``model`` with every ``pool(_to_copy(y_bf16, float32))`` of a lowered generated max pooling
    rewritten as ``_to_copy(pool_bf16(y_bf16), float32)`` (top-level steps; a twin that does not
    compile or verify leaves its step as it was). ``choices``: the tuner's, by step name (the
    twin joins its step's candidates and the use's ``chosen_index``)."""
    p = model.program
    producer = {o: i for i, s in enumerate(p.steps) for o in s.outputs if o}
    readers: dict[str, int] = {}
    for s in p.steps:
        for n in s.input_names():
            readers[n] = readers.get(n, 0) + 1
    values, replaced, dropped = dict(p.values), {}, set()
    sandbox = None
    try:
        for i, s in enumerate(p.steps):
            cast_at = _widening(s, p, producer, readers)
            if cast_at is None:
                continue
            if sandbox is None:
                from ascendc_pack.backends.registry import get_backend

                sandbox = get_backend(config.backend).sandbox()
            ch = choices[s.name]
            chosen = next(t for t in ch.candidates if isinstance(t, KernelTactic)
                          and t.spec.name == s.chosen["kernel"] and t.candidate.kernel_key == s.chosen["kernel_key"])
            twin = _twin(chosen, config, sandbox)
            if twin is None:
                continue
            src = p.steps[cast_at].args[0].name
            replaced[i] = _rewritten(s, twin, src, values)
            dropped.add(cast_at)
            values.pop(s.bind["x"], None)
            _record(ch, s, replaced[i][0], twin)
    finally:
        if sandbox is not None:
            sandbox.close()
    if not replaced:
        return model
    steps = [r for i, s in enumerate(p.steps) if i not in dropped for r in replaced.get(i, [s])]
    return dataclasses.replace(model, program=dataclasses.replace(p, steps=steps, values=values))


def _widening(s, p, producer: dict, readers: dict) -> int | None:
    """The index of the bfloat16 -> float32 cast a lowered float32 ``maxpool`` step ``s`` alone
    reads (of NHWC memory), or None."""
    if not isinstance(s, TacticStep) or not s.chosen or s.chosen.get("family") != POOL.name \
            or s.chosen["spec"]["dtype"] != "float32":
        return None
    x = s.bind["x"]
    at = producer.get(x)
    cast = p.steps[at] if at is not None else None
    if not isinstance(cast, AtenStep) or cast.op != WIDEN or len(cast.args) != 1 or \
            not isinstance(cast.args[0], Ref) or readers.get(x) != 1 or x in p.outputs or \
            set(cast.kwargs) - {"dtype", "memory_format"} or cast.kwargs.get("dtype") != torch.float32:
        return None
    src = p.values.get(cast.args[0].name)
    if src is None or src.dtype != "bfloat16" or src.stride is None or \
            tuple(src.stride) != nhwc_strides(src.shape):
        return None
    return at


def _twin(t: KernelTactic, config, sandbox) -> KernelTactic | None:
    """The bfloat16 kernel of ``t``'s spec and tiling, compiled and verified on random input."""
    spec = dataclasses.replace(t.spec, name=f"{t.spec.name}_bf16", dtype="bfloat16")
    tiling = maxpool.MaxPoolTiling.parse(t.candidate.tiling_repr)
    build = family.plan(maxpool.GENERATOR, spec, config, tilings=[tiling])
    cc = compile_kernels([build.build], config)[0].candidates[0]
    if not cc.ok:
        log.warning("max pool %s: the bfloat16 twin did not compile; the pooling reads float32", spec.name)
        return None
    twin = KernelTactic(POOL.name, t.kind, spec, cc.candidate, str(cc.so_path), t.rank, {"reads": "bfloat16"})
    g = torch.Generator().manual_seed(0)
    x = torch.randn(spec.n, spec.h, spec.w, spec.c, generator=g).bfloat16().permute(0, 3, 1, 2)
    bad = PoolRunner(twin, {"x": x}).verify(maxpool.eager_reference(spec, x), None, sandbox, 10.0)
    if bad is not None:
        log.warning("max pool %s: the bfloat16 twin failed verification (%s); the pooling reads float32",
                    spec.name, bad["detail"])
        return None
    return twin


def _rewritten(s: TacticStep, twin: KernelTactic, src: str, values: dict) -> list:
    """The twin's step reading ``src`` into a new bfloat16 value, then the widening to ``s``'s output."""
    out = s.outputs[0]
    pooled = f"{out}__bf16"
    shape = twin.spec.out_shape
    values[pooled] = TensorSpec(shape, "bfloat16", nhwc_strides(shape))
    ref = [dataclasses.replace(a, args=[Ref(src)] + list(a.args[1:]), outputs=[pooled] + list(a.outputs[1:]))
           for a in s.steps]
    pool = dataclasses.replace(s, bind={"x": src}, outputs=[pooled], steps=ref, chosen=twin.lowered(),
                               values={"out": values[pooled]})
    return [pool, AtenStep(WIDEN, [Ref(pooled)], {"dtype": torch.float32}, [out])]


def _record(ch, s: TacticStep, pool: TacticStep, twin: KernelTactic) -> None:
    """The twin as one more (untimed) candidate of the step's choice, chosen by the use that was
    ``s`` and is ``pool`` now."""
    ch.candidates.append(twin)
    ch.results.append(TacticResult(len(ch.results), twin.key, twin.name, values=dict(pool.values)))
    for u in ch.uses:
        if list(u["outputs"]) == list(s.outputs):
            u.update(chosen_index=len(ch.candidates) - 1, outputs=list(pool.outputs), inputs=[pool.bind["x"]])


__all__ = ["widen_after_pools"]
