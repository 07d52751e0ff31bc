"""What a build says about its tactic steps: the summary table, the manifest entries and the
``tuning.json`` records (from :class:`~ascendc_pack.tactics.tune.TacticChoice`)."""

from __future__ import annotations

from ascendc_pack_runtime import manifest as contract

from ascendc_pack.ir.candidate import Candidate
from ascendc_pack.ir.choice import unstable_footnote
from ascendc_pack.ir.program import Program
from ascendc_pack.tactics.dispatch.lowp import precision_of
from ascendc_pack.tactics.families.registry import DISPATCH, lowered_family


def _fmt(us: float | None) -> str:
    from ascendc_pack.ir.choice import format_us

    return f"{format_us(us):>10}" if us is not None else f"{'-':>10}"


def tactic_table(choices: dict) -> str:
    """Per tactic step: kind, candidates, the chosen one (per use when they differ), its time,
    the as-captured candidate's (ATen), the speedup and whether a run reached it (``checked``:
    verified untimed, ``--topn 1``; ``synthetic``: verified on synthetic arguments)."""
    head = f"{'tactic step':<44} {'cands':>5} {'chosen':>14} {'chosen':>10} {'aten':>10} {'speedup':>8} visited"
    lines = [head, "-" * len(head)]
    for name, ch in choices.items():
        picks = sorted({u["chosen_index"] for u in ch.uses}) or [ch.captured]
        label = ",".join(f"{i}:{ch.candidates[i].name}" for i in picks)
        best = ch.results[picks[0]].median_us
        c0 = ch.results[ch.captured].median_us
        speed = f"{c0 / best:.2f}x" if best and c0 else "-"
        if ch.quality is not None and not ch.quality.stable:
            speed += "?"
        uses = f" x{len(ch.uses)}" if len(ch.uses) > 1 else ""
        how = {"checked": " (checked)", "synthetic": " (synthetic)"}.get(_how(ch), "")
        lines.append(f"{(name + uses)[:44]:<44} {len(ch.candidates):>5} {label[:14]:>14} {_fmt(best)} {_fmt(c0)} "
                     f"{speed:>8} {'yes' if ch.visited else 'no'}{how}")
    note = unstable_footnote([ch.quality for ch in choices.values()], "tactic step")
    return "\n".join(lines + ([note] if note else []))


def _how(ch) -> str:
    from ascendc_pack.tactics.decide import verified_on

    return verified_on(ch)


def manifest_tactics(choices: dict) -> tuple[contract.TacticStep, ...]:
    """The manifest's ``tactics`` entries (one per distinct tactic step, in program order)."""
    out = []
    for name, ch in choices.items():
        cands = tuple(contract.TacticCandidate(i, r.key, r.name, r.median_us, r.error is not None,
                                               r.disqualified is not None, precision_of(t))
                      for i, (r, t) in enumerate(zip(ch.results, ch.candidates)))
        chosen = ch.chosen_index
        uses = tuple({"inputs": list(u["inputs"]), "outputs": list(u["outputs"]), "chosen_index": u["chosen_index"],
                      "chain": u["chain"]} for u in ch.uses)
        out.append(contract.TacticStep(name, ch.kind, chosen, ch.candidates[chosen].key, bool(ch.visited),
                                       cands, uses))
    return tuple(out)


def tuning_tactics(choices: dict, sanitize) -> list[dict]:
    """``tuning.json``'s ``tactics``: every candidate with its tactic, samples and verdict."""
    out = []
    for ch in choices.values():
        d = ch.to_json()
        for c in d["candidates"]:
            if c.get("error"):
                c["error"] = sanitize(c["error"])
        out.append(d)
    return out


def kernel_libraries(program: Program, choices: dict) -> dict[str, dict]:
    """Every generated kernel (GEMM, convolution, attention) a lowered tactic step launches, by kernel
    name: its chosen ``candidate``, ``so_path`` (build cache), ``n_inputs``, ``visited``,
    ``chosen_index`` and ``candidates`` among the kernel's own tilings (``manifest.kernels``
    entries), and ``uses``."""
    out: dict[str, dict] = {}
    for ts in program.tactic_steps():
        g = ts.chosen
        if not g or lowered_family(g) == DISPATCH:
            continue
        entry = out.get(g["kernel"])
        if entry is None:
            ch = choices[ts.name]
            own = [(i, t) for i, t in enumerate(ch.candidates)
                   if t.family != DISPATCH and t.spec.name == g["kernel"]]
            chosen = next(t for _, t in own if t.candidate.kernel_key == g["kernel_key"])
            cands = tuple(contract.Candidate(j, t.candidate.kernel_key, t.candidate.tiling_repr, t.candidate.workspace,
                                             t.candidate.block_dim, ch.results[i].median_us,
                                             ch.results[i].error is not None) for j, (i, t) in enumerate(own))
            entry = out[g["kernel"]] = {
                "candidate": Candidate(g["tiling_repr"], g["workspace"], g["block_dim"]), "so_path": g["so_path"],
                "n_inputs": chosen.spec.n_inputs, "visited": ch.visited,
                "chosen_index": next(j for j, (_, t) in enumerate(own) if t.candidate.kernel_key == g["kernel_key"]),
                "candidates": cands, "uses": []}
        entry["uses"].append({"inputs": list(dict.fromkeys(ts.bind.values())), "outputs": list(ts.outputs)})
    return out
