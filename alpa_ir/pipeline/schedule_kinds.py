"""The pipeline schedules the compiler knows, each a builder of a :class:`TaskOrder`.

``p`` meshes, ``m`` micro-batches, ``v`` stages (chunks) per mesh:

- ``gpipe`` and ``1f1b``: one stage per mesh, the orders of
  :func:`alpa_ir.pipeline.schedule.schedule_clocks` (the backward runs B and W
  together).
- ``interleaved-1f1b`` (Megatron-LM): ``v`` chunks per mesh, stage ``c·p + k``
  on mesh ``k`` (non-adjacent chunks). Its forwards take the micro-batches in
  groups of ``g``, each group through every chunk in turn; backwards walk the
  chunks in reverse. ``g`` is ``p`` when ``p`` divides ``m`` (Megatron's
  order), else the smallest divisor of ``m`` above ``p`` (Megatron-core's
  group size option): the bubble stays ``(p−1)/v`` of 1F1B's, the warm-up
  holds ``(g−p)(v−1)`` more chunk activations. Mesh ``k`` warms up with
  ``min(2(p−k−1) + (v−1)g, m·v)`` forwards, then alternates one forward and
  one backward, then drains the backwards.
- ``zb-h1`` (Qi et al., ICLR'24): one stage per mesh, backward split into B
  and W. Each mesh keeps 1F1B's order of forwards and B's and runs a W
  whenever its next forward or B is not ready, or when the forward would hold
  more than ``p`` micro-batches' activations (1F1B's peak, on every mesh), or
  more than the stage's cap where one is given (at least 1F1B's ``p − k``).
- ``zb-v``: two chunks per mesh in V order (stage ``k`` and stage
  ``2p − 1 − k`` on mesh ``k``, so the last stage shares the first mesh),
  backward split. Each mesh runs B first, then a forward (the later chunk
  first) while it holds fewer than ``2p`` chunk activations (``p`` micro-batches
  of the whole mesh; under a lower cap, or with phase times, the first chunk
  leaves one slot to the second, without which unequal times can fill a mesh
  with first-chunk forwards whose B's wait on it), else a W.

The zero-bubble orders are found by list scheduling: the greedy choice above
at each moment a mesh is free, with unit times (F = B = W) or with the plan's
phase times (``times``, per stage F, B and W: ``construct-stages`` writes the
times it planned with into ``pipeline.plan``'s ``phase_times``; an order
built for unit times, replayed when B takes twice F as under remat, leaves a
third of a ZB-V step idle). The order is part of the plan, not of a run's
speed: ``emit-instructions`` and the simulator build the same lists from the
same plan. ``caps`` (one per stage, or None) are
the micro-batches each stage may hold in flight, from its memory;
``construct-stages`` writes them into the plan (``pipeline.plan``'s
``in_flight``). Any order is deadlock-free and checked
(:func:`~alpa_ir.pipeline.task_order.check_task_order`). A plugin may add a
schedule (hook ``alpa_ir_schedules``: name → builder with this module's
signature).
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from alpa_ir.errors import AlpaError
from alpa_ir.pipeline.schedule import Task, schedule_clocks
from alpa_ir.pipeline.task_order import TaskOrder, check_task_order, dependencies

PhaseTimes = Sequence[tuple[float, float, float]]
"""Per stage, the forward, B and W times a list-scheduled order is built with."""
ScheduleBuilder = Callable[..., TaskOrder]
"""``(meshes, micro_batches, virtual_stages, caps or None) -> TaskOrder``; a
builder that orders by time also takes ``times`` (:data:`PhaseTimes`), passed
only where a plan has them."""


def _check_counts(kind: str, meshes: int, micro_batches: int, virtual: int) -> None:
    for what, value in (("meshes", meshes), ("micro-batches", micro_batches)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise AlpaError(f"schedule '{kind}' needs a positive number of {what}, got {value!r}")
    if isinstance(virtual, bool) or not isinstance(virtual, int) or virtual < 1:
        raise AlpaError(f"schedule '{kind}': virtual-stages must be an int >= 1, got {virtual!r}")


def _clock_order(kind: str) -> ScheduleBuilder:
    def build(
        meshes: int,
        micro_batches: int,
        virtual: int,
        caps: Sequence[int] | None,
        times: PhaseTimes | None = None,
    ) -> TaskOrder:
        del caps, times  # a fixed order
        _check_counts(kind, meshes, micro_batches, virtual)
        if virtual != 1:
            raise AlpaError(
                f"schedule '{kind}' runs one stage per mesh; virtual-stages={virtual} needs "
                "interleaved-1f1b or zb-v"
            )
        orders: list[list[Task]] = [[] for _ in range(meshes)]
        for clock in schedule_clocks(meshes, micro_batches, kind):  # type: ignore[arg-type]
            for task in clock:
                orders[task.stage].append(task)
        return TaskOrder(
            kind, micro_batches, tuple(range(meshes)), False, tuple(map(tuple, orders))
        )

    return build


def interleaved_1f1b(
    meshes: int,
    micro_batches: int,
    virtual: int,
    caps: Sequence[int] | None = None,
    times: PhaseTimes | None = None,
) -> TaskOrder:
    """Megatron-LM's interleaved 1F1B (module docstring)."""
    del caps, times  # a fixed order
    kind = "interleaved-1f1b"
    _check_counts(kind, meshes, micro_batches, virtual)
    p, v, total = meshes, virtual, micro_batches * virtual
    mesh_of = tuple(s % p for s in range(p * v))
    # groups of g micro-batches, each run through every chunk in turn: g is the
    # smallest divisor of m from p on (Megatron's g = p when p divides m)
    group = next(
        g for g in range(min(p, micro_batches), micro_batches + 1) if micro_batches % g == 0
    )
    table = [
        (chunk, mb)
        for start in range(0, micro_batches, group)
        for chunk in range(v)
        for mb in range(start, start + group)
    ]

    def nth(k: int, i: int, phase: str) -> Task:
        chunk, mb = table[i]
        if phase == "backward":
            chunk = v - 1 - chunk
        return Task(chunk * p + k, mb, phase)  # type: ignore[arg-type]

    orders = []
    for k in range(p):
        warmup = min(2 * (p - k - 1) + (v - 1) * group, total)
        tasks = [nth(k, i, "forward") for i in range(warmup)]
        for i in range(total - warmup):
            tasks += [nth(k, warmup + i, "forward"), nth(k, i, "backward")]
        tasks += [nth(k, i, "backward") for i in range(max(0, total - warmup), total)]
        tasks += [Task(c * p + k, None, "apply_grad") for c in range(v)]
        orders.append(tuple(tasks))
    return TaskOrder(kind, micro_batches, mesh_of, False, tuple(orders))


