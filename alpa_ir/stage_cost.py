"""The analytical stage cost model: latency per micro-batch and memory of a
stage's function on a logical mesh of a cluster, for stage construction
(Alpa §5.2: ``t_intra`` of Eq. 3 and the memory check of Eq. 5).

Alpa compiles and profiles every stage-mesh pair; this model predicts instead:

* **Plan.** The function is auto-sharded on the mesh with the existing
  ``auto-sharding`` pass (the ILP sees the mesh's α/β in microseconds, so that
  the cost model's tie-breaking constants, 0.1/0.01/0.001, stay tie-breakers).
* **Compute.** ``FLOPs per device / (peak × compute_efficiency)`` plus the
  memory-traffic term ``bytes read and written per device / (HBM bandwidth ×
  memory_efficiency)`` (:mod:`alpa_ir.flops`; per device = on the local blocks
  of the plan; no fusion is modelled, so the traffic term is an upper bound).
  The two add: the model assumes no overlap, like a roofline summed per op.
* **Communication.** The plan's explicit collectives priced with the mesh's
  real α (s) and β (s/byte): ``α + β·bytes on the wire`` per collective
  (ring bytes, :func:`alpa_ir.autosharding.cost_model.collective_bytes_on_wire`);
  a collective over several axes takes the slowest axis's α/β, as the α-β
  cost model does. The ILP objective is kept for reference only: its constants
  are not seconds.
* **Memory** per device, from the plan's local shapes: parameters (the
  arguments ``param_args``), gradients (``gradient_factor`` × parameters),
  optimizer state (``optimizer_state_factor`` × parameters; Adam keeps m and v:
  2) and the activations one micro-batch keeps: the peak of the live
  intermediate values in program order (results live to the end), which for a
  forward+backward function is the stash between forward and backward.
  A stage with ``s`` stages after it holds ``s + 1`` micro-batches under 1F1B,
  so ``max_stages_after = ⌊(memory − persistent − act) / act⌋`` (Eq. 5).

Results are cached per (structural fingerprint of the function, mesh shape
and α/β, device figures, options, parameter arguments): identical layer ranges
(the same ops on the same shapes, whatever their value names) are planned once.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Protocol

from xdsl.dialects import func
from xdsl.dialects.builtin import (
    ArrayAttr,
    DenseArrayBase,
    DictionaryAttr,
    FlatSymbolRefAttr,
    FloatAttr,
    ModuleOp,
    StringAttr,
)
from xdsl.ir import Block, SSAValue

from alpa_ir.autosharding.plan_bytes import op_collectives
from alpa_ir.clusters import Cluster
from alpa_ir.device_mesh import LogicalDeviceMesh
from alpa_ir.dialects.lax import LaxOp
from alpa_ir.dialects.lax_params import ints_of
from alpa_ir.dialects.mesh import MESH_ATTR
from alpa_ir.dialects.sharding import (
    SPEC_ATTR,
    CollectiveOp,
    spec_of_value,
)
from alpa_ir.errors import AlpaError
from alpa_ir.flops import function_flops, op_bytes
from alpa_ir.ir_types import dtype_of, shape_of
from alpa_ir.module_utils import main_function

BATCH_ATTR = "alpa.batch_args"
ILP_TIME_UNIT = 1e6
"""α/β are given to the ILP in microseconds (see the module docstring)."""


@dataclass(frozen=True)
class StageCostOptions:
    """Options of the analytical model (all part of the cache key)."""

    compute_efficiency: float = 0.5
    """Fraction of peak FLOP/s a stage reaches (large matmuls on GPUs: 0.4-0.7)."""
    memory_efficiency: float = 0.8
    """Fraction of the HBM bandwidth the memory-bound ops reach."""
    optimizer_state_factor: float = 2.0
    """Optimizer state per parameter byte (Adam: m and v, 2; SGD: 0)."""
    gradient_factor: float = 1.0
    """Gradient bytes per parameter byte."""
    solver: str = "cbc"
    time_limit: float = 60.0
    memory_budget: float = 0.0
    """Passed to auto-sharding (bytes per device; 0 = none)."""

    def __post_init__(self) -> None:
        for name in ("compute_efficiency", "memory_efficiency"):
            value = getattr(self, name)
            if not 0 < value <= 1:
                raise AlpaError(f"stage cost: {name} must be in (0, 1], got {value}")
        for name in ("optimizer_state_factor", "gradient_factor", "memory_budget"):
            if getattr(self, name) < 0:
                raise AlpaError(f"stage cost: {name} must be >= 0, got {getattr(self, name)}")


@dataclass(frozen=True)
class StageMemory:
    """Bytes per device of one stage (see the module docstring)."""

    parameters: float
    gradients: float
    optimizer_state: float
    activations: float
    """Kept per in-flight micro-batch."""

    @property
    def persistent(self) -> float:
        """Held for the whole iteration: parameters, gradients and optimizer state."""
        return self.parameters + self.gradients + self.optimizer_state

    def peak(self, in_flight: int) -> float:
        """Peak bytes per device with ``in_flight`` micro-batches' activations kept."""
        return self.persistent + in_flight * self.activations

    def max_stages_after(self, device_memory: float) -> float:
        """Eq. 5: the most later stages (1F1B keeps ``s + 1`` micro-batches) that
        fit in ``device_memory``; ``-1`` if not even one micro-batch fits,
        ``inf`` if activations take no memory."""
        free = device_memory - self.persistent - self.activations
        if free < 0:
            return -1
        if self.activations <= 0:
            return math.inf
        return float(math.floor(free / self.activations))


