"""Build progress: every stage reports, as a bar on a terminal and as plain lines otherwise.

:class:`Progress` times each stage (``seconds``, the build summary's per-stage times) and shows
it on ``stream`` (stderr by default):

* on a terminal, one redrawn line per stage: ``compile [#######-------]  12/24  3.1 s``, or for a
  stage without a count (graph compile) a spinner with the elapsed time, refreshed by a thread;
* otherwise (CI logs, pipes), plain lines: the start, a line at every 10 % of a counted stage
  (or ``heartbeat_s`` after the last line), a heartbeat for uncounted ones, and the end with
  the stage's seconds; an interrupted stage says so.

``enabled=False`` shows nothing and still times the stages (the Python API's default).
"""

from __future__ import annotations

import sys
import threading
import time
from contextlib import contextmanager
from typing import Callable, Iterator, TextIO

BAR_WIDTH = 24
_SPINNER = "|/-\\"


class Stage:
    """A running stage; :meth:`advance` may be called from any thread."""

    def __init__(self, progress: Progress, name: str, label: str, total: int | None):
        self.progress = progress
        self.name = name
        self.label = label
        self.total = total
        self.done = 0
        self.start = progress.clock()
        self._last_line = (0.0, -1)  # (time, decile) of the last plain line
        self.remark = ""

    def elapsed(self) -> float:
        return self.progress.clock() - self.start

    def note(self, remark: str) -> None:
        """A remark shown with the stage's final line (e.g. "reused from the capture cache")."""
        self.remark = remark

    def advance(self, n: int = 1) -> None:
        """Count ``n`` more units done (candidates compiled, kernels tuned)."""
        with self.progress.lock:
            self.done += n
            self.progress._show(self)


class Progress:
    """Stage timer and reporter of one build (see the module docstring).

    Args:
        stream: where to write (default ``sys.stderr``).
        enabled: False = time stages silently.
        interactive: bars (True) or plain lines (False); default: whether ``stream`` is a TTY.
        heartbeat_s: longest silence of a plain-mode stage.
    """

    def __init__(self, stream: TextIO | None = None, enabled: bool = True, interactive: bool | None = None,
                 heartbeat_s: float = 10.0, refresh_s: float = 0.1, clock: Callable[[], float] = time.monotonic):
        self.stream = stream if stream is not None else sys.stderr
        self.enabled = enabled
        if interactive is None:
            isatty = getattr(self.stream, "isatty", None)
            interactive = bool(isatty and isatty())
        self.interactive = interactive
        self.heartbeat_s = heartbeat_s
        self.refresh_s = refresh_s
        self.clock = clock
        self.lock = threading.Lock()
        self.seconds: dict[str, float] = {}

    @contextmanager
    def stage(self, name: str, total: int | None = None, label: str | None = None) -> Iterator[Stage]:
        """Run one stage: ``total`` units (a bar) or None (elapsed time only). Its seconds are
        added to ``seconds[name]`` whether it finishes, fails or is interrupted."""
        st = Stage(self, name, label or name.replace("_", " "), total)
        stop = threading.Event()
        ticker = None
        with self.lock:
            self._show(st, force=True)
        if self.enabled:
            ticker = threading.Thread(target=self._tick, args=(st, stop), daemon=True, name=f"ap-progress-{name}")
            ticker.start()
        outcome = "done"
        try:
            yield st
        except KeyboardInterrupt:
            outcome = "interrupted"
            raise
        except BaseException:
            outcome = "failed"
            raise
        finally:
            stop.set()
            if ticker is not None:
                ticker.join()
            self.seconds[name] = self.seconds.get(name, 0.0) + st.elapsed()
            with self.lock:
                self._end(st, outcome)

    # drawing ----------------------------------------------------------------------------------
    def _tick(self, st: Stage, stop: threading.Event) -> None:
        period = self.refresh_s if self.interactive else min(1.0, self.heartbeat_s)
        while not stop.wait(period):
            with self.lock:
                self._show(st)

    def _count(self, st: Stage) -> str:
        return f"{st.done}/{st.total}" if st.total is not None else ""

    def _show(self, st: Stage, force: bool = False) -> None:
        """Redraw the bar (terminal) or print a plain line when one is due; caller holds the lock."""
        if not self.enabled:
            return
        t = st.elapsed()
        if self.interactive:
            if st.total:
                filled = min(BAR_WIDTH, BAR_WIDTH * st.done // st.total)
                body = f"[{'#' * filled}{'-' * (BAR_WIDTH - filled)}] {self._count(st):>9}"
            elif st.total == 0:
                body = "nothing to do"
            else:
                body = _SPINNER[int(t / self.refresh_s) % len(_SPINNER)]
            self._write(f"\r\x1b[K{st.label:<22} {body}  {t:6.1f} s")
            return
        decile = 10 * st.done // st.total if st.total else 0
        last_t, last_decile = st._last_line
        if force or decile > last_decile or t - last_t >= self.heartbeat_s:
            st._last_line = (t, decile)
            count = f" {self._count(st)}" if st.total is not None else ""
            self._write(f"{st.label}{count} ... {t:.1f} s\n" if t >= 0.05 else f"{st.label}{count} ...\n")

    def _end(self, st: Stage, outcome: str) -> None:
        if not self.enabled:
            return
        count = f" {self._count(st)}" if st.total is not None else ""
        remark = f" ({st.remark})" if st.remark else ""
        line = f"{st.label}{count} {outcome} in {st.elapsed():.1f} s{remark}"
        self._write(f"\r\x1b[K{line}\n" if self.interactive else f"{line}\n")

    def _write(self, text: str) -> None:
        try:
            self.stream.write(text)
            self.stream.flush()
        except (OSError, ValueError):  # a closed stream must not break the build
            pass
