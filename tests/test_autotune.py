"""PGO selection logic with an injected fake timer, and for real on CPU kernels."""

from __future__ import annotations

import itertools

import pytest

from ascendc_pack.autotune import AutotuneError, CandidateFailed, Protocol, select

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