@dataclass(frozen=True)
class StageCost:
    """The predicted cost of one function (a stage's forward+backward ops, or one
    phase of it) on one logical mesh; times in seconds per micro-batch."""

    latency: float
    compute_time: float
    memory_time: float
    communication_time: float
    flops: float
    """Per device."""
    memory: StageMemory
    objective: float = 0.0
    """The auto-sharding ILP objective (reference only)."""
    num_collectives: int = 0

    def max_stages_after(self, device_memory: float) -> float:
        return self.memory.max_stages_after(device_memory)


class StageCostModel(Protocol):
    """What ``construct-stages`` asks of a stage cost model (plugin hook
    ``alpa_ir_stage_cost_models``: a factory called with no arguments)."""

    name: str

    def stage_cost(
        self,
        function: func.FuncOp,
        mesh: LogicalDeviceMesh,
        cluster: Cluster,
        param_args: Sequence[int] | None = None,
    ) -> StageCost: ...


@dataclass
class CacheStats:
    hits: int = 0
    misses: int = 0


@dataclass
class AnalyticalStageCostModel:
    """The analytical model (module docstring); keeps its own cache."""

    options: StageCostOptions = field(default_factory=StageCostOptions)
    name: str = "analytical"
    stats: CacheStats = field(default_factory=CacheStats)
    _cache: dict[tuple[object, ...], StageCost] = field(default_factory=dict, repr=False)

    def stage_cost(
        self,
        function: func.FuncOp,
        mesh: LogicalDeviceMesh,
        cluster: Cluster,
        param_args: Sequence[int] | None = None,
    ) -> StageCost:
        """The cost of ``function`` on ``mesh`` of ``cluster``. ``param_args``:
        the arguments that are parameters (default: those not in the function's
        ``alpa.batch_args``)."""
        params = _param_args(function, param_args)
        key = (
            function_fingerprint(function),
            mesh.shape,
            mesh.alpha,
            mesh.beta,
            cluster.peak_flops,
            cluster.hbm_bandwidth,
            self.options,
            params,
        )
        cached = self._cache.get(key)
        if cached is not None:
            self.stats.hits += 1
            return cached
        self.stats.misses += 1
        cost = self._compute(function, mesh, cluster, params)
        self._cache[key] = cost
        return cost

    def _compute(
        self,
        function: func.FuncOp,
        mesh: LogicalDeviceMesh,
        cluster: Cluster,
        params: tuple[int, ...],
    ) -> StageCost:
        planned = plan_function(function, mesh, self.options)
        shape = mesh.shape

        def local(value: SSAValue) -> tuple[int, ...]:
            return spec_of_value(value, planned).local_shape(shape_of(value.type), shape)

        flops = function_flops(planned, local)
        traffic = sum(op_bytes(op, local) for op in planned.body.block.ops if isinstance(op, LaxOp))
        compute = flops / (cluster.peak_flops * self.options.compute_efficiency)
        hbm = cluster.hbm_bandwidth * self.options.memory_efficiency
        memory_time = traffic / hbm if hbm > 0 else 0.0
        comm, count = collective_time(planned, mesh)
        memory = self._memory(planned, local, params)
        objective = planned.attributes.get("sharding.objective")
        return StageCost(
            latency=compute + memory_time + comm,
            compute_time=compute,
            memory_time=memory_time,
            communication_time=comm,
            flops=flops,
            memory=memory,
            objective=float(objective.value.data) if isinstance(objective, FloatAttr) else 0.0,
            num_collectives=count,
        )

    def _memory(self, planned: func.FuncOp, local: object, params: tuple[int, ...]) -> StageMemory:
        assert callable(local)

        def nbytes(value: SSAValue) -> float:
            return float(math.prod(local(value)) * dtype_of(value.type).itemsize)

        block = planned.body.block
        parameters = sum(nbytes(block.args[k]) for k in params)
        activations = peak_live_bytes(block, set(params), nbytes)
        return StageMemory(
            parameters=parameters,
            gradients=parameters * self.options.gradient_factor,
            optimizer_state=parameters * self.options.optimizer_state_factor,
            activations=activations,
        )