# --------------------------------------------------------------------------- list scheduling


@dataclass
class _Progress:
    """Per stage: the next micro-batch of each phase (they run in micro-batch order)."""

    forward: int = 0
    backward: int = 0
    weight: int = 0


Policy = Callable[[int, float, Callable[[Task], bool], list[_Progress]], Task | None]


def _list_schedule(
    kind: str,
    micro_batches: int,
    mesh_of: tuple[int, ...],
    policy: Policy,
    times: PhaseTimes | None = None,
) -> TaskOrder:
    """Simulate the meshes with ``times`` (None: unit times); each free mesh runs
    the task ``policy`` picks among the ready ones (``policy(mesh, now,
    is_ready, progress)``)."""
    meshes = max(mesh_of) + 1
    order = TaskOrder(kind, micro_batches, mesh_of, True, ())
    ends: dict[Task, float] = {}
    progress = [_Progress() for _ in mesh_of]
    orders: list[list[Task]] = [[] for _ in range(meshes)]
    free = [0.0] * meshes
    events: list[float] = [0.0]
    remaining = 3 * micro_batches * len(mesh_of)
    now = 0.0

    def ready(task: Task) -> bool:
        return all(ends.get(d, float("inf")) <= now for d in dependencies(task, order))

    while remaining:
        progressed = True
        while progressed:
            progressed = False
            for k in range(meshes):
                if free[k] > now:
                    continue
                task = policy(k, now, ready, progress)
                if task is None:
                    continue
                state = progress[task.stage]
                phase = ("forward", "backward", "backward_weight").index(task.phase)
                duration = 1.0 if times is None else times[task.stage][phase]
                attr = {"forward": "forward", "backward": "backward"}.get(task.phase, "weight")
                setattr(state, attr, getattr(state, attr) + 1)
                ends[task] = free[k] = now + duration
                heapq.heappush(events, now + duration)
                orders[k].append(task)
                remaining -= 1
                progressed = True
        later = [e for e in events if e > now]
        if remaining and not later:
            raise AlpaError(f"schedule '{kind}': the list scheduler is stuck (a policy bug)")
        while events and events[0] <= now:
            heapq.heappop(events)
        if remaining:
            now = events[0]
    for k in range(meshes):
        orders[k] += [Task(s, None, "apply_grad") for s, m in enumerate(mesh_of) if m == k]
    return TaskOrder(kind, micro_batches, mesh_of, True, tuple(map(tuple, orders)))


