"""Predicted peak bytes per device of a *planned* module, read from the plan
itself (the specs every value carries after ``auto-sharding`` or
``shard-stages``): nothing is planned again and nothing compiles, so a plan
that cannot fit is refused before XLA runs.

* **One SPMD program** (:func:`program_memory`, ``ShardParallel``): in the
  terms of XLA's ``compiled.memory_analysis()``: the arguments (each on its
  local shape; batch arguments ``B`` times over when ``B`` micro-batches are
  passed at once), the outputs, the temporaries (the peak of the values live
  at once in program order that are neither arguments nor outputs,
  :func:`~alpa_ir.costs.live_memory.peak_live_bytes`; by default every op's
  result is materialized, an upper bound; with ``fusion`` only the fusion
  outputs of :mod:`alpa_ir.costs.fusion`, which may fall short of XLA's),
  plus what running the reduce-scatters and all-gathers combined adds
  (:func:`combined_collective_nbytes`),
  less the donated arguments whose buffers hold outputs. ``peak = arguments +
  outputs + temporaries − aliased``, as XLA adds them. With gradient
  accumulation over ``B`` micro-batches XLA sees the ``B`` micro-batch
  computations unrolled (:mod:`alpa_ir.backends.spmd`) and may schedule them
  side by side: the temporaries are ``B`` times one micro-batch's, an upper
  bound (XLA's CPU compiler kept 1.5-2.6 times one micro-batch's on the small
  MLP and GPT of ``tests/pipeline/test_plan_memory.py``).
* **A pipeline** (:func:`pipeline_memory`, ``PipeshardParallel``): per stage,
  on one device of its mesh, what the mesh holds for the whole step (the
  ``@main`` arguments its functions take: parameters, optimizer state), the
  gradients it accumulates over the micro-batches (results of its forward or
  backward that its apply-grad takes), the stash of one micro-batch (its
  forward's batch and received inputs and the results it keeps for its
  backward), times the micro-batches in flight under the plan's schedule
  (:func:`~alpa_ir.pipeline.task_order.peak_stage_in_flight`, as the ``simulate``
  backend counts them), plus the largest temporaries of one of its forward or
  backward runs; or, when the apply-grad runs (the stashes are gone), its
  new state and temporaries beside the old state and the gradients: the
  larger of the two phases.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from xdsl.dialects import func
from xdsl.dialects.builtin import DenseArrayBase, ModuleOp, TensorType
from xdsl.ir import BlockArgument, SSAValue

from alpa_ir.costs.live_memory import peak_live_bytes
from alpa_ir.dialects.attrs import BATCH_ATTR
from alpa_ir.dialects.lax_attrs import ints_of
from alpa_ir.dialects.mesh import LogicalMeshOp
from alpa_ir.dialects.pipeline import PlanOp, StageOp, plan_stages
from alpa_ir.dialects.sharding import (
    SPEC_ATTR,
    AllGatherOp,
    ReduceScatterOp,
    ShardingSpec,
    ShardingSpecAttr,
    spec_of_value,
)
from alpa_ir.dialects.types import KeyType, numpy_dtype, shape_of
from alpa_ir.ir.module_utils import main_function, symbol_op, top_level_ops
from alpa_ir.pipeline.schedule_kinds import ScheduleBuilder, order_of_plan
from alpa_ir.pipeline.task_order import peak_stage_in_flight


@dataclass(frozen=True)
class ProgramMemory:
    """Predicted bytes per device of one SPMD program, split as XLA's
    ``memory_analysis`` splits them (module docstring)."""

    arguments: float
    outputs: float
    temporaries: float
    aliased: float = 0.0
    """Donated argument bytes whose buffers hold outputs (counted once)."""

    @property
    def peak(self) -> float:
        return self.arguments + self.outputs + self.temporaries - self.aliased


@dataclass(frozen=True)
class StagePeak:
    """Predicted bytes per device of one pipeline stage (module docstring)."""

    stage: int
    mesh_shape: tuple[int, ...]
    held: float
    """``@main`` arguments the stage's functions take, for the whole step."""
    gradients: float
    """Accumulated over the micro-batches, held until the apply-grad."""
    stash: float
    """Per micro-batch in flight."""
    in_flight: int
    temporaries: float
    """The largest of one forward or backward run's own values."""
    apply_grad: float = 0.0
    """The apply-grad's new state and temporaries, beside the old state."""
    mesh: str = ""
    """The mesh's name (several stages may share one: virtual stages)."""

    @property
    def peak(self) -> float:
        running = self.in_flight * self.stash + self.temporaries
        return self.held + self.gradients + max(running, self.apply_grad)