def _param_args(function: func.FuncOp, param_args: Sequence[int] | None) -> tuple[int, ...]:
    num = len(function.body.block.args)
    if param_args is None:
        attr = function.attributes.get(BATCH_ATTR)
        batch = set(ints_of(attr)) if isinstance(attr, DenseArrayBase) else set()
        return tuple(k for k in range(num) if k not in batch)
    params = tuple(sorted({int(k) for k in param_args}))
    bad = [k for k in params if not 0 <= k < num]
    if bad:
        raise AlpaError(
            f"stage cost: parameter argument {bad[0]} of @{function.sym_name.data} does not "
            f"exist (it has {num} arguments)"
        )
    return params


def plan_function(
    function: func.FuncOp, mesh: LogicalDeviceMesh, options: StageCostOptions
) -> func.FuncOp:
    """A copy of ``function`` auto-sharded on ``mesh`` (as ``@main`` of its own module)."""
    from alpa_ir.context import make_context
    from alpa_ir.passes.auto_sharding import AutoSharding

    clone = function.clone()
    clone.sym_name = StringAttr("main")
    clone.attributes.pop(MESH_ATTR, None)
    for field_name in ("arg_attrs", "res_attrs"):
        attrs = getattr(clone, field_name)
        if attrs is not None:
            setattr(
                clone,
                field_name,
                ArrayAttr(
                    [
                        DictionaryAttr({k: v for k, v in d.data.items() if k != SPEC_ATTR})
                        for d in attrs
                    ]
                ),
            )
    assert mesh.alpha is not None and mesh.beta is not None
    ilp_mesh = LogicalDeviceMesh(
        mesh.shape,
        tuple(a * ILP_TIME_UNIT for a in mesh.alpha),
        tuple(b * ILP_TIME_UNIT for b in mesh.beta),
        mesh.devices,
        mesh.axis_names,
    )
    mesh_op = ilp_mesh.to_op("mesh")
    clone.attributes[MESH_ATTR] = FlatSymbolRefAttr("mesh")
    module = ModuleOp([mesh_op, clone])
    AutoSharding(
        solver=options.solver, time_limit=options.time_limit, memory_budget=options.memory_budget
    ).apply(make_context(), module)
    return main_function(module)


