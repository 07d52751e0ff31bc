"""Build progress reporting: plain lines off a terminal, redrawn bars on one; per-stage seconds."""

from __future__ import annotations

import io
import threading
import time

import pytest

from ascendc_pack.progress import Progress


class Tty(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_plain_lines_at_start_every_tenth_and_end():
    out = io.StringIO()
    p = Progress(out, heartbeat_s=1000)
    with p.stage("compile", total=20) as st:
        for _ in range(20):
            st.advance()
    lines = out.getvalue().splitlines()
    assert lines[0] == "compile 0/20 ..."
    assert [ln.split()[1] for ln in lines[1:-1]] == [f"{2 * k}/20" for k in range(1, 11)]
    assert lines[-1].startswith("compile 20/20 done in ") and lines[-1].endswith(" s")
    assert "\r" not in out.getvalue() and p.seconds["compile"] >= 0


def test_plain_heartbeat_for_a_stage_without_a_count():
    out = io.StringIO()
    p = Progress(out, heartbeat_s=0.05)
    with p.stage("graph_compile"):
        time.sleep(1.3)  # the ticker looks every min(1 s, heartbeat)
    lines = out.getvalue().splitlines()
    assert lines[0] == "graph compile ..." and lines[-1].startswith("graph compile done in")
    assert any(ln.startswith("graph compile ... ") and ln.endswith(" s") for ln in lines[1:-1])


def test_terminal_bars_and_spinner_are_redrawn_in_place():
    out = Tty()
    p = Progress(out, refresh_s=0.01)
    assert p.interactive
    with p.stage("tune", total=4) as st:
        st.advance(2)
    with p.stage("graph_compile"):
        time.sleep(0.1)
    text = out.getvalue()
    assert "\r\x1b[K" in text and "[" + "#" * 12 + "-" * 12 + "]" in text and "2/4" in text
    assert any(ch in text for ch in "|/-\\")
    assert text.count("\n") == 2 and "tune 2/4 done in" in text and "graph compile done in" in text


@pytest.mark.parametrize("exc, word", [(KeyboardInterrupt, "interrupted"), (RuntimeError, "failed")])
def test_a_stage_that_stops_says_so_and_is_still_timed(exc, word):
    out = io.StringIO()
    p = Progress(out)
    with pytest.raises(exc):
        with p.stage("compile", total=3) as st:
            st.advance()
            raise exc()
    assert out.getvalue().splitlines()[-1].startswith(f"compile 1/3 {word} in ")
    assert "compile" in p.seconds


def test_disabled_progress_is_silent_but_times_stages():
    out = Tty()
    p = Progress(out, enabled=False)
    with p.stage("capture"):
        pass
    with p.stage("capture"):
        pass
    assert out.getvalue() == "" and set(p.seconds) == {"capture"}


def test_advance_from_many_threads():
    p = Progress(io.StringIO())
    with p.stage("compile", total=1000) as st:
        threads = [threading.Thread(target=lambda: [st.advance() for _ in range(250)]) for _ in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    assert st.done == 1000