def _value_nbytes(value: SSAValue, spec: ShardingSpec, mesh_shape: Sequence[int]) -> float:
    ty = value.type
    if not isinstance(ty, TensorType):
        return 0.0
    element = ty.element_type
    itemsize = element.itemsize if isinstance(element, KeyType) else numpy_dtype(element).itemsize
    return float(math.prod(spec.local_shape(shape_of(ty), mesh_shape)) * itemsize)


def local_nbytes(value: SSAValue, function: func.FuncOp, mesh_shape: Sequence[int]) -> float:
    """Bytes of ``value``'s block on one device, by its spec in ``function``'s plan."""
    return _value_nbytes(value, spec_of_value(value, function), mesh_shape)


def returned_nbytes(function: func.FuncOp, index: int, mesh_shape: Sequence[int]) -> float:
    """Bytes on one device of result ``index`` of ``function``, in the spec it is
    delivered in (``sharding.spec`` of its result attributes, else its value's)."""
    value = function.body.block.last_op.operands[index]  # type: ignore[union-attr]
    attrs = function.res_attrs
    entry = attrs.data[index].data.get(SPEC_ATTR) if attrs is not None else None  # type: ignore[attr-defined]
    if isinstance(entry, ShardingSpecAttr):
        return _value_nbytes(value, entry.spec, mesh_shape)
    return local_nbytes(value, function, mesh_shape)


def temporary_nbytes(
    function: func.FuncOp, mesh_shape: Sequence[int], *, fusion: bool = False
) -> float:
    """The peak bytes on one device of the values of ``function`` that are
    neither its arguments nor its results, live at once in program order."""
    block = function.body.block
    returned = {id(v) for v in block.last_op.operands}  # type: ignore[union-attr]

    def nbytes(value: SSAValue) -> float:
        return 0.0 if id(value) in returned else local_nbytes(value, function, mesh_shape)

    excluded = set(range(len(block.args)))
    return peak_live_bytes(block, excluded, nbytes, fusion=fusion)


def _outputs_nbytes(function: func.FuncOp, mesh_shape: Sequence[int]) -> float:
    """Bytes of the distinct values ``function`` returns (one buffer each)."""
    operands = function.body.block.last_op.operands  # type: ignore[union-attr]
    first = {id(v): k for k, v in reversed(list(enumerate(operands)))}
    return sum(returned_nbytes(function, k, mesh_shape) for k in first.values())


def combined_collective_nbytes(function: func.FuncOp, mesh_shape: Sequence[int]) -> float:
    """Bytes the SPMD program adds to run its reduce-scatters and all-gathers
    combined (:mod:`alpa_ir.backends.collective_combining`), an upper bound:
    the gradients are held until the one reduce-scatter, beside the buffer
    that concatenates them (twice their bytes); the gathered buffer beside the
    values cut from it (the gathered bytes). A lone collective adds nothing."""
    scattered = [
        local_nbytes(op.operands[0], function, mesh_shape)
        for op in function.body.block.ops
        if isinstance(op, ReduceScatterOp)
    ]
    gathered = [
        local_nbytes(op.results[0], function, mesh_shape)
        for op in function.body.block.ops
        if isinstance(op, AllGatherOp)
    ]
    return max(
        2 * sum(scattered) if len(scattered) > 1 else 0.0,
        sum(gathered) if len(gathered) > 1 else 0.0,
    )


def program_memory(
    function: func.FuncOp,
    mesh_shape: Sequence[int],
    *,
    donated: Iterable[int] = (),
    batch_args: Iterable[int] = (),
    num_micro_batches: int = 1,
    fusion: bool = False,
) -> ProgramMemory:
    """The predicted memory of ``function``'s plan run as one SPMD program on a
    mesh of ``mesh_shape`` (module docstring). ``donated``: the arguments whose
    buffers the program reuses for outputs; ``batch_args``: the arguments
    passed ``num_micro_batches`` at once."""
    args = function.body.block.args
    batch = set(batch_args)
    arguments = sum(
        local_nbytes(a, function, mesh_shape) * (num_micro_batches if k in batch else 1)
        for k, a in enumerate(args)
    )
    aliased = sum(local_nbytes(args[k], function, mesh_shape) for k in set(donated))
    temporaries = temporary_nbytes(function, mesh_shape, fusion=fusion) * num_micro_batches
    temporaries += combined_collective_nbytes(function, mesh_shape)
    return ProgramMemory(
        arguments=arguments,
        outputs=_outputs_nbytes(function, mesh_shape),
        temporaries=temporaries,
        aliased=aliased,
    )


