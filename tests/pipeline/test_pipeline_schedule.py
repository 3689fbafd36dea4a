"""Pipeline schedules: clock count, each task once, dependency order, the 1F1B
in-flight bound, GPipe's all-forwards-first, and the checker's rejections."""

from __future__ import annotations

from collections.abc import Callable

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from alpa_ir.errors import AlpaError
from alpa_ir.pipeline.schedule import (
    SCHEDULE_KINDS,
    ScheduleKind,
    Task,
    check_schedule,
    in_flight,
    peak_in_flight,
    schedule_clocks,
    task_clocks,
)

stages = st.integers(1, 6)
micro_batches = st.integers(1, 8)
kinds = st.sampled_from(SCHEDULE_KINDS)


@settings(max_examples=150, deadline=None)
@given(num_stages=stages, num_mb=micro_batches, kind=kinds)
def test_clock_count_and_each_task_once(num_stages: int, num_mb: int, kind: ScheduleKind) -> None:
    clocks = schedule_clocks(num_stages, num_mb, kind)
    assert len(clocks) == 2 * (num_stages + num_mb - 1) + 1
    tasks = [t for clock in clocks for t in clock]
    for s in range(num_stages):
        for phase in ("forward", "backward"):
            got = sorted(t.micro_batch for t in tasks if t.stage == s and t.phase == phase)
            assert got == list(range(num_mb))
        assert [t for t in tasks if t.stage == s and t.phase == "apply_grad"] == [
            Task(s, None, "apply_grad")
        ]
    assert {t.stage for t in clocks[-1]} == set(range(num_stages))
    assert all(t.phase == "apply_grad" for t in clocks[-1])
    for clock in clocks:
        assert len({t.stage for t in clock}) == len(clock), "a stage runs two tasks in one clock"


@settings(max_examples=150, deadline=None)
@given(num_stages=stages, num_mb=micro_batches, kind=kinds)
def test_dependencies_in_earlier_clocks(num_stages: int, num_mb: int, kind: ScheduleKind) -> None:
    at = task_clocks(schedule_clocks(num_stages, num_mb, kind))
    for s in range(num_stages):
        for b in range(num_mb):
            fwd, bwd = at[Task(s, b, "forward")], at[Task(s, b, "backward")]
            assert fwd < bwd
            if s > 0:
                assert at[Task(s - 1, b, "forward")] < fwd
            if s + 1 < num_stages:
                assert at[Task(s + 1, b, "backward")] < bwd
            assert bwd < at[Task(s, None, "apply_grad")]


@settings(max_examples=150, deadline=None)
@given(num_stages=stages, num_mb=micro_batches)
def test_1f1b_in_flight_bound(num_stages: int, num_mb: int) -> None:
    clocks = schedule_clocks(num_stages, num_mb, "1f1b")
    for row in in_flight(clocks, num_stages):
        for s, n in enumerate(row):
            assert 0 <= n <= num_stages - s
    # the bound is reached: 1F1B keeps the pipeline full, no stage waits for memory
    assert peak_in_flight(clocks, num_stages) == [
        min(num_stages - s, num_mb) for s in range(num_stages)
    ]
    assert in_flight(clocks, num_stages)[-1] == [0] * num_stages


@settings(max_examples=150, deadline=None)
@given(num_stages=stages, num_mb=micro_batches)
def test_gpipe_runs_all_forwards_first(num_stages: int, num_mb: int) -> None:
    clocks = schedule_clocks(num_stages, num_mb, "gpipe")
    phases = [t.phase for clock in clocks for t in clock]
    last_forward = max(i for i, p in enumerate(phases) if p == "forward")
    first_backward = phases.index("backward")
    assert last_forward < first_backward
    # every stage holds all micro-batches before its first backward
    assert peak_in_flight(clocks, num_stages) == [num_mb] * num_stages


@settings(max_examples=100, deadline=None)
@given(num_stages=stages, num_mb=micro_batches, kind=kinds)
def test_checker_accepts_both_schedules(num_stages: int, num_mb: int, kind: ScheduleKind) -> None:
    check_schedule(schedule_clocks(num_stages, num_mb, kind), num_stages, num_mb)


def test_1f1b_two_stages_by_hand() -> None:
    clocks = schedule_clocks(2, 3, "1f1b")
    assert [[str(t) for t in c] for c in clocks] == [
        ["forward[0]@stage0"],
        ["forward[1]@stage0", "forward[0]@stage1"],
        ["backward[0]@stage1"],
        ["backward[0]@stage0", "forward[1]@stage1"],
        ["forward[2]@stage0", "backward[1]@stage1"],
        ["backward[1]@stage0", "forward[2]@stage1"],
        ["backward[2]@stage1"],
        ["backward[2]@stage0"],
        ["apply_grad@stage0", "apply_grad@stage1"],
    ]


def test_in_flight_counts_by_hand() -> None:
    clocks = [
        [Task(0, 0, "forward")],
        [Task(0, 1, "forward"), Task(1, 0, "forward")],
        [Task(1, 0, "backward")],
    ]
    assert in_flight(clocks, 2) == [[1, 0], [2, 1], [2, 0]]
    assert peak_in_flight(clocks, 2) == [2, 1]


def _swap(clocks: list[list[Task]], a: Task, b: Task) -> list[list[Task]]:
    swap = {a: b, b: a}
    return [[swap.get(t, t) for t in clock] for clock in clocks]


@pytest.mark.parametrize(
    ("mutate", "message"),
    [
        (lambda c: _swap(c, Task(0, 0, "forward"), Task(1, 0, "forward")), "runs two tasks"),
        (lambda c: _swap(c, Task(1, 0, "forward"), Task(1, 1, "forward")), "does not follow"),
        (lambda c: _swap(c, Task(0, 0, "backward"), Task(0, 1, "backward")), "does not follow"),
        (lambda c: [*c[:-1], c[-1][:1]], "misses"),
        (lambda c: [*c, [Task(0, None, "apply_grad")]], "runs twice"),
    ],
)
def test_checker_rejects_broken_schedules(
    mutate: Callable[[list[list[Task]]], list[list[Task]]], message: str
) -> None:
    clocks = mutate(schedule_clocks(2, 2, "gpipe"))
    with pytest.raises(AlpaError, match=message):
        check_schedule(clocks, 2, 2)


@pytest.mark.parametrize(
    ("args", "message"),
    [
        ((0, 2, "gpipe"), "at least 1 stage"),
        ((2, 0, "1f1b"), "at least 1 micro-batch"),
        ((2, 2, "zigzag"), "unknown schedule 'zigzag'"),
    ],
)
def test_bad_arguments(args: tuple[int, int, ScheduleKind], message: str) -> None:
    with pytest.raises(AlpaError, match=message):
        schedule_clocks(*args)
