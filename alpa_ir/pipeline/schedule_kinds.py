"""The pipeline schedules the compiler knows, each a builder of a :class:`TaskOrder`.

``p`` meshes, ``m`` micro-batches, ``v`` stages (chunks) per mesh:

- ``inference`` (Alpa's): a forward-only step (no gradients), each mesh runs
  its stage's forward of every micro-batch in turn.
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
  backward split. By default each mesh runs B first, then a forward (the
  later chunk first) while it holds fewer than ``2p`` chunk activations (``p``
  micro-batches of the whole mesh), or as many as its two caps allow where
  caps are given (what its memory holds, which may be more), else a W. Under
  caps, or with phase times, the first chunk leaves one slot to the second,
  without which unequal times can fill a mesh with first-chunk forwards whose
  B's wait on it. With phase times the order is the shortest of a few such
  priority rules (:data:`ZB_V_RULES`), each list-scheduled with the times: no
  single greedy rule keeps the slowest mesh busy for every ratio of F, B, W
  and transfer times.

The zero-bubble orders are found by list scheduling: the greedy choice above
at each moment a mesh is free, with unit times (F = B = W) or with the plan's
phase times (``times``, per stage F, B and W, optionally followed by the
seconds its forward input and its gradient input take to arrive from the
neighbouring stages: ``construct-stages`` writes the times it planned with
into ``pipeline.plan``'s ``phase_times``; an order
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
from alpa_ir.pipeline.task_order import TaskOrder, check_task_order

PhaseTimes = Sequence[tuple[float, ...]]
"""Per stage, the forward, B and W times a list-scheduled order is built with,
optionally followed by two transfer times: the seconds the stage's forward
input takes to arrive from the stage before and its gradient input from the
stage after (0 where both run on one mesh)."""
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


Ready = Callable[[int, str, int], bool]
"""``ready(stage, phase, micro_batch)``: whether that task's inputs have arrived."""
Policy = Callable[[int, float, Ready, list[_Progress]], Task | None]


def _list_schedule(
    kind: str,
    micro_batches: int,
    mesh_of: tuple[int, ...],
    policy: Policy,
    times: PhaseTimes | None = None,
) -> tuple[TaskOrder, float]:
    """Simulate the meshes with ``times`` (None: unit times); each free mesh runs
    the task ``policy`` picks among the ready ones (``policy(mesh, now,
    is_ready, progress)``). A task is ready when its inputs have arrived (with
    ``times``' transfer times, where given). Returns the order and when its
    last task ends."""
    meshes = max(mesh_of) + 1
    ends: dict[tuple[int, str, int | None], float] = {}  # (stage, phase, micro-batch)
    progress = [_Progress() for _ in mesh_of]
    orders: list[list[Task]] = [[] for _ in range(meshes)]
    free = [0.0] * meshes
    events: list[float] = [0.0]
    remaining = 3 * micro_batches * len(mesh_of)
    now = 0.0
    last = len(mesh_of) - 1
    # when a stage's forward input and its gradient input arrive after they are produced
    transfer_in = [
        (t[3], t[4]) if times is not None and len(t) == 5 else (0.0, 0.0)
        for t in (times or [()] * len(mesh_of))
    ]

    def ready(s: int, phase: str, b: int) -> bool:
        """Whether the inputs of the task have arrived (task_order.dependencies)."""
        if phase == "forward":
            if s == 0:
                return True
            end = ends.get((s - 1, "forward", b))
            return end is not None and end + transfer_in[s][0] <= now
        if phase == "backward":
            end = ends.get((s, "forward", b))
            if end is None or end > now:
                return False
            if s == last:
                return True
            end = ends.get((s + 1, "backward", b))
            return end is not None and end + transfer_in[s][1] <= now
        end = ends.get((s, "backward", b))
        return end is not None and end <= now

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
                end = free[k] = now + duration
                ends[(task.stage, task.phase, task.micro_batch)] = end
                heapq.heappush(events, end)
                # the consumer on a neighbouring stage sees it after the transfer
                if task.phase == "forward" and task.stage < last:
                    heapq.heappush(events, end + transfer_in[task.stage + 1][0])
                elif task.phase == "backward" and task.stage > 0:
                    heapq.heappush(events, end + transfer_in[task.stage - 1][1])
                orders[k].append(task)
                remaining -= 1
                progressed = True
        while events and events[0] <= now:
            heapq.heappop(events)
        if remaining:
            if not events:
                raise AlpaError(f"schedule '{kind}': the list scheduler is stuck (a policy bug)")
            now = events[0]
    for k in range(meshes):
        orders[k] += [Task(s, None, "apply_grad") for s, m in enumerate(mesh_of) if m == k]
    built = TaskOrder(kind, micro_batches, mesh_of, True, tuple(map(tuple, orders)))
    return built, max(free)