# -- pipelines -----------------------------------------------------------------------


@dataclass(frozen=True)
class _Calls:
    """The ``@main`` of an outlined module: its calls by callee, batch arguments."""

    main: func.FuncOp
    calls: dict[str, func.CallOp]
    batch: frozenset[int]

    @staticmethod
    def of(module: ModuleOp) -> _Calls:
        main = main_function(module)
        calls = {
            op.callee.root_reference.data: op
            for op in main.body.block.ops
            if isinstance(op, func.CallOp)
        }
        attr = main.attributes.get(BATCH_ATTR)
        batch = frozenset(ints_of(attr)) if isinstance(attr, DenseArrayBase) else frozenset()
        return _Calls(main, calls, batch)

    def main_argument(self, value: SSAValue) -> int | None:
        """The index of ``value`` among ``@main``'s arguments, None if it is not one."""
        if isinstance(value, BlockArgument) and value.owner is self.main.body.block:
            return value.index
        return None


def _function(module: ModuleOp, name: str) -> func.FuncOp:
    function = symbol_op(module, name, func.FuncOp)
    assert isinstance(function, func.FuncOp)
    return function


def _stage_peak(
    module: ModuleOp, calls: _Calls, stage: StageOp, index: int, in_flight: int, fusion: bool
) -> StagePeak:
    mesh_op = symbol_op(module, stage.mesh.root_reference.data, LogicalMeshOp)
    assert isinstance(mesh_op, LogicalMeshOp)
    shape = mesh_op.mesh_shape
    phases = [(p, n, _function(module, n)) for p, n in stage.phase_functions() if n in calls.calls]
    held: dict[int, float] = {}
    stash, gradients, temporaries, apply_grad = 0.0, 0.0, 0.0, 0.0
    apply_operands = {
        id(v) for p, n, _ in phases if p == "apply_grad" for v in calls.calls[n].operands
    }
    for phase, name, function in phases:
        call = calls.calls[name]
        for k, operand in enumerate(call.operands):
            arg = calls.main_argument(operand)
            nbytes = local_nbytes(function.args[k], function, shape)
            if arg is not None and arg not in calls.batch:
                held[arg] = max(held.get(arg, 0.0), nbytes)
            elif phase == "forward":  # the batch and the activations received
                stash += nbytes
        if phase == "apply_grad":
            outputs = _outputs_nbytes(function, shape)
            apply_grad += outputs + temporary_nbytes(function, shape, fusion=fusion)
            apply_grad += combined_collective_nbytes(function, shape)
            continue
        own = temporary_nbytes(function, shape, fusion=fusion)
        temporaries = max(temporaries, own + combined_collective_nbytes(function, shape))
        for k, result in enumerate(call.results):
            nbytes = returned_nbytes(function, k, shape)
            if id(result) in apply_operands:
                gradients += nbytes
            elif phase == "forward":
                stash += nbytes
    return StagePeak(
        index,
        shape,
        sum(held.values()),
        gradients,
        stash,
        in_flight,
        temporaries,
        apply_grad,
        stage.mesh.root_reference.data,
    )


def pipeline_memory(
    module: ModuleOp,
    *,
    fusion: bool = False,
    schedules: Mapping[str, ScheduleBuilder] | None = None,
) -> tuple[StagePeak, ...]:
    """The predicted memory of each stage of an outlined, sharded pipeline
    module, on one device of its mesh (module docstring; ``fusion``: the
    temporaries under XLA's fusion model; ``schedules``: plugin schedule
    builders by name)."""
    plan = next(iter(top_level_ops(module, PlanOp)))
    assert isinstance(plan, PlanOp)
    stages = plan_stages(module)
    b = int(plan.num_micro_batches.value.data)
    meshes = [stage.mesh.root_reference.data for stage in stages]
    order = order_of_plan(
        plan.schedule.data,
        meshes,
        b,
        plan.in_flight_caps(),
        plan.stage_phase_times(),
        schedules=schedules,
    )
    in_flight = peak_stage_in_flight(order)
    calls = _Calls.of(module)
    return tuple(
        _stage_peak(module, calls, stage, i, in_flight[i], fusion) for i, stage in enumerate(stages)
    )


__all__ = [
    "ProgramMemory",
    "StagePeak",
    "local_nbytes",
    "pipeline_memory",
    "program_memory",
    "returned_nbytes",
    "temporary_nbytes",
]
