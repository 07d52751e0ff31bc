"""PGO selection logic with an injected fake timer, and for real on CPU kernels."""

from __future__ import annotations

import itertools
import subprocess
import sys
import time

import pytest

from ascendc_pack.autotune.protocol import (AutotuneError, CandidateFailed, Protocol, contended_wait, contention_clock,
                                   select)
from ascendc_pack.ir.candidate import Candidate
from ascendc_pack.ir.choice import CandidateResult, MeasurementQuality
from ascendc_pack.config import host_cores

FAST = Protocol(warmup=1, min_rounds=5, max_rounds=30, noise=0.02, time_cap_s=10.0, min_sample_us=0.0)


def fake(times_us: dict, fail: set = frozenset(), jitter=None):
    """A measure function returning scripted per-launch times (seconds for `number` launches)."""
    counter = itertools.count()
    calls = []

    def measure(i, number):
        calls.append(i)
        if i in fail:
            raise CandidateFailed("returned status 3")
        t = times_us[i] + (jitter(i, next(counter)) if jitter else 0.0)
        return t * number * 1e-6

    measure.calls = calls
    return measure


def test_picks_the_fastest():
    sel = select(3, fake({0: 30.0, 1: 10.0, 2: 20.0}), FAST)
    assert sel.best == 1
    assert sel.medians_us == pytest.approx([30.0, 10.0, 20.0])
    assert all(len(s) == sel.rounds for s in sel.samples_us)


def test_tie_keeps_lower_index():
    sel = select(3, fake({0: 20.0, 1: 10.0, 2: 10.0}), FAST)
    assert sel.best == 1


def test_failed_candidates_are_recorded_and_never_chosen():
    sel = select(3, fake({0: 1.0, 1: 50.0, 2: 40.0}, fail={0}), FAST)
    assert sel.best == 2
    assert "status 3" in sel.errors[0] and sel.medians_us[0] is None


def test_crash_is_a_failure_not_an_exception():
    def measure(i, number):
        if i == 1:
            raise RuntimeError("segv-like")
        return 1e-5 * number

    sel = select(2, measure, FAST)
    assert sel.best == 0 and "RuntimeError" in sel.errors[1]


def test_all_failed_is_a_clear_error():
    with pytest.raises(AutotuneError, match="every candidate failed"):
        select(2, fake({0: 1.0, 1: 1.0}, fail={0, 1}), FAST)


def test_noise_causes_more_rounds_and_a_clear_gap_stops_early():
    clear = select(2, fake({0: 10.0, 1: 20.0}), FAST)
    assert clear.rounds == FAST.min_rounds
    close = select(2, fake({0: 10.0, 1: 10.1}), FAST)
    assert close.rounds == FAST.max_rounds


def test_median_resists_outliers():
    spikes = lambda i, k: 500.0 if (i == 0 and k % 7 == 0) else 0.0  # noqa: E731
    sel = select(2, fake({0: 10.0, 1: 12.0}, jitter=spikes), FAST)
    assert sel.best == 0


def test_rounds_are_interleaved():
    m = fake({0: 10.0, 1: 20.0, 2: 30.0})
    select(3, m, FAST)
    timed = m.calls[3 * (FAST.warmup + 1):]  # after warm-up and calibration probes
    for k in range(0, len(timed), 3):  # every round runs every candidate once
        assert sorted(timed[k:k + 3]) == [0, 1, 2]
    assert timed[0] != timed[3]  # and the starting candidate rotates


def test_time_cap_stops_measuring():
    clock = itertools.count(0, 100)  # each clock read advances 100 s
    sel = select(2, fake({0: 10.0, 1: 10.0}), Protocol(warmup=1, min_rounds=3, max_rounds=1000, time_cap_s=1.0,
                                                         min_sample_us=0.0), clock=lambda: next(clock))
    assert sel.rounds == 3


def contended_fake(times_us: dict, contended):
    """A measure whose launches of candidate i at call n are twice as slow, with this process's
    threads preempted and waiting for a core half of that time, when ``contended(i, n)``; and its
    contention clock."""
    clock = [0.0, 0]
    counter = itertools.count()

    def measure(i, number):
        t = times_us[i] * number * 1e-6
        if contended(i, next(counter)):
            clock[0] += t
            clock[1] += 1
            t *= 2
        return t

    return measure, lambda: tuple(clock)