def _times(kind: str, times: PhaseTimes | None, stages: int) -> PhaseTimes | None:
    if times is None:
        return None
    if len(times) != stages or any(len(t) != 3 for t in times):
        raise AlpaError(
            f"schedule '{kind}': phase times need a forward, B and W time for each of the "
            f"{stages} stages, got {len(times)} entries"
        )
    if not all(math.isfinite(x) and x >= 0 for t in times for x in t):
        raise AlpaError(f"schedule '{kind}': phase times must be finite and >= 0")
    return times


def _caps(kind: str, caps: Sequence[int] | None, stages: int, default: int) -> list[int]:
    """Each stage's cap: the schedule's ``default`` or less, as ``caps`` say."""
    if caps is None:
        return [default] * stages
    if len(caps) != stages:
        raise AlpaError(f"schedule '{kind}': {len(caps)} in-flight caps for {stages} stages")
    for s, cap in enumerate(caps):
        if isinstance(cap, bool) or not isinstance(cap, int) or cap < 1:
            raise AlpaError(
                f"schedule '{kind}': stage {s}'s in-flight cap must be an int >= 1, got {cap!r}"
            )
    return [min(default, cap) for cap in caps]


def zb_h1(
    meshes: int,
    micro_batches: int,
    virtual: int,
    caps: Sequence[int] | None = None,
    times: PhaseTimes | None = None,
) -> TaskOrder:
    """ZB-H1 (module docstring)."""
    kind = "zb-h1"
    _check_counts(kind, meshes, micro_batches, virtual)
    if virtual != 1:
        raise AlpaError(f"schedule '{kind}' runs one stage per mesh; got virtual-stages={virtual}")
    p, m = meshes, micro_batches
    cap = _caps(kind, caps, p, p)
    for k, c in enumerate(cap):
        if c < min(p - k, m):
            raise AlpaError(
                f"schedule '{kind}': stage {k} may hold {c} micro-batches in flight; it needs "
                f"{min(p - k, m)}, as under 1F1B"
            )
    fb_orders = [
        [t for clock in schedule_clocks(p, m, "1f1b") for t in clock if t.stage == k]
        for k in range(p)
    ]

    def policy(
        k: int, now: float, ready: Callable[[Task], bool], progress: list[_Progress]
    ) -> Task | None:
        del now
        state = progress[k]
        position = state.forward + state.backward
        pending_w = state.weight < state.backward
        w = Task(k, state.weight, "backward_weight")
        task = fb_orders[k][position] if position < 2 * m else None
        if task is not None and task.phase == "forward" and state.forward - state.weight >= cap[k]:
            return w  # the memory cap: release a micro-batch first
        if task is not None and ready(task):
            return task
        return w if pending_w else None

    return _list_schedule(kind, m, tuple(range(p)), policy, _times(kind, times, p))


