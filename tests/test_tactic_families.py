"""The tactic family interface (docs/DESIGN.md §6.2): a family defined here, in the test suite,
registered at run time, planned, compiled, verified, timed, lowered, launched from graph.cpp and
bundled - without a line of shipped code knowing it."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from dataclasses import asdict, dataclass

import pytest
import torch

import ascendc_pack_runtime as rt
from ascendc_pack.autotune.protocol import Protocol
from ascendc_pack.autotune.verify import verify_in_sandbox
from ascendc_pack.cache import stable_hash
from ascendc_pack.ir.candidate import Candidate
from ascendc_pack.ir.program import TacticStep, TensorSpec
from ascendc_pack.pipeline import build
from ascendc_pack.tactics.families import registry
from ascendc_pack.tactics.families.base import KernelFamily, KernelTactic
from ascendc_pack.tactics.tune import TacticTuner
from ascendc_pack.toolchain.compiler import CandidateSource, KernelBuild
from ascendc_pack_runtime.kernels import KernelLibrary

FAST = Protocol(warmup=1, min_rounds=2, max_rounds=3, time_cap_s=0.05, min_sample_us=20.0)

TOY_SOURCE = r"""
#include "ascendc_pack/kernel_abi.h"
// a naive y[m, n] = x[m, k] @ w[n, k]^T, loop order {order}
static const ap_kernel_info kInfo = {{AP_KERNEL_ABI_VERSION, "{name}", "{key}", "{tiling}", 0, 1, "", 2, 1}};
extern "C" const ap_kernel_info *ap_kernel_describe(void) {{ return &kInfo; }}
extern "C" int ap_kernel_launch(void *const *in, void *const *out, void *ws, int max_threads) {{
  const float *x = (const float *)in[0], *w = (const float *)in[1];
  float *y = (float *)out[0];
  for (int a = 0; a < {outer}; ++a)
    for (int b = 0; b < {inner}; ++b) {{
      const int i = {i}, j = {j};
      float acc = 0.0f;
      for (int p = 0; p < {k}; ++p) acc += x[i * {k} + p] * w[j * {k} + p];
      y[i * {n} + j] = acc;
    }}
  return 0;
}}
"""


@dataclass(frozen=True)
class ToySpec:
    name: str
    m: int
    n: int
    k: int
    n_inputs = 2

    def to_json(self) -> dict:
        return asdict(self)

    @staticmethod
    def from_json(d: dict) -> ToySpec:
        return ToySpec(**d)


@dataclass
class ToyBuild:
    spec: ToySpec
    candidates: list
    build: KernelBuild


class ToyLinear(KernelFamily):
    """Bias-free float32 linear steps as a naive kernel, in two loop orders (two candidates)."""

    name = "toy_linear"
    kinds = ("linear",)
    graph = "generic"

    def spec_of(self, step: TacticStep, values: dict):
        d, epi = step.desc, step.desc["epilogue"]
        if d["dtype"] != "float32" or d["bias"] or d["weight_layout"] != "nk" or any(epi.values()):
            return None
        return ToySpec(f"toy_{step.name}", d["m"], d["n"], d["k"])

    def spec_from_json(self, d: dict) -> ToySpec:
        return ToySpec.from_json(d)

    def plan(self, spec: ToySpec, config, target) -> ToyBuild:
        sources = []
        for order in ("ij", "ji")[:config.topn]:
            cand = Candidate(f"order={order}", 0, 1)
            outer, inner = (spec.m, spec.n) if order == "ij" else (spec.n, spec.m)
            sources.append(CandidateSource(cand, TOY_SOURCE.format(
                order=order, name=spec.name, key=cand.kernel_key, tiling=cand.tiling_repr, outer=outer, inner=inner,
                i="a" if order == "ij" else "b", j="b" if order == "ij" else "a", k=spec.k, n=spec.n)))
        ahash = stable_hash("toy-v1", json.dumps(spec.to_json()), TOY_SOURCE)[:16]
        return ToyBuild(spec, [s.candidate for s in sources], KernelBuild(spec.name, ahash, sources))

    def runner(self, t: KernelTactic, named: dict, pool=None):
        return ToyRunner(t, named)

    def lowered_runner(self, t: KernelTactic, named: dict):
        def run(named: dict) -> torch.Tensor:
            r = ToyRunner(t, named)
            return r()
        return run

    def input_layouts(self, chosen: dict) -> dict:
        s = chosen["spec"]
        return {"x": ((s["m"], s["k"]), (s["k"], 1), "float32"), "weight": ((s["n"], s["k"]), (s["k"], 1), "float32")}

    def output_layout(self, chosen: dict) -> tuple:
        s = chosen["spec"]
        return (s["m"], s["n"]), (s["n"], 1), "float32"


class ToyRunner:
    def __init__(self, t: KernelTactic, named: dict):
        s = t.spec
        self.t = t
        self.ins = [named["x"].reshape(s.m, s.k).contiguous(), named["weight"].contiguous()]
        self.out = torch.empty(s.m, s.n)
        self._launch = KernelLibrary(t.so_path, t.candidate.kernel_key).bind(self.ins, [self.out])

    def __call__(self) -> torch.Tensor:
        assert self._launch() == 0
        return self.out

    def verify(self, expected, ref64, sandbox, timeout_s: float):
        s = self.t.spec
        return verify_in_sandbox(sandbox, self.t.so_path, 0, self.ins, ((s.m, s.n), torch.float32), timeout_s,
                                 expected, ref64, lambda x: x.reshape(s.m, s.n))

    def values(self) -> dict:
        return {"out": TensorSpec.of(self.out)}


class Mlp(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.a = torch.nn.Linear(16, 24, bias=False)
        self.b = torch.nn.Linear(24, 8)   # a bias: the toy family does not take it

    def forward(self, x):
        return torch.relu(self.b(self.a(x)))


@pytest.fixture
def toy_family():
    registry.register(ToyLinear())
    yield
    registry.unregister("toy_linear")


def test_a_family_registered_from_the_test_suite_builds_and_runs_in_a_fresh_process(tmp_path, toy_family,
                                                                                       monkeypatch):
    real = TacticTuner.decisions

    def prefer_toy(self):   # the toy kernel wherever it is a verified candidate (PGO may prefer oneDNN)
        out = real(self)
        for s in self.instances:
            ch = self.choices[s.name]
            toy = [i for i, (t, r) in enumerate(zip(ch.candidates, ch.results)) if t.family == "toy_linear" and r.ok]
            if toy:
                out[id(s)] = toy[0]
        return self.record_uses(out)

    monkeypatch.setattr(TacticTuner, "decisions", prefer_toy)
    torch.manual_seed(0)
    model, x = Mlp().eval(), torch.randn(2, 5, 16)
    out = tmp_path / "toy.ascpack"
    res = build(model, (x,), topn=3, output=out, cache_dir=tmp_path / "cache", protocol=FAST)
    (toy_step,) = [ch for ch in res.tactics.values() if any(t.family == "toy_linear" for t in ch.candidates)]
    toys = [(t, r) for t, r in zip(toy_step.candidates, toy_step.results) if t.family == "toy_linear"]
    assert [t.name for t, _ in toys] == ["toy_linear#0", "toy_linear#1"]
    assert all(r.ok and r.median_us is not None for _, r in toys)    # verified, then timed
    assert toy_step.candidates[toy_step.chosen_index].family == "toy_linear"
    manifest = rt.read_manifest(out)
    assert any(k.name.startswith("toy_") for k in manifest.kernels)  # a bundle member, launched by graph.so
    data = tmp_path / "io.pt"
    torch.save((x, model(x)), data)
    script = textwrap.dedent("""
        import sys, torch, ascendc_pack_runtime as rt
        x, expected = torch.load(sys.argv[2])
        assert torch.allclose(rt.load(sys.argv[1])(x), expected, atol=1e-5), "mismatch"
        print("ok")
    """)
    run = subprocess.run([sys.executable, "-c", script, str(out), str(data)], capture_output=True, text=True,
                         timeout=300)
    assert run.stdout.strip() == "ok", run.stderr[-2000:]


def test_the_registry_refuses_a_taken_name_and_names_the_known_ones(toy_family):
    with pytest.raises(ValueError, match="already registered"):
        registry.register(ToyLinear())
    with pytest.raises(ValueError, match="already registered"):
        registry.register(type("Gemm", (ToyLinear,), {"name": "gemm"})())
    with pytest.raises(KeyError, match="unknown tactic family 'nope'.*gemm.*toy_linear"):
        registry.family("nope")
    assert registry.names()[-1] == "toy_linear" and registry.names()[0] == "gemm"


def test_every_shipped_family_implements_the_interface():
    for fam in registry.families():
        assert isinstance(fam, KernelFamily) and fam.name and fam.kinds
        assert fam.graph in ("gemm", "conv", "generic")
        for hook in ("spec_of", "spec_from_json", "plan", "runner", "lowered_runner"):
            assert getattr(type(fam), hook) is not getattr(KernelFamily, hook), (fam.name, hook)
