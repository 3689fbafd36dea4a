"""Pipeline schedules (Alpa §6): which stage runs which task in each clock.

A schedule is a list of clocks; a clock is the list of :class:`Task` that run in
it, at most one per stage (each stage has its own mesh). With ``S`` stages and
``B`` micro-batches there are ``2 * (S + B - 1) + 1`` clocks: forward and
backward tasks take one clock each, and the last clock holds every stage's
apply-grad task (once per step, after all micro-batches).

- ``gpipe`` (GPipe): all forwards, then all backwards. Stage ``i`` runs
  ``forward b`` in clock ``i + b`` and ``backward b`` in clock
  ``(S + B - 1) + (S - 1 - i) + b``; a stage holds up to ``B`` micro-batches'
  activations.
- ``1f1b`` (synchronous 1F1B, PipeDream-Flush): stage ``i`` warms up with
  ``min(S - i, B)`` forwards in clocks ``i, i+1, ...``, then alternates one
  backward and one forward: ``backward b`` in clock ``2S - 1 - i + 2b`` and,
  for ``b >= S - i``, ``forward b`` in clock ``i + 2b`` (the clock after
  ``backward b - (S - i)``). At most ``S - i`` micro-batches are in flight on
  stage ``i`` (forward done, backward not yet), against ``B`` under GPipe, for
  the same number of clocks.

Both satisfy the dependencies a task has on other stages: ``forward (s, b)``
after ``forward (s-1, b)``, ``backward (s, b)`` after ``backward (s+1, b)`` and
after ``forward (s, b)``, each in an earlier clock. :func:`check_schedule`
verifies these, and :func:`in_flight` gives per clock the number of
micro-batches in flight on each stage (for tests and memory estimates).

Pure functions, no IR; ``emit-instructions`` turns a schedule into per-mesh
instruction lists.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from alpa_ir.errors import AlpaError

ScheduleKind = Literal["gpipe", "1f1b"]
Phase = Literal["forward", "backward", "backward_weight", "apply_grad"]
SCHEDULE_KINDS: tuple[ScheduleKind, ...] = ("gpipe", "1f1b")
PHASES: tuple[Phase, ...] = ("forward", "backward", "backward_weight", "apply_grad")


@dataclass(frozen=True)
class Task:
    """One unit of work of a stage: its forward or backward part for one
    micro-batch, or its apply-grad part (``micro_batch`` is None) once per step."""

    stage: int
    micro_batch: int | None
    phase: Phase

    def __str__(self) -> str:
        mb = "" if self.micro_batch is None else f"[{self.micro_batch}]"
        return f"{self.phase}{mb}@stage{self.stage}"


def num_clocks(num_stages: int, num_micro_batches: int) -> int:
    """Clocks of a schedule: ``2 * (S + B - 1)`` for forwards and backwards, +1 for apply-grad."""
    return 2 * (num_stages + num_micro_batches - 1) + 1


def _check_sizes(num_stages: int, num_micro_batches: int) -> None:
    if num_stages < 1:
        raise AlpaError(f"a pipeline schedule needs at least 1 stage, got {num_stages}")
    if num_micro_batches < 1:
        raise AlpaError(
            f"a pipeline schedule needs at least 1 micro-batch, got {num_micro_batches}"
        )


def _forward_clock(kind: ScheduleKind, stage: int, mb: int, num_stages: int) -> int:
    if kind == "gpipe" or mb < num_stages - stage:
        return stage + mb
    return stage + 2 * mb


def _backward_clock(
    kind: ScheduleKind, stage: int, mb: int, num_stages: int, num_micro_batches: int
) -> int:
    if kind == "gpipe":
        return (num_stages + num_micro_batches - 1) + (num_stages - 1 - stage) + mb
    return 2 * num_stages - 1 - stage + 2 * mb


def schedule_clocks(
    num_stages: int, num_micro_batches: int, kind: ScheduleKind
) -> list[list[Task]]:
    """The tasks of each clock, in stage order within a clock (see the module docstring)."""
    _check_sizes(num_stages, num_micro_batches)
    if kind not in SCHEDULE_KINDS:
        raise AlpaError(f"unknown schedule '{kind}'; expected one of {', '.join(SCHEDULE_KINDS)}")
    clocks: list[list[Task]] = [[] for _ in range(num_clocks(num_stages, num_micro_batches))]
    for stage in range(num_stages):
        for mb in range(num_micro_batches):
            clocks[_forward_clock(kind, stage, mb, num_stages)].append(Task(stage, mb, "forward"))
            clocks[_backward_clock(kind, stage, mb, num_stages, num_micro_batches)].append(
                Task(stage, mb, "backward")
            )
        clocks[-1].append(Task(stage, None, "apply_grad"))
    for clock in clocks:
        clock.sort(key=lambda t: t.stage)
    return clocks


def task_clocks(clocks: list[list[Task]]) -> dict[Task, int]:
    """The clock of each task."""
    return {task: c for c, tasks in enumerate(clocks) for task in tasks}


def check_schedule(clocks: list[list[Task]], num_stages: int, num_micro_batches: int) -> None:
    """Raise :class:`AlpaError` unless ``clocks`` runs every task exactly once, at most one
    task per stage and clock, in dependency order, with every apply-grad in the last clock."""
    seen: dict[Task, int] = {}
    for c, tasks in enumerate(clocks):
        stages = [t.stage for t in tasks]
        if len(set(stages)) != len(stages):
            raise AlpaError(f"clock {c} runs two tasks on one stage: {[str(t) for t in tasks]}")
        for t in tasks:
            if t in seen:
                raise AlpaError(f"{t} runs twice, in clocks {seen[t]} and {c}")
            seen[t] = c
    expected = {
        Task(s, b, p)
        for s in range(num_stages)
        for b in range(num_micro_batches)
        for p in ("forward", "backward")
    } | {Task(s, None, "apply_grad") for s in range(num_stages)}
    if set(seen) != expected:
        missing = sorted(map(str, expected - set(seen)))
        extra = sorted(map(str, set(seen) - expected))
        raise AlpaError(f"schedule misses {missing}, has extra {extra}")
    last = len(clocks) - 1
    for s in range(num_stages):
        if seen[Task(s, None, "apply_grad")] != last:
            raise AlpaError(f"apply_grad of stage {s} is not in the last clock")
        for b in range(num_micro_batches):
            fwd, bwd = seen[Task(s, b, "forward")], seen[Task(s, b, "backward")]
            before = [(Task(s, b, "forward"), Task(s, b, "backward"))]
            if s > 0:
                before.append((Task(s - 1, b, "forward"), Task(s, b, "forward")))
            if s + 1 < num_stages:
                before.append((Task(s + 1, b, "backward"), Task(s, b, "backward")))
            for first, then in before:
                if seen[first] >= seen[then]:
                    raise AlpaError(f"{then} (clock {seen[then]}) does not follow {first}")
            if max(fwd, bwd) >= last:
                raise AlpaError(f"{Task(s, b, 'backward')} runs in the apply-grad clock")


def in_flight(clocks: list[list[Task]], num_stages: int) -> list[list[int]]:
    """Per clock, per stage: micro-batches whose forward has run on that stage (in this
    or an earlier clock) and whose backward has not (the activations it holds after
    the clock)."""
    counts = [0] * num_stages
    result: list[list[int]] = []
    for tasks in clocks:
        for t in tasks:
            if t.phase == "forward":
                counts[t.stage] += 1
            elif t.phase == "backward":
                counts[t.stage] -= 1
        result.append(list(counts))
    return result


def peak_in_flight(clocks: list[list[Task]], num_stages: int) -> list[int]:
    """Per stage, the most micro-batches in flight at the end of any clock."""
    per_clock = in_flight(clocks, num_stages)
    return [max((row[s] for row in per_clock), default=0) for s in range(num_stages)]


__all__ = [
    "PHASES",
    "SCHEDULE_KINDS",
    "Phase",
    "ScheduleKind",
    "Task",
    "check_schedule",
    "in_flight",
    "num_clocks",
    "peak_in_flight",
    "schedule_clocks",
    "task_clocks",
]