def _times(kind: str, times: PhaseTimes | None, stages: int) -> PhaseTimes | None:
    if times is None:
        return None
    if len(times) != stages or any(len(t) not in (3, 5) for t in times):
        raise AlpaError(
            f"schedule '{kind}': phase times need a forward, B and W time (and optionally "
            f"two transfer times) for each of the {stages} stages, got "
            f"{[len(t) for t in times]} numbers per stage"
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

    def policy(k: int, now: float, ready: Ready, progress: list[_Progress]) -> Task | None:
        del now
        state = progress[k]
        position = state.forward + state.backward
        task = fb_orders[k][position] if position < 2 * m else None
        if task is not None and task.phase == "forward" and state.forward - state.weight >= cap[k]:
            return Task(k, state.weight, "backward_weight")  # the cap: release one first
        if task is not None and ready(task.stage, task.phase, task.micro_batch):  # type: ignore[arg-type]
            return task
        return Task(k, state.weight, "backward_weight") if state.weight < state.backward else None

    return _list_schedule(kind, m, tuple(range(p)), policy, _times(kind, times, p))[0]


ZbVRule = tuple[int, tuple[str, ...]]
"""A ZB-V priority rule: the slots the first chunk leaves to the second, and the
order in which a free mesh tries B of its first (``B1``) or second (``B2``)
chunk, a forward of either (``F1``, ``F2``) and a pending W (``W``)."""
ZB_V_RULES: tuple[ZbVRule, ...] = (
    (1, ("B1", "B2", "F2", "F1", "W")),  # the default: complete micro-batches first
    (1, ("B2", "F1", "F2", "B1", "W")),
    (1, ("F1", "B2", "F2", "W", "B1")),
    (1, ("B1", "F1", "F2", "B2", "W")),
    (1, ("F2", "B2", "W", "F1", "B1")),
    (0, ("F2", "F1", "W", "B1", "B2")),
)
"""The rules a timed ZB-V order is chosen among (the first that ends soonest)."""


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
    # the schedule's own 2p chunk activations per mesh, or what the caps allow
    mesh_cap = [2 * p if caps is None else cap[k] + cap[2 * p - 1 - k] for k in range(p)]
    if min(mesh_cap) < 2:
        raise AlpaError(f"schedule '{kind}': a mesh must hold 2 chunks in flight (one micro-batch)")
    constrained = min(mesh_cap) < 2 * p
    times = _times(kind, times, 2 * p)

    def policy_of(rule: ZbVRule) -> Policy:
        reserve, priority = rule
        # under caps below 2p the first chunk keeps a slot free for the second, which
        # completes a micro-batch (with every mesh at 2p the second chunk's forward
        # arrives in time; one slower mesh delays it for all)
        reserve = reserve if constrained or times is not None else 0
        steps = tuple((c[0], int(c[1]) - 1 if c != "W" else -1) for c in priority)  # parsed once

        def policy(k: int, now: float, ready: Ready, progress: list[_Progress]) -> Task | None:
            del now
            chunks = (k, 2 * p - 1 - k)
            first, second = progress[k], progress[chunks[1]]
            held = (first.forward - first.weight) + (second.forward - second.weight)
            for what, which in steps:
                if what == "W":
                    for s in chunks:
                        if progress[s].weight < progress[s].backward:
                            return Task(s, progress[s].weight, "backward_weight")
                    continue
                s = chunks[which]
                state = progress[s]
                if what == "B":
                    if state.backward < state.forward and ready(s, "backward", state.backward):
                        return Task(s, state.backward, "backward")
                    continue
                room = mesh_cap[k] - (reserve if s == k else 0)
                if held < room and state.forward < m and ready(s, "forward", state.forward):
                    return Task(s, state.forward, "forward")
            return None

        return policy

    built: list[tuple[TaskOrder, float]] = []
    errors: list[AlpaError] = []
    for rule in ZB_V_RULES if times is not None else ZB_V_RULES[:1]:
        try:
            built.append(_list_schedule(kind, m, mesh_of, policy_of(rule), times))
        except AlpaError as error:  # a rule that gets stuck on these caps
            errors.append(error)
    if not built:
        raise errors[0]
    return min(built, key=lambda b: b[1])[0]  # the first of the soonest


def inference(
    meshes: int,
    micro_batches: int,
    virtual: int,
    caps: Sequence[int] | None = None,
    times: PhaseTimes | None = None,
) -> TaskOrder:
    """Alpa's inference schedule: a forward-only step, each mesh runs its stage's
    forward of micro-batch 0, 1, ... in turn (micro-batch ``b`` on stage ``s``
    at clock ``s + b``, as GPipe's forward half); nothing is held past a forward."""
    del caps, times  # a fixed order, one activation in flight per stage
    kind = "inference"
    _check_counts(kind, meshes, micro_batches, virtual)
    if virtual != 1:
        raise AlpaError(f"schedule '{kind}' runs one stage per mesh; got virtual-stages={virtual}")
    orders = tuple(
        tuple(Task(k, b, "forward") for b in range(micro_batches)) for k in range(meshes)
    )
    return TaskOrder(kind, micro_batches, tuple(range(meshes)), False, orders, forward_only=True)


BUILTIN_SCHEDULES: Mapping[str, ScheduleBuilder] = {
    "gpipe": _clock_order("gpipe"),
    "1f1b": _clock_order("1f1b"),
    "interleaved-1f1b": interleaved_1f1b,
    "zb-h1": zb_h1,
    "zb-v": zb_v,
    "inference": inference,
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
    "ZB_V_RULES",
    "PhaseTimes",
    "ScheduleBuilder",
    "build_schedule",
    "inference",
    "interleaved_1f1b",
    "order_of_plan",
    "zb_h1",
    "zb_v",
]
