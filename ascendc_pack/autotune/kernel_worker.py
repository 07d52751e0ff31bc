"""The launch worker of PGO verification: runs one candidate kernel per request, in its own process.

Started by :class:`ascendc_pack.autotune.verify.KernelSandbox` as ``python -I autotune/kernel_worker.py <parent pid>``
(isolated mode: no script directory on ``sys.path``, so nothing of ``ascendc_pack`` or torch is
imported; the standard library only, which keeps the start-up near 30 ms).

Protocol, one JSON object per line: the request names the kernel library (``so``), a shared file
(``file``, ``size`` bytes) holding the inputs and room for the outputs at the given byte offsets,
and the workspace size; the worker maps the file, calls ``ap_kernel_launch`` (kernel_abi.h) with
pointers into it and answers ``{"rc": <status>}``, or ``{"error": <text>}`` when the library
cannot be loaded. The outputs are read by the parent through its own mapping of the file. A
kernel that never returns is the parent's to stop: it kills this process after its timeout.
"""

import ctypes
import json
import mmap
import os
import sys

_PR_SET_PDEATHSIG = 1
_SIGKILL = 9


def _die_with_parent(parent_pid: int) -> None:
    """Linux: be killed when the build dies, so a hung kernel never outlives it."""
    try:
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, _SIGKILL, 0, 0, 0)
    except (OSError, AttributeError):
        pass
    if os.getppid() != parent_pid:  # the parent died before prctl took effect
        os._exit(1)


def _launcher(libs: dict, path: str):
    fn = libs.get(path)
    if fn is None:
        lib = ctypes.CDLL(path, mode=getattr(os, "RTLD_LOCAL", 0) | getattr(os, "RTLD_NOW", 0))
        fn = lib.ap_kernel_launch
        fn.restype = ctypes.c_int
        fn.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int32]
        libs[path] = fn
    return fn


def _launch(req: dict, libs: dict) -> int:
    fn = _launcher(libs, req["so"])
    with open(req["file"], "r+b") as f:
        mm = mmap.mmap(f.fileno(), req["size"])
    try:
        anchor = ctypes.c_char.from_buffer(mm)
        base = ctypes.addressof(anchor)
        ins = (ctypes.c_void_p * max(1, len(req["inputs"])))(*[base + o for o in req["inputs"]])
        outs = (ctypes.c_void_p * max(1, len(req["outputs"])))(*[base + o for o in req["outputs"]])
        ws = ctypes.create_string_buffer(req["workspace"]) if req["workspace"] else None
        rc = fn(ins, outs, ws, 0)
        del anchor
    finally:
        mm.close()
    return int(rc)


def main() -> None:
    _die_with_parent(int(sys.argv[1]))
    libs: dict = {}
    for line in sys.stdin:
        req = json.loads(line)
        try:
            reply = {"rc": _launch(req, libs)}
        except (OSError, AttributeError, ValueError) as exc:
            reply = {"error": f"{type(exc).__name__}: {exc}"}
        sys.stdout.write(json.dumps(reply) + "\n")
        sys.stdout.flush()


if __name__ == "__main__":
    main()
