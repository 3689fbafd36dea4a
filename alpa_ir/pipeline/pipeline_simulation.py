"""Simulating a pipeline plan: iteration time and per-device peak memory,
without executing anything, for any cluster size (the ``simulate`` backend's
core, :mod:`alpa_ir.backends.simulate`, which also reads a plan from a module).

Input: a :class:`SimPlan`: per pipeline stage the latency of its forward,
its backward-for-input (B) and backward-for-weights (W) parts per
micro-batch, its apply-grad time, its persistent memory (parameters,
gradients, optimizer state) and the activations it keeps per in-flight
micro-batch, per device; the transfer time of a micro-batch's activations
between consecutive stages (and of their gradients back); the schedule (any
of :mod:`alpa_ir.pipeline.schedule_kinds`: ``gpipe``, ``1f1b``,
``interleaved-1f1b``, ``zb-h1``, ``zb-v``), its stages per mesh
(``virtual_stages``) and the number of micro-batches ``B``.

Time: the task order of each mesh comes from the schedule's
:class:`~alpa_ir.pipeline.task_order.TaskOrder` (the same lists
``emit-instructions`` writes for the plan, with the plan's in-flight caps);
each mesh runs its tasks one
after another, a task starting when its mesh is free and its inputs have
arrived: ``forward (s, b)`` after ``forward (s−1, b)`` ended plus the forward
transfer, ``backward (s, b)`` after ``backward (s+1, b)`` ended plus the
backward transfer and after ``forward (s, b)``, W after its B; the
apply-grad after the stage's last backward. A schedule that does not split
the backward runs B and W as one task. Transfers overlap with compute
(Alpa's runtime sends asynchronously), but each stage boundary is a link per
direction that carries one micro-batch's tensors at a time, in order: a
transfer slower than the stages throttles the pipeline as a slow stage
would. The iteration time is when the last task ends. With no transfers and equal stages
this is Eq. 2, ``Σ t_i + (B − 1)·max t_i`` with ``t_i = fwd_i + bwd_i``
(:func:`eq2_latency`); unequal stages and transfers are honoured as scheduled.

Devices that share a host's cores (the CPU devices: ``solo_speedup`` > 1,
a device's GEMM alone that much faster than with every device busy, as
``alpa-calibrate`` measures) do not each keep their own compute: stage times
are priced with every device busy, and a mesh whose stages wait leaves its
cores to the others. The iteration then takes the longer of two bounds: the
schedule played with each mesh of ``d`` of the plan's ``D`` devices running
``min(solo_speedup, D / d)`` times faster (the critical path at the most a
mesh can get), and the work of every task spread over the whole host
(``Σ busy_k · d_k / D``: the cores never idle while a task is ready). The
timeline is the first's.

Memory: a mesh holds the persistent memory of its stages plus the
activations of the micro-batches in flight on each (forward done, last
backward task not): ``B`` under GPipe, ``min(S − i, B)`` on stage ``i`` under
1F1B, as the schedule's order gives
(:func:`~alpa_ir.pipeline.task_order.peak_mesh_activations`). A mesh whose
peak exceeds its device memory raises :class:`alpa_ir.errors.PlanError` with
the bytes needed and available.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from alpa_ir.errors import AlpaError, PlanError
from alpa_ir.pipeline.schedule import Task
from alpa_ir.pipeline.schedule_kinds import BUILTIN_SCHEDULES, build_schedule
from alpa_ir.pipeline.task_order import (
    TaskOrder,
    dependencies,
    peak_mesh_activations,
    peak_stage_in_flight,
)

GiB = 1024**3


@dataclass(frozen=True)
class SimStage:
    """One stage: seconds per micro-batch, seconds per step, bytes per device.
    ``backward`` is B (the input gradient) and ``backward_weight`` W (the weight
    gradients); a schedule without a split backward runs both as one task."""

    forward: float
    backward: float = 0.0
    apply_grad: float = 0.0
    persistent_memory: float = 0.0
    activation_memory: float = 0.0
    device_memory: float = math.inf
    num_devices: int = 1
    backward_weight: float = 0.0
    transient_memory: float = 0.0
    """Bytes held only while the stage runs a task (remat's recomputed stash):
    stages that share a mesh run one task at a time, so the mesh holds the
    largest of theirs, not the sum."""


@dataclass(frozen=True)
class SimPlan:
    """A pipeline plan to simulate. ``forward_transfers[i]``: seconds to move one
    micro-batch's activations from stage ``i`` to ``i + 1``;
    ``backward_transfers[i]``: their gradients back (default: the forward ones).
    Empty: no transfer time. ``virtual_stages``: stages per mesh (the schedule
    places them); ``stages`` lists every pipeline stage in order.
    ``in_flight_caps``: per stage, the micro-batches it may hold in flight
    (zero-bubble schedules defer W within them; None: the schedule's own).
    ``phase_times``: per stage, the forward, B and W times (and optionally its
    inputs' transfer times) the schedule's order is built with (the plan's;
    None: unit times), not the times simulated."""

    stages: tuple[SimStage, ...]
    num_micro_batches: int
    schedule: str = "1f1b"
    forward_transfers: tuple[float, ...] = ()
    backward_transfers: tuple[float, ...] | None = None
    virtual_stages: int = 1
    in_flight_caps: tuple[int, ...] | None = None
    phase_times: tuple[tuple[float, ...], ...] | None = None
    solo_speedup: float = 1.0
    """How much faster a device computes alone than with every device of its
    host busy (the profile's; 1: devices with compute of their own). Above 1
    the meshes share their host's cores (module docstring)."""

    def task_order(self) -> TaskOrder:
        """The schedule's task order for these stages."""
        v = self.virtual_stages
        if len(self.stages) % v:
            raise AlpaError(
                f"simulate: {len(self.stages)} stages cannot be split into meshes of "
                f"virtual-stages={v}"
            )
        return build_schedule(
            self.schedule,
            len(self.stages) // v,
            self.num_micro_batches,
            v,
            self.in_flight_caps,
            self.phase_times,
        )


@dataclass(frozen=True)
class SimTask:
    stage: int
    """The pipeline stage (its mesh: :attr:`SimResult.mesh_of`)."""
    phase: str
    micro_batch: int | None
    start: float
    end: float


@dataclass(frozen=True)
class SimTransfer:
    """One micro-batch's values crossing the boundary between stages ``src`` and
    ``dst`` (forward: activations, backward: their gradients)."""

    src: int
    dst: int
    micro_batch: int | None
    start: float
    end: float


@dataclass(frozen=True)
class SimResult:
    """Iteration time (s), per mesh the peak bytes per device, per stage the most
    micro-batches in flight, the timeline of every task and every transfer.
    With one stage per mesh, meshes and stages are numbered alike."""

    iteration_time: float
    peak_memory: tuple[float, ...]
    max_in_flight: tuple[int, ...]
    timeline: tuple[SimTask, ...]
    transfers: tuple[SimTransfer, ...] = ()
    mesh_of: tuple[int, ...] = ()

    def stage_busy_time(self, stage: int) -> float:
        return sum(t.end - t.start for t in self.timeline if t.stage == stage)

    def mesh_busy_time(self, mesh: int) -> float:
        mesh_of = self.mesh_of or tuple(range(len(self.peak_memory)))
        return sum(t.end - t.start for t in self.timeline if mesh_of[t.stage] == mesh)

    def bubble_fraction(self) -> float:
        """Idle share of the meshes' time over the iteration."""
        meshes = len(set(self.mesh_of)) if self.mesh_of else len(self.peak_memory)
        busy = sum(self.mesh_busy_time(k) for k in range(meshes))
        return 1.0 - busy / (meshes * self.iteration_time) if self.iteration_time else 0.0


def _check_time(value: float, what: str) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise AlpaError(f"simulate: {what} must be a number of seconds, got {value!r}")
    if not (math.isfinite(value) and value >= 0):
        raise AlpaError(f"simulate: {what} must be finite and >= 0 seconds, got {value}")
    return float(value)


def _validate(plan: SimPlan) -> tuple[list[float], list[float]]:
    num = len(plan.stages)
    if num < 1:
        raise AlpaError("simulate: the plan has no stages")
    b = plan.num_micro_batches
    if isinstance(b, bool) or not isinstance(b, int) or b < 1:
        raise AlpaError(f"simulate: num_micro_batches must be an int >= 1, got {b!r}")
    if plan.schedule not in BUILTIN_SCHEDULES:
        raise AlpaError(
            f"simulate: unknown schedule '{plan.schedule}'; known: {', '.join(BUILTIN_SCHEDULES)}"
        )
    if not (math.isfinite(plan.solo_speedup) and plan.solo_speedup >= 1.0):
        raise AlpaError(f"simulate: solo_speedup must be >= 1, got {plan.solo_speedup!r}")
    for i, st in enumerate(plan.stages):
        for name in ("forward", "backward", "backward_weight", "apply_grad"):
            _check_time(getattr(st, name), f"stage {i} {name}")
        for name in ("persistent_memory", "activation_memory", "transient_memory"):
            value = getattr(st, name)
            if not (math.isfinite(value) and value >= 0):
                raise AlpaError(f"simulate: stage {i} {name} must be >= 0 bytes, got {value}")
        if not st.device_memory > 0:
            raise AlpaError(
                f"simulate: stage {i} device_memory must be > 0 bytes, got {st.device_memory}"
            )
    forward = _transfers(plan.forward_transfers, num, "forward_transfers")
    backward = (
        forward
        if plan.backward_transfers is None
        else _transfers(plan.backward_transfers, num, "backward_transfers")
    )
    return forward, backward


def _transfers(values: Sequence[float], num_stages: int, what: str) -> list[float]:
    if not values:
        return [0.0] * (num_stages - 1)
    if len(values) != num_stages - 1:
        raise AlpaError(
            f"simulate: {what} needs {num_stages - 1} values (one per stage boundary), "
            f"got {len(values)}"
        )
    return [_check_time(v, f"{what}[{i}]") for i, v in enumerate(values)]


def simulate(
    plan: SimPlan, *, check_memory: bool = True, order: TaskOrder | None = None
) -> SimResult:
    """Simulate one iteration of ``plan`` (module docstring); raise PlanError
    when a stage runs out of device memory (unless ``check_memory`` is false).
    ``order``: ``plan.task_order()``, where the caller has built it already."""
    fwd_transfer, bwd_transfer = _validate(plan)
    if order is None:
        order = plan.task_order()
    in_flight = peak_stage_in_flight(order)
    held = peak_mesh_activations(order, [st.activation_memory for st in plan.stages])
    persistents = [
        sum(plan.stages[s].persistent_memory for s in order.stages_of(k))
        + max(plan.stages[s].transient_memory for s in order.stages_of(k))
        for k in range(order.num_meshes)
    ]
    peaks = tuple(held[k] + persistents[k] for k in range(order.num_meshes))
    if check_memory:
        for k, peak in enumerate(peaks):
            stages = order.stages_of(k)
            limit = min(plan.stages[s].device_memory for s in stages)
            if peak > limit:
                persistent = persistents[k]
                what = f"stage {k}" if len(stages) == 1 else f"mesh {k} (stages {list(stages)})"
                flight = ", ".join(str(in_flight[s]) for s in stages)
                raise PlanError(
                    f"simulate: {what} is out of memory under {plan.schedule}: it needs "
                    f"{peak / GiB:.3f} GiB per device ({persistent / GiB:.3f} GiB persistent + "
                    f"{held[k] / GiB:.3f} GiB activations of {flight} micro-batches in flight), "
                    f"the device has {limit / GiB:.3f} GiB"
                )

    speeds = [1.0] * order.num_meshes
    devices = [plan.stages[order.stages_of(k)[0]].num_devices for k in range(order.num_meshes)]
    shared = plan.solo_speedup > 1.0 and order.num_meshes > 1
    if shared:
        total = sum(devices)
        speeds = [min(plan.solo_speedup, total / d) for d in devices]
    timeline, transfers = _play(plan, order, fwd_transfer, bwd_transfer, speeds)
    iteration = max(t.end for t in timeline)
    if shared:  # the work spread over the host's cores, at the all-busy prices
        work = sum(
            (t.end - t.start) * speeds[order.mesh_of[t.stage]] * devices[order.mesh_of[t.stage]]
            for t in timeline
        )
        iteration = max(iteration, work / sum(devices))
    return SimResult(
        iteration_time=iteration,
        peak_memory=peaks,
        max_in_flight=tuple(in_flight),
        timeline=tuple(timeline),
        transfers=tuple(transfers),
        mesh_of=order.mesh_of,
    )


def _play(
    plan: SimPlan,
    order: TaskOrder,
    fwd_transfer: list[float],
    bwd_transfer: list[float],
    speeds: Sequence[float],
) -> tuple[list[SimTask], list[SimTransfer]]:
    """The schedule played out (module docstring): every task as early as its
    mesh and inputs allow, mesh ``k``'s tasks taking their time / ``speeds[k]``."""
    end: dict[Task, float] = {}
    free = [0.0] * order.num_meshes
    # when each link is next free: (boundary, direction) -> time
    links: dict[tuple[int, str], float] = {}
    position = [0] * order.num_meshes
    timeline: list[SimTask] = []
    transfers: list[SimTransfer] = []
    remaining = sum(len(o) for o in order.orders)
    split = order.split_backward
    while remaining:
        progressed = False
        for k, tasks in enumerate(order.orders):
            while position[k] < len(tasks):
                task = tasks[position[k]]
                arrival = _arrival(task, order, end, fwd_transfer, bwd_transfer, links)
                if arrival is None:
                    break
                ready, link = arrival
                if link is not None:
                    key, link_start, link_end = link
                    links[key] = link_end
                    boundary, direction = key
                    src, dst = (boundary, boundary + 1)[:: 1 if direction == "forward" else -1]
                    transfers.append(SimTransfer(src, dst, task.micro_batch, link_start, link_end))
                stage = plan.stages[task.stage]
                duration = {
                    "forward": stage.forward,
                    "backward": stage.backward + (0.0 if split else stage.backward_weight),
                    "backward_weight": stage.backward_weight,
                    "apply_grad": stage.apply_grad,
                }[task.phase] / speeds[k]
                start = max(free[k], ready)
                end[task] = free[k] = start + duration
                timeline.append(
                    SimTask(task.stage, task.phase, task.micro_batch, start, start + duration)
                )
                position[k] += 1
                remaining -= 1
                progressed = True
        if not progressed:  # check_task_order guarantees progress
            raise AlpaError("simulate: the schedule deadlocks (a task waits on a later one)")
    return timeline, transfers


def _arrival(
    task: Task,
    order: TaskOrder,
    end: dict[Task, float],
    fwd_transfer: list[float],
    bwd_transfer: list[float],
    links: dict[tuple[int, str], float],
) -> tuple[float, tuple[tuple[int, str], float, float] | None] | None:
    """When the inputs of ``task`` are available, and the link its input
    crossed with the transfer's start and the time that link is free again
    (its end); None if a dependency has not run. A transfer starts when its
    producer ends and its link (a stage boundary, one per direction) has
    finished the transfer before it: links carry one micro-batch at a time, in
    order."""
    s = task.stage
    ready = 0.0
    link = None
    for dep in dependencies(task, order):
        if dep not in end:
            return None
        if dep.stage == s or dep.phase == "apply_grad":
            ready = max(ready, end[dep])
            continue
        if dep.phase == "forward":
            key, duration = (s - 1, "forward"), fwd_transfer[s - 1]
        else:
            key, duration = (s, "backward"), bwd_transfer[s]
        start = max(end[dep], links.get(key, 0.0))
        ready = max(ready, start + duration)
        link = (key, start, start + duration)
    return ready, link


def eq2_latency(plan: SimPlan) -> float:
    """Alpa's Eq. 2, ``Σ t_i + (B − 1)·max t_i`` with ``t_i`` = forward + backward
    of stage ``i`` (no transfers, no apply-grad): the closed form to compare with."""
    times = [st.forward + st.backward for st in plan.stages]
    return sum(times) + (plan.num_micro_batches - 1) * max(times)


__all__ = [
    "GiB",
    "SimPlan",
    "SimResult",
    "SimStage",
    "SimTask",
    "SimTransfer",
    "eq2_latency",
    "simulate",
]