def zb_v(
    meshes: int,
    micro_batches: int,
    virtual: int,
    caps: Sequence[int] | None = None,
    times: PhaseTimes | None = None,
) -> TaskOrder:
    """ZB-V (module docstring)."""
    kind = "zb-v"
    _check_counts(kind, meshes, micro_batches, virtual)
    if virtual != 2:
        raise AlpaError(f"schedule '{kind}' places 2 stages per mesh; got virtual-stages={virtual}")
    p, m = meshes, micro_batches
    mesh_of = tuple(s if s < p else 2 * p - 1 - s for s in range(2 * p))
    cap = _caps(kind, caps, 2 * p, 2 * p)
    mesh_cap = [min(2 * p, cap[k] + cap[2 * p - 1 - k]) for k in range(p)]
    if min(mesh_cap) < 2:
        raise AlpaError(f"schedule '{kind}': a mesh must hold 2 chunks in flight (one micro-batch)")
    constrained = min(mesh_cap) < 2 * p

    def policy(
        k: int, now: float, ready: Callable[[Task], bool], progress: list[_Progress]
    ) -> Task | None:
        del now
        first, second = k, 2 * p - 1 - k
        for s in (first, second):  # B first: the earlier stage completes a micro-batch
            state = progress[s]
            b = Task(s, state.backward, "backward")
            if state.backward < state.forward and ready(b):
                return b
        held = sum(progress[s].forward - progress[s].weight for s in (first, second))
        # under caps below 2p the first chunk keeps a slot free for the second, which
        # completes a micro-batch (with every mesh at 2p the second chunk's forward
        # arrives in time; one slower mesh delays it for all)
        reserve = 1 if constrained or times is not None else 0
        for s, room in ((second, mesh_cap[k]), (first, mesh_cap[k] - reserve)):
            state = progress[s]
            f = Task(s, state.forward, "forward")
            if held < room and state.forward < m and ready(f):
                return f
        for s in (first, second):
            state = progress[s]
            if state.weight < state.backward:
                return Task(s, state.weight, "backward_weight")
        return None

    return _list_schedule(kind, m, mesh_of, policy, _times(kind, times, 2 * p))


BUILTIN_SCHEDULES: Mapping[str, ScheduleBuilder] = {
    "gpipe": _clock_order("gpipe"),
    "1f1b": _clock_order("1f1b"),
    "interleaved-1f1b": interleaved_1f1b,
    "zb-h1": zb_h1,
    "zb-v": zb_v,
}
SPLIT_SCHEDULES = frozenset({"zb-h1", "zb-v"})
"""Schedules that need the backward split into B and W (``split-backward``)."""


def build_schedule(
    kind: str,
    meshes: int,
    micro_batches: int,
    virtual_stages: int = 1,
    caps: Sequence[int] | None = None,
    times: PhaseTimes | None = None,
    *,
    schedules: Mapping[str, ScheduleBuilder] | None = None,
) -> TaskOrder:
    """The checked task order of schedule ``kind`` (a builtin or one of
    ``schedules``); ``caps``: per stage, the micro-batches it may hold in
    flight; ``times``: per stage, the phase times a list-scheduled order is
    built with (given to the builder only when not None)."""
    table = {**BUILTIN_SCHEDULES, **(schedules or {})}
    if kind not in table:
        raise AlpaError(f"unknown schedule '{kind}'; known: {', '.join(table)}")
    if times is None:
        order = table[kind](meshes, micro_batches, virtual_stages, caps)
    else:
        order = table[kind](meshes, micro_batches, virtual_stages, caps, times)
    if not isinstance(order, TaskOrder):
        raise AlpaError(f"schedule '{kind}' built {type(order).__name__}, not a TaskOrder")
    check_task_order(order)
    return order


def order_of_plan(
    kind: str,
    stage_meshes: Sequence[str],
    micro_batches: int,
    caps: Sequence[int] | None = None,
    times: PhaseTimes | None = None,
    *,
    schedules: Mapping[str, ScheduleBuilder] | None = None,
) -> TaskOrder:
    """The task order of a plan whose stage ``s`` runs on mesh ``stage_meshes[s]``
    (names; a mesh holding several stages: virtual stages), checked to place
    the stages where the plan does (``caps``, ``times``: the plan's
    ``in_flight`` and ``phase_times``)."""
    distinct = list(dict.fromkeys(stage_meshes))
    if not distinct or len(stage_meshes) % len(distinct):
        raise AlpaError(
            f"{len(stage_meshes)} stages on {len(distinct)} meshes; every mesh needs as many stages"
        )
    virtual = len(stage_meshes) // len(distinct)
    order = build_schedule(
        kind, len(distinct), micro_batches, virtual, caps, times, schedules=schedules
    )
    planned = tuple(distinct.index(m) for m in stage_meshes)
    if order.mesh_of != planned:
        raise AlpaError(
            f"schedule '{kind}' places the stages on meshes {list(order.mesh_of)}, the plan on "
            f"{list(planned)}"
        )
    return order


__all__ = [
    "BUILTIN_SCHEDULES",
    "SPLIT_SCHEDULES",
    "PhaseTimes",
    "ScheduleBuilder",
    "build_schedule",
    "interleaved_1f1b",
    "order_of_plan",
    "zb_h1",
    "zb_v",
]