def collective_time(function: func.FuncOp, mesh: LogicalDeviceMesh) -> tuple[float, int]:
    """Seconds of the explicit collectives of a planned function with the mesh's
    real α/β (slowest axis of each collective), and their number."""
    assert mesh.alpha is not None and mesh.beta is not None
    total, count = 0.0, 0
    for op in function.walk():
        if not isinstance(op, CollectiveOp):
            continue
        axes = op.mesh_axes if op.properties.get("axes") is not None else ()
        if not axes:
            continue  # a reshard that only slices locally
        alpha = max(mesh.alpha[a] for a in axes)
        beta = max(mesh.beta[a] for a in axes)
        for collective in op_collectives(op, function, mesh.shape):
            total += alpha + beta * collective.wire_bytes
            count += 1
    return total, count


def peak_live_bytes(block: Block, excluded_args: set[int], nbytes: object) -> float:
    """Peak bytes of the values live at once in ``block`` in program order: an
    argument (not excluded) from the start, a result from its op, each until
    its last use; returned values stay live to the end."""
    assert callable(nbytes)
    ops = list(block.ops)
    position = {op: i for i, op in enumerate(ops)}
    end = len(ops)

    def last_use(value: SSAValue, born: int) -> int:
        last = born
        for use in value.uses:
            user = use.operation
            while user.parent_block() is not block and user.parent_op() is not None:
                user = user.parent_op()  # a use inside a region counts at its op
            if user is block.last_op:
                return end
            last = max(last, position.get(user, born))
        return last

    delta = [0.0] * (end + 2)
    values: list[tuple[SSAValue, int]] = [
        (a, 0) for k, a in enumerate(block.args) if k not in excluded_args
    ]
    values += [(r, i) for i, op in enumerate(ops) for r in op.results]
    for value, born in values:
        if not value.uses and born == 0 and isinstance(value.owner, Block):
            continue  # an unused argument
        size = nbytes(value)
        delta[born] += size
        delta[last_use(value, born) + 1] -= size
    live, peak = 0.0, 0.0
    for d in delta:
        live += d
        peak = max(peak, live)
    return peak


def function_fingerprint(function: func.FuncOp) -> str:
    """A hash of the function's structure: argument and result types, and every
    op's name, properties, attributes (but plan annotations ``sharding.*`` and
    ``mesh.mesh``), result types and operand wiring, regions included. Value
    names, the function's name and its own attributes do not count."""
    ids: dict[SSAValue, str] = {}
    parts: list[str] = [str(function.function_type)]

    def visit_block(block: Block, prefix: str) -> None:
        for k, arg in enumerate(block.args):
            ids[arg] = f"{prefix}a{k}"
        parts.append(f"block {prefix} {[str(a.type) for a in block.args]}")
        for i, op in enumerate(block.ops):
            for k, res in enumerate(op.results):
                ids[res] = f"{prefix}{i}.{k}"
            operands = [ids.get(v, "?") for v in op.operands]
            props = sorted((k, str(v)) for k, v in op.properties.items())
            attrs = sorted(
                (k, str(v))
                for k, v in op.attributes.items()
                if not k.startswith("sharding.") and k != MESH_ATTR
            )
            parts.append(
                f"{op.name} {operands} {props} {attrs} {[str(r.type) for r in op.results]}"
            )
            for r, region in enumerate(op.regions):
                for b, inner in enumerate(region.blocks):
                    visit_block(inner, f"{prefix}{i}r{r}b{b}/")

    visit_block(function.body.block, "")
    return hashlib.sha256("\n".join(parts).encode()).hexdigest()


__all__ = [
    "AnalyticalStageCostModel",
    "StageCost",
    "StageCostModel",
    "StageCostOptions",
    "StageMemory",
    "collective_time",
    "function_fingerprint",
    "peak_live_bytes",
    "plan_function",
]
