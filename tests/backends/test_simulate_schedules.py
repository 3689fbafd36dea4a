"""The simulator times and sizes every schedule: on synthetic equal stages its
bubble and peak activations match the closed forms of issue #27's table within 2 %.

p meshes, m micro-batches, v stages per mesh; T_F, T_B, T_W the times of one
micro-batch on a whole mesh (each of its v stages takes 1/v of them), M_B one
micro-batch's activations on a whole mesh. The bubble is the iteration time
minus a mesh's busy time, m (T_F + T_B + T_W)."""

from __future__ import annotations

import pytest

from alpa_ir.backends.simulate import SimPlan, SimStage, simulate

CASES = [(4, 8), (4, 32), (8, 32), (8, 64)]


def _run(schedule: str, p: int, m: int, v: int, f: float, b: float, w: float):
    stage = SimStage(f / v, b / v, activation_memory=1.0 / v, backward_weight=w / v)
    plan = SimPlan((stage,) * (p * v), m, schedule, virtual_stages=v)
    result = simulate(plan)
    bubble = result.iteration_time - m * (f + b + w)
    return bubble, max(result.peak_memory), result


def _bubble_and_peak(schedule: str, p: int, m: int, v: int, f: float, b: float, w: float):
    """The closed forms of the issue's table."""
    full = f + b + w
    return {
        "gpipe": ((p - 1) * full, m),
        "1f1b": ((p - 1) * full, p),
        "interleaved-1f1b": ((p - 1) * full / v, p * (1 + (p - 1) / (p * v))),
        "zb-h1": ((p - 1) * (f + b - w), p),
        # "≈ 0": what remains is the warm-up no order avoids, the last mesh waits
        # for p − 1 chunk forwards before its first task
        "zb-v": ((p - 1) * f / v, p),
    }[schedule]


@pytest.mark.parametrize(("p", "m"), CASES)
@pytest.mark.parametrize(
    ("schedule", "v"),
    [("gpipe", 1), ("1f1b", 1), ("interleaved-1f1b", 2), ("interleaved-1f1b", 4),
     ("zb-h1", 1), ("zb-v", 2)],
)  # fmt: skip
def test_bubble_and_peak_match_the_closed_forms(schedule: str, v: int, p: int, m: int) -> None:
    bubble, peak, _ = _run(schedule, p, m, v, 1.0, 1.0, 1.0)
    want_bubble, want_peak = _bubble_and_peak(schedule, p, m, v, 1.0, 1.0, 1.0)
    assert bubble == pytest.approx(want_bubble, rel=0.02, abs=1e-9)
    assert peak == pytest.approx(want_peak, rel=0.02)


@pytest.mark.parametrize(("p", "m"), [(5, 32), (3, 32), (5, 7), (8, 36)])
@pytest.mark.parametrize("v", [2, 3])
def test_interleaved_reaches_its_bubble_when_the_meshes_do_not_divide_the_micro_batches(
    p: int, m: int, v: int
) -> None:
    """Micro-batches in groups of g (the smallest divisor of m from p on): the
    bubble is still (p−1)(T_F+T_B+T_W)/v; the warm-up holds g − p more
    micro-batches of the first v − 1 chunks than the closed form's peak."""
    bubble, peak, _ = _run("interleaved-1f1b", p, m, v, 1.0, 1.0, 1.0)
    want_bubble, want_peak = _bubble_and_peak("interleaved-1f1b", p, m, v, 1.0, 1.0, 1.0)
    group = {(5, 32): 8, (3, 32): 4, (5, 7): 7, (8, 36): 9}[p, m]
    assert bubble == pytest.approx(want_bubble, rel=0.02, abs=1e-9)
    assert peak == pytest.approx(min(want_peak + (group - p) * (v - 1) / v, m), rel=0.02)


@pytest.mark.parametrize(("f", "b", "w"), [(1.0, 1.5, 1.0), (2.0, 1.0, 1.0), (1.0, 1.0, 0.5)])
def test_zb_h1_bubble_follows_the_weight_time(f: float, b: float, w: float) -> None:
    """ZB-H1 hides W in the bubble: (p−1)(T_F + T_B − T_W), also when T_F, T_B and
    T_W differ (T_W ≤ T_F here: with a larger T_W no order reaches the closed form,
    stage 0 alone waits (p−1)·T_B for its first B)."""
    p, m = 4, 16
    bubble, _, _ = _run("zb-h1", p, m, 1, f, b, w)
    assert bubble == pytest.approx((p - 1) * (f + b - w), rel=0.02)


def test_zero_bubble_schedules_beat_1f1b_at_equal_memory() -> None:
    """The point of the schedules: at 1F1B's peak, ZB-H1 and ZB-V are faster."""
    p, m = 8, 32
    base, base_peak, _ = _run("1f1b", p, m, 1, 1.0, 1.0, 1.0)
    for schedule, v in (("zb-h1", 1), ("zb-v", 2)):
        bubble, peak, _ = _run(schedule, p, m, v, 1.0, 1.0, 1.0)
        assert bubble < base / 2
        assert peak <= base_peak