def test_contended_samples_are_taken_again():
    """Another process holding a core in every other sample of the 2-thread candidate made it look
    slower than the 1-thread one; re-taken samples keep the measurement clean."""
    times = {0: 100.0, 1: 120.0}
    measure, clock = contended_fake(times, lambda i, n: i == 0 and n % 2 == 1)
    sel = select(2, measure, FAST, contention=clock)
    assert sel.best == 0 and sel.medians_us[0] == pytest.approx(100.0)
    assert sel.retaken > 0 and sel.wait_share == 0.0
    blind = select(2, contended_fake(times, lambda i, n: i == 0 and n % 2 == 1)[0],
                   Protocol(warmup=0, min_rounds=6, max_rounds=6, min_sample_us=0.0))
    assert blind.medians_us[0] > 120.0 and blind.best == 1   # without the clock: the wrong choice


def test_persistent_contention_is_measured_and_flagged():
    measure, clock = contended_fake({0: 100.0, 1: 120.0}, lambda i, n: True)
    sel = select(2, measure, FAST, contention=clock)
    assert sel.wait_share == pytest.approx(0.5) and sel.retaken == 2 * sum(len(s) for s in sel.samples_us)
    results = [CandidateResult(Candidate(f"t={i}", 0, 1), m, s) for i, (m, s) in enumerate(zip(sel.medians_us,
                                                                                                sel.samples_us))]
    quality = MeasurementQuality.assess(results, sel.best, 0.5, 2, sel.wait_share)
    assert not quality.stable
    assert "threads waited for a core 50% of the time (another process held it)" in quality.describe()
    assert MeasurementQuality.from_json(quality.to_json()) == quality
    old_record = {"load": 0.5, "cores": 2, "spread": 0.01, "stable": True}   # written before wait_share
    assert MeasurementQuality.from_json(old_record).wait_share == 0.0


def test_no_contention_clock_measures_each_sample_once():
    measure, _ = contended_fake({0: 100.0, 1: 120.0}, lambda i, n: True)
    sel = select(2, measure, FAST)
    assert sel.retaken == 0 and sel.wait_share == 0.0


def test_short_launches_are_not_judged():
    """A few-µs 2-thread launch waits for its own woken thread; that is its cost, not a neighbour."""
    measure, clock = contended_fake({0: 10.0, 1: 12.0}, lambda i, n: True)
    sel = select(2, measure, FAST, contention=clock)
    assert sel.retaken == 0 and sel.wait_share == 0.0


def test_a_wait_without_a_preemption_is_not_contention():
    """A thread woken on an idle KVM vCPU waits for the hypervisor, not for another process."""
    assert contended_wait((1.0, 5), (1.5, 5)) == 0.0
    assert contended_wait((1.0, 5), (1.5, 6)) == pytest.approx(0.5)
    assert contended_wait(None, (1.5, 6)) == 0.0 == contended_wait((1.0, 5), None)


@pytest.mark.skipif(contention_clock() is None, reason="the kernel reports no run-queue wait (not Linux)")
def test_the_contention_clock_sees_cores_taken_by_other_processes():
    """For real: with one spinning process per core besides this one, this thread is preempted
    and waits for a core."""
    def busy(seconds):
        c0, t0 = contention_clock(), time.perf_counter()
        while time.perf_counter() - t0 < seconds:
            pass
        return contended_wait(c0, contention_clock()), time.perf_counter() - t0

    spinners = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(host_cores())]
    try:
        time.sleep(0.2)
        waited, wall = busy(0.6)
    finally:
        for p in spinners:
            p.kill()
            p.wait()
    assert waited > 0.1 * wall, (waited, wall)   # fair share: about a third of the time


def test_least_contended_stops_at_the_first_clean_sample():
    from ascendc_pack.autotune.protocol import least_contended

    samples = iter([(0.5, "a"), (0.01, "b"), (0.0, "c")])
    assert least_contended(lambda: next(samples), 2, 0.05) == ((0.01, "b"), 1)
    samples = iter([(0.5, "a"), (0.3, "b"), (0.4, "c")])
    assert least_contended(lambda: next(samples), 2, 0.05) == ((0.3, "b"), 2)
    assert least_contended(lambda: (0.0, "x"), 2, 0.05) == ((0.0, "x"), 0)
