"""Explicit pipe ordering of generated kernels: ``PipeBarrier<PIPE_V>()`` where vector
instructions depend on each other.

On NPU architecture 2201 (Atlas A2/A3) dependent instructions of the Vector pipe are not ordered
by the hardware, and the TPipe/TQue framework inserts only the cross-pipe synchronisation of
EnQue/DeQue (AscendC API reference, PipeBarrier(ISASI): "Mul reads what Add wrote: insert
PipeBarrier<PIPE_V>()"). CANN's build files compile with ``--cce-auto-sync`` so the compiler
inserts them; the generated kernels do not rely on it: :func:`insert_barriers` writes a barrier
before every vector instruction that reads or overwrites a UB tensor a vector instruction since
the last barrier wrote, or overwrites one it read. The emulation, which runs with auto-sync off,
aborts on any vector dependency without a barrier (docs/ASCENDC_EMU.md), so every emulated
candidate checks this pass.

Operands are compared by name and slot (``work_[2 * TILE]`` and ``work_[3 * TILE]`` are disjoint
work slots, ``rowv_`` without a subscript is the whole buffer). Conservative where it cannot see:
every function starts with a barrier before its first vector instruction, and any block boundary
(``{``/``}``: branches, loops), call of a member function or scalar read (``SyncVS()`` drains the
pipe) resets the state.
"""

from __future__ import annotations

import re

from ascendc_pack.backends.npu.api import split_top

BARRIER = "PipeBarrier<PIPE_V>();"
VECTOR = {"Add", "Sub", "Mul", "Div", "Max", "Min", "Adds", "Muls", "Maxs", "Mins", "Exp", "Ln", "Abs", "Sqrt",
          "Rsqrt", "Reciprocal", "Relu", "Cast", "Compare", "Compares", "CompareScalar", "@CMPS@", "Select",
          "Duplicate", "ReduceSum", "ReduceMax", "ReduceMin", "DataCopy"}
"""Instructions of the V pipe the generator writes (a UB->UB DataCopy runs on the V pipe too)."""
TEMP_ARG = {"ReduceSum": 2, "ReduceMax": 2, "ReduceMin": 2}
"""Argument index of a sharedTmpBuffer (read and written)."""
NEUTRAL = {"Pad64", "DataCopyPad", "SetFlag", "WaitFlag", "PipeBarrier", "KERNEL_TASK_TYPE_DEFAULT"}
"""Calls that issue nothing on the V pipe (scalar helpers, MTE copies, flags)."""
DRAIN = {"SyncVS"}
TENSOR = re.compile(r"^\(?\s*(work_|acc_|rowv_|rowTmp_|redWork_|guard_|half_|ones_|pinf_|ninf_|mask\d+_|inT|outT|t)"
                    r"\b(?:\s*\[([^\]]*)\])?")
CALL = re.compile(r"^\s*([A-Za-z_@][\w@]*)\s*(?:<[^;]*?>)?\s*\((.*)\)\s*;\s*$")


def _key(expr: str) -> tuple[str, str] | None:
    m = TENSOR.match(expr.strip())
    return None if m is None else (m.group(1), (m.group(2) or "").replace(" ", ""))


def _overlap(a: tuple[str, str], b: tuple[str, str]) -> bool:
    return a[0] == b[0] and (not a[1] or not b[1] or a[1] == b[1])


def _statements(line: str) -> list[str]:
    """``a; b;`` on one line -> two lines with the line's indentation (top-level ';' only)."""
    indent = line[:len(line) - len(line.lstrip())]
    parts = split_top(line.strip(), ";", keep=True)
    return [indent + p for p in parts] if len(parts) > 1 and "for (" not in line else [line]


def insert_barriers(body: list[str]) -> list[str]:
    """``body`` with ``PipeBarrier<PIPE_V>();`` before every dependent vector instruction."""
    out: list[str] = []
    writes: list[tuple[str, str]] = []
    reads: list[tuple[str, str]] = []
    dirty = True  # the caller's vector instructions may still be in flight
    for raw in body:
        for line in _statements(raw):
            s = line.strip()
            if "{" in s or "}" in s:
                dirty = True
                out.append(line)
                continue
            m = CALL.match(s)
            name = m.group(1) if m else None
            if name in DRAIN:
                writes, reads, dirty = [], [], False
                out.append(line)
                continue
            if name is None or name not in VECTOR:
                if name is not None and name not in NEUTRAL:
                    dirty = True  # a member function: whatever it issued may be in flight
                out.append(line)
                continue
            args = [_key(a) for a in split_top(m.group(2))]
            dst, srcs = args[0], [a for a in args[1:] if a is not None]
            tmp = args[TEMP_ARG[name]] if name in TEMP_ARG and len(args) > TEMP_ARG[name] else None
            new_w = [k for k in (dst, tmp) if k is not None]
            conflict = dirty or any(_overlap(r, w) for r in srcs for w in writes) \
                or any(_overlap(n, o) for n in new_w for o in writes + reads)
            if conflict:
                out.append(line[:len(line) - len(line.lstrip())] + BARRIER)
                writes, reads, dirty = [], [], False
            writes += new_w
            reads += srcs
            out.append(line)
    return out
