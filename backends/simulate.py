"""The ``simulate`` backend: iteration time and per-device peak memory of a
pipeline plan, without executing anything, for any cluster size.

Input: a :class:`SimPlan`: per stage the latency of its forward and backward
part per micro-batch, its apply-grad time, its persistent memory (parameters,
gradients, optimizer state) and the activations it keeps per in-flight
micro-batch, per device; the transfer time of a micro-batch's activations
between consecutive stages (and of their gradients back); the schedule
(``gpipe`` | ``1f1b``) and the number of micro-batches ``B``.

Time: the task order of each stage comes from :mod:`alpa_ir.pipeline.schedule`
(the order its clocks give); each stage runs its tasks one after another, a
task starting when its stage is free and its inputs have arrived:
``forward (s, b)`` after ``forward (s−1, b)`` ended plus the forward transfer,
``backward (s, b)`` after ``backward (s+1, b)`` ended plus the backward
transfer (and after ``forward (s, b)``, which the order guarantees); the
apply-grad after the stage's last backward. Transfers overlap with compute
(Alpa's runtime sends asynchronously), but each stage boundary is a link per
direction that carries one micro-batch's tensors at a time, in order: a
transfer slower than the stages throttles the pipeline as a slow stage
would. The iteration time is when the last task ends. With no transfers and equal stages
this is Eq. 2, ``Σ t_i + (B − 1)·max t_i`` with ``t_i = fwd_i + bwd_i``
(:func:`eq2_latency`); unequal stages and transfers are honoured as scheduled.

Memory: a stage holds its persistent memory plus the activations of the
micro-batches in flight (forward done, backward not): ``B`` under GPipe,
``min(S − i, B)`` on stage ``i`` under 1F1B. A stage whose peak exceeds its
device memory raises :class:`alpa_ir.errors.PlanError` with the bytes needed
and available.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, replace

from xdsl.dialects import func
from xdsl.dialects.builtin import DenseArrayBase, IntegerAttr, ModuleOp
from xdsl.ir import BlockArgument

from alpa_ir.costs.stage_cost import StageCost, StageCostModel
from alpa_ir.dialects.attrs import BATCH_ATTR, CROSS_BYTES_ATTR
from alpa_ir.dialects.lax_params import ints_of
from alpa_ir.dialects.mesh import LogicalMeshOp
from alpa_ir.dialects.pipeline import PlanOp, TransferOp, plan_stages
from alpa_ir.errors import AlpaError, PlanError
from alpa_ir.hardware.clusters import Cluster
from alpa_ir.hardware.device_mesh import LogicalDeviceMesh
from alpa_ir.ir.module_utils import main_function, symbol_op, top_level_ops
from alpa_ir.ir.types import dtype_of, shape_of
from alpa_ir.pipeline.schedule import SCHEDULE_KINDS, Task, peak_in_flight, schedule_clocks

GiB = 1024**3


@dataclass(frozen=True)
class SimStage:
    """One stage: seconds per micro-batch, seconds per step, bytes per device."""

    forward: float
    backward: float = 0.0
    apply_grad: float = 0.0
    persistent_memory: float = 0.0
    activation_memory: float = 0.0
    device_memory: float = math.inf
    num_devices: int = 1


@dataclass(frozen=True)
class SimPlan:
    """A pipeline plan to simulate. ``forward_transfers[i]``: seconds to move one
    micro-batch's activations from stage ``i`` to ``i + 1``;
    ``backward_transfers[i]``: their gradients back (default: the forward ones).
    Empty: no transfer time."""

    stages: tuple[SimStage, ...]
    num_micro_batches: int
    schedule: str = "1f1b"
    forward_transfers: tuple[float, ...] = ()
    backward_transfers: tuple[float, ...] | None = None


@dataclass(frozen=True)
class SimTask:
    stage: int
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
    """Iteration time (s), per stage the peak bytes per device and the most
    micro-batches in flight, the timeline of every task and every transfer."""

    iteration_time: float
    peak_memory: tuple[float, ...]
    max_in_flight: tuple[int, ...]
    timeline: tuple[SimTask, ...]
    transfers: tuple[SimTransfer, ...] = ()

    def stage_busy_time(self, stage: int) -> float:
        return sum(t.end - t.start for t in self.timeline if t.stage == stage)


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
    if plan.schedule not in SCHEDULE_KINDS:
        raise AlpaError(
            f"simulate: unknown schedule '{plan.schedule}'; known: {', '.join(SCHEDULE_KINDS)}"
        )
    for i, st in enumerate(plan.stages):
        for name in ("forward", "backward", "apply_grad"):
            _check_time(getattr(st, name), f"stage {i} {name}")
        for name in ("persistent_memory", "activation_memory"):
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


def simulate(plan: SimPlan, *, check_memory: bool = True) -> SimResult:
    """Simulate one iteration of ``plan`` (module docstring); raise PlanError
    when a stage runs out of device memory (unless ``check_memory`` is false)."""
    fwd_transfer, bwd_transfer = _validate(plan)
    num, b = len(plan.stages), plan.num_micro_batches
    clocks = schedule_clocks(num, b, plan.schedule)  # type: ignore[arg-type]
    orders: list[list[Task]] = [[] for _ in range(num)]
    for tasks in clocks:
        for task in tasks:
            orders[task.stage].append(task)

    in_flight = peak_in_flight(clocks, num)
    peaks = tuple(
        st.persistent_memory + n * st.activation_memory
        for st, n in zip(plan.stages, in_flight, strict=True)
    )
    if check_memory:
        for i, (st, peak, n) in enumerate(zip(plan.stages, peaks, in_flight, strict=True)):
            if peak > st.device_memory:
                raise PlanError(
                    f"simulate: stage {i} is out of memory under {plan.schedule}: it needs "
                    f"{peak / GiB:.3f} GiB per device ({st.persistent_memory / GiB:.3f} GiB "
                    f"persistent + {n} micro-batches x {st.activation_memory / GiB:.3f} GiB "
                    f"activations), the device has {st.device_memory / GiB:.3f} GiB"
                )

    end: dict[Task, float] = {}
    free = [0.0] * num
    # when each link is next free: (boundary, direction) -> time
    links: dict[tuple[int, str], float] = {}
    position = [0] * num
    timeline: list[SimTask] = []
    transfers: list[SimTransfer] = []
    remaining = sum(len(o) for o in orders)
    while remaining:
        progressed = False
        for s in range(num):
            while position[s] < len(orders[s]):
                task = orders[s][position[s]]
                arrival = _arrival(task, num, end, fwd_transfer, bwd_transfer, links)
                if arrival is None:
                    break
                ready, link = arrival
                if link is not None:
                    key, link_start, link_end = link
                    links[key] = link_end
                    boundary, direction = key
                    src, dst = (boundary, boundary + 1)[:: 1 if direction == "forward" else -1]
                    transfers.append(SimTransfer(src, dst, task.micro_batch, link_start, link_end))
                stage = plan.stages[s]
                duration = {
                    "forward": stage.forward,
                    "backward": stage.backward,
                    "apply_grad": stage.apply_grad,
                }[task.phase]
                start = max(free[s], ready)
                end[task] = free[s] = start + duration
                timeline.append(SimTask(s, task.phase, task.micro_batch, start, start + duration))
                position[s] += 1
                remaining -= 1
                progressed = True
        if not progressed:  # the schedule module guarantees dependency order
            raise AlpaError("simulate: the schedule deadlocks (a task waits on a later one)")
    return SimResult(
        iteration_time=max(t.end for t in timeline),
        peak_memory=peaks,
        max_in_flight=tuple(in_flight),
        timeline=tuple(timeline),
        transfers=tuple(transfers),
    )


def _arrival(
    task: Task,
    num_stages: int,
    end: dict[Task, float],
    fwd_transfer: list[float],
    bwd_transfer: list[float],
    links: dict[tuple[int, str], float],
) -> tuple[float, tuple[tuple[int, str], float, float] | None] | None:
    """When the inputs of ``task`` are available, and the link its input
    crossed with the transfer's start and the time that link is free again
    (its end); None if a producer has not
    run. A transfer starts when its producer ends and its link (a stage
    boundary, one per direction) has finished the transfer before it: links
    carry one micro-batch at a time, in order."""
    s, mb = task.stage, task.micro_batch
    ready = 0.0
    link = None
    if task.phase == "forward" and s > 0:
        producer, key, duration = (
            Task(s - 1, mb, "forward"),
            (s - 1, "forward"),
            fwd_transfer[s - 1],
        )
    elif task.phase == "backward" and s + 1 < num_stages:
        producer, key, duration = Task(s + 1, mb, "backward"), (s, "backward"), bwd_transfer[s]
    else:
        producer = None
    if task.phase == "backward":
        own = Task(s, mb, "forward")
        if own not in end:
            return None
        ready = end[own]
    if producer is not None:
        if producer not in end:
            return None
        start = max(end[producer], links.get(key, 0.0))
        ready = max(ready, start + duration)
        link = (key, start, start + duration)
    return ready, link


def eq2_latency(plan: SimPlan) -> float:
    """Alpa's Eq. 2, ``Σ t_i + (B − 1)·max t_i`` with ``t_i`` = forward + backward
    of stage ``i`` (no transfers, no apply-grad): the closed form to compare with."""
    times = [st.forward + st.backward for st in plan.stages]
    return sum(times) + (plan.num_micro_batches - 1) * max(times)


def plan_from_module(
    module: ModuleOp, cluster: Cluster, cost_model: StageCostModel | None = None
) -> SimPlan:
    """The :class:`SimPlan` of an outlined module (the pipeline IR contract): each
    stage's forward, backward and apply-grad functions priced by ``cost_model``
    (default: the analytical model) on its logical mesh, with α/β re-derived from
    ``cluster``; the parameters of a function are the call's operands that are
    non-batch arguments of ``@main``; a stage's persistent memory and activations
    are its forward function's (else its backward's). A ``pipeline.transfer``
    costs ``α + β·bytes`` (``pipeline.cross_bytes``, else the value's bytes) on the
    link between the first devices of its meshes, and counts at the stage
    boundary it crosses (forward values forward, backward values back)."""
    from alpa_ir.costs.stage_cost import AnalyticalStageCostModel

    model = cost_model or AnalyticalStageCostModel()
    plans = list(top_level_ops(module, PlanOp))
    if len(plans) != 1:
        raise AlpaError(f"simulate: the module needs one pipeline.plan, found {len(plans)}")
    plan = plans[0]
    assert isinstance(plan, PlanOp)
    main = main_function(module)
    batch_attr = main.attributes.get(BATCH_ATTR)
    batch = set(ints_of(batch_attr)) if isinstance(batch_attr, DenseArrayBase) else set()
    calls = {
        op.callee.root_reference.data: op
        for op in main.body.block.ops
        if isinstance(op, func.CallOp)
    }
    stage_of: dict[str, int] = {}
    mesh_stage: dict[str, int] = {}
    meshes: list[LogicalDeviceMesh] = []
    stages: list[SimStage] = []
    for index, stage in enumerate(plan_stages(module)):
        mesh_name = stage.mesh.root_reference.data
        mesh_op = symbol_op(module, mesh_name, LogicalMeshOp)
        assert isinstance(mesh_op, LogicalMeshOp)
        mesh = cluster.logical_mesh(mesh_op.mesh_shape, mesh_op.device_ids)
        meshes.append(mesh)
        mesh_stage[mesh_name] = index
        costs: dict[str, StageCost] = {}
        for phase, name in stage.phase_functions():
            stage_of[name] = index
            function = symbol_op(module, name, func.FuncOp)
            assert isinstance(function, func.FuncOp)
            call = calls.get(name)
            params = (
                [
                    k
                    for k, v in enumerate(call.operands)
                    if isinstance(v, BlockArgument)
                    and v.owner is main.body.block
                    and v.index not in batch
                ]
                if call is not None
                else []
            )
            cost = model.stage_cost(function, mesh, cluster, params)
            if phase in costs:  # a later apply-grad round runs after the first
                cost = replace(cost, latency=costs[phase].latency + cost.latency)
            costs[phase] = cost
        main_cost = costs.get("forward") or costs.get("backward")
        stages.append(
            SimStage(
                forward=costs["forward"].latency if "forward" in costs else 0.0,
                backward=costs["backward"].latency if "backward" in costs else 0.0,
                apply_grad=costs["apply_grad"].latency if "apply_grad" in costs else 0.0,
                persistent_memory=main_cost.memory.persistent if main_cost else 0.0,
                activation_memory=main_cost.memory.activations if main_cost else 0.0,
                device_memory=cluster.device_memory,
                num_devices=mesh.size,
            )
        )
    num = len(stages)
    forward, backward = [0.0] * (num - 1), [0.0] * (num - 1)
    for transfer in top_level_ops(module, TransferOp):
        assert isinstance(transfer, TransferOp)
        callee, _, result = transfer.value.data.partition(":")
        if callee not in stage_of:
            continue  # an argument of @main: placed by the driver
        src = stage_of[callee]
        dst = mesh_stage[transfer.dst_mesh.root_reference.data]
        if src == dst:
            continue
        nbytes_attr = transfer.attributes.get(CROSS_BYTES_ATTR)
        if isinstance(nbytes_attr, IntegerAttr):
            nbytes = float(nbytes_attr.value.data)
        else:
            function = symbol_op(module, callee, func.FuncOp)
            assert isinstance(function, func.FuncOp)
            ty = function.function_type.outputs.data[int(result)]
            nbytes = float(math.prod(shape_of(ty)) * dtype_of(ty).itemsize)
        link = cluster.logical_mesh((2,), (meshes[src].devices[0], meshes[dst].devices[0]))  # type: ignore[index]
        seconds = link.alpha[0] + link.beta[0] * nbytes  # type: ignore[index]
        if dst > src:
            forward[dst - 1] += seconds
        else:
            backward[dst] += seconds
    return SimPlan(
        tuple(stages),
        int(plan.num_micro_batches.value.data),
        plan.schedule.data,
        tuple(forward),
        tuple(backward),
    )


class SimulateBackend:
    """Backend ``simulate``: estimates instead of executing (see the module docstring)."""

    name = "simulate"

    def simulate(self, plan: SimPlan, *, check_memory: bool = True) -> SimResult:
        return simulate(plan, check_memory=check_memory)

    def compile(self, module: ModuleOp, cluster: Cluster | None = None) -> SimResult:
        """Estimate an outlined module on ``cluster`` (default: its ``mesh.cluster``)."""
        cluster = cluster or Cluster.of_module(module)
        if cluster is None:
            raise AlpaError(
                "simulate: the module has no mesh.cluster; pass a cluster "
                "(alpa_ir.hardware.clusters.get_cluster)"
            )
        return simulate(plan_from_module(module, cluster))


__all__ = [
    "SimPlan",
    "SimResult",
    "SimStage",
    "SimTask",
    "SimulateBackend",
    "eq2_latency",
    "simulate",
]
