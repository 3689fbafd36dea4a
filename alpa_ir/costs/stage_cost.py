"""The analytical stage cost model: latency per micro-batch and memory of a
stage's function on a logical mesh of a cluster, for stage construction
(Alpa §5.2: ``t_intra`` of Eq. 3 and the memory check of Eq. 5).

Alpa compiles and profiles every stage-mesh pair; this model predicts instead:

* **Plan.** The function is auto-sharded on the mesh with the existing
  ``auto-sharding`` pass (the ILP sees the mesh's α/β in microseconds, so that
  the cost model's tie-breaking constants, 0.1/0.01/0.001, stay tie-breakers).
* **Compute.** ``FLOPs per device / (peak × compute_efficiency)`` plus the
  memory-traffic term ``bytes read and written per device / (HBM bandwidth ×
  memory_efficiency)`` (:mod:`alpa_ir.costs.flops`; per device = on the local blocks
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
  so ``max_stages_after = ⌊(memory − persistent − transient − act) / act⌋``
  (Eq. 5; the transient is 0 without rematerialization).
* **Rematerialization** (option ``remat``; Alpa's benchmarks checkpoint every
  layer): a stage keeps per in-flight micro-batch only its layer inputs, here
  the function's non-parameter arguments that its forward pass uses (the batch
  and the boundary tensors from earlier layers, local bytes on the plan; not
  the gradients arriving from later layers, which are consumed when they
  arrive). Which arguments those are is read from program order
  (:func:`forward_inputs`: an argument first used after the function's first
  result is produced is a gradient). Recomputing the forward when its backward runs brings
  back the whole stash once: ``transient = peak live bytes − kept``, counted
  once per stage, not per in-flight micro-batch (with one micro-batch in
  flight the peak is the one without remat). The function is one remat
  segment: a one-layer function (``construct-stages`` in ``layer-sum`` mode)
  is exactly per-layer checkpointing, and summing layers adds their kept
  inputs while the transient is the largest layer's (``ViewCost``); a
  multi-layer function (``range`` mode) is checkpointed at its inputs only
  (the inner layer boundaries are not visible in it), which keeps less and
  recomputes more at once. The time: one more forward pass,
  ``recompute_time = FORWARD_SHARE × (compute + memory traffic)``, the
  forward's share of the work when backward matmuls cost twice the forward
  ones (the same 1:2 split ``alpa-bench`` uses to give the simulator forward
  and backward times). The forward's collectives are not counted again (a
  recomputed Megatron-style forward would repeat its all-reduces; a data
  parallel one has none).
* **ZeRO** (option ``zero``, ZeRO-2): the gradients and optimizer state of a
  parameter that the plan replicates over mesh axes are partitioned over those
  axes (a reduce-scatter and an all-gather instead of the all-reduce: the same
  bytes on the wire, so no time is added); parameters stay whole.
* **Fixed argument shardings** (option ``keep_argument_specs``): the
  function's argument annotations (``sharding.spec`` in ``arg_attrs``) are
  kept as constraints of the ILP (a baseline's hand-written strategy, e.g.
  ``alpa-bench``'s DeepSpeed-style expert parallelism); otherwise they are
  dropped and the ILP chooses.

Results are cached per (structural fingerprint of the function, mesh shape
and α/β, device figures, options, parameter arguments): identical layer ranges
(the same ops on the same shapes, whatever their value names) are planned once.
A view is planned on its *live* axes: an axis whose size divides no dimension
of the function can split nothing, so (5, 8) costs what (1, 8) does, except
that ZeRO also partitions over its replicas (:meth:`AnalyticalStageCostModel.adjust`).
The functions planned on one mesh share their strategies
(:class:`~alpa_ir.autosharding.graph.StrategyCache`), and ILP plans within
``mip_gap`` (1%) of the LP bound are accepted. The model can be run in worker
processes (:class:`ParallelStageCostModel`, :mod:`alpa_ir.costs.costing_workers`).
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any, Literal, Protocol, runtime_checkable

import numpy as np
import numpy.typing as npt
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
from xdsl.ir import Block, Operation, SSAValue

from alpa_ir.autosharding.cost_model import CommCostModel, bound_to_cluster, prices_by_devices
from alpa_ir.autosharding.graph import StrategyCache
from alpa_ir.autosharding.plan_bytes import op_collectives
from alpa_ir.costs.flops import function_flops, op_bytes
from alpa_ir.costs.fusion import fused_live_ranges, fused_traffic_bytes, merge_identity_ranges
from alpa_ir.dialects.attrs import BATCH_ATTR
from alpa_ir.dialects.lax import LaxOp
from alpa_ir.dialects.lax_params import ints_of
from alpa_ir.dialects.mesh import MESH_ATTR
from alpa_ir.dialects.sharding import (
    SPEC_ATTR,
    CollectiveOp,
    ShardingSpec,
    spec_of_value,
)
from alpa_ir.dialects.types import dtype_of, shape_of
from alpa_ir.errors import AlpaError
from alpa_ir.hardware.clusters import Cluster
from alpa_ir.hardware.device_mesh import LogicalDeviceMesh
from alpa_ir.ir.module_utils import main_function

if TYPE_CHECKING:
    from alpa_ir.plugins.registry import PluginRegistry

ILP_TIME_UNIT = 1e6
"""α/β are given to the ILP in microseconds (see the module docstring)."""
FORWARD_SHARE = 1.0 / 3.0
"""The forward pass's share of a forward+backward function's work (backward
matmuls: the gradients of both operands, twice the forward FLOPs)."""


MEMORY_FALLBACK_FROM = 1 / 256
"""``memory_fallback`` plans again where persistent bytes reach this share of
the device memory (64 MiB of 16 GiB). Smaller layers take little even
replicated; larger ones add up: with a layer per block, a stage holds tens of
them (the 0.4 GiB dense layers of MoE-27B on 32 devices come to 3.3 GiB
replicated where sharded they take 0.2)."""
MEMORY_FALLBACK_TIME_LIMIT = 15.0
"""Seconds for the ILP of the second plan: with no parameter replicated its LP
relaxation is seldom integral, and the best plan found by then is kept."""


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
    mip_gap: float = 0.01
    """Plans within this relative gap of the ILP's lower bound are accepted
    (the prediction's own error is far larger than 1%); 0: exact."""
    memory_budget: float = 0.0
    """Passed to auto-sharding (bytes per device; 0 = none)."""
    remat: bool = False
    """Rematerialize every layer (module docstring): keep layer inputs only."""
    zero: bool = False
    """ZeRO-2: gradients and optimizer state partitioned where parameters are replicated."""
    keep_argument_specs: bool = False
    """Keep the function's argument sharding annotations as ILP constraints."""
    allow_all_gather: bool = True
    """Passed to auto-sharding: may the plan all-gather (e.g. a split weight)?"""
    allow_replicated_parameters: bool = True
    """Passed to auto-sharding: may the plan keep a parameter whole on every device?"""
    memory_fallback: bool = False
    """Also plan with ``allow_replicated_parameters`` off (every parameter sharded:
    operator parallelism or ZeRO-3-style gathering, whichever the ILP finds
    cheaper) where the first plan's persistent bytes are at least
    ``MEMORY_FALLBACK_FROM`` of the device memory, and offer it as
    ``StageCost.memory_saving``: a stage of several such layers may fit only
    that way. Like Alpa, which profiles several auto-sharding options per
    logical mesh and keeps the fastest that fits."""
    fusion: bool = False
    """Model XLA's fusion (:mod:`alpa_ir.costs.fusion`) in the activation memory and
    the memory traffic: only fusion outputs are materialized."""
    cost_model: str = "auto"
    """Passed to auto-sharding: the registered communication cost model of the
    plans, bound to the stage's cluster if it can be (``auto``: ``calibrated``
    on GPU clusters, ``alpha-beta`` elsewhere); the stage's communication time
    is priced by the same model."""
    repeated_layers: Literal["auto", "share", "separate"] = "auto"
    """Passed to auto-sharding: ``share`` plans the copies of a repeated block
    alike (one ILP variable for all copies: a smaller ILP, a plan at most a few
    per cent dearer), ``separate`` plans each copy, ``auto`` shares on large graphs."""

    def __post_init__(self) -> None:
        for name in ("compute_efficiency", "memory_efficiency"):
            value = getattr(self, name)
            if not 0 < value <= 1:
                raise AlpaError(f"stage cost: {name} must be in (0, 1], got {value}")
        for name in ("optimizer_state_factor", "gradient_factor", "memory_budget"):
            if getattr(self, name) < 0:
                raise AlpaError(f"stage cost: {name} must be >= 0, got {getattr(self, name)}")
        if not 0 <= self.mip_gap < 1:
            raise AlpaError(f"stage cost: mip_gap must be in [0, 1), got {self.mip_gap}")


@dataclass(frozen=True)
class StageMemory:
    """Bytes per device of one stage (see the module docstring)."""

    parameters: float
    gradients: float
    optimizer_state: float
    activations: float
    """Kept per in-flight micro-batch."""
    transient: float = 0.0
    """Held once at the peak, not per micro-batch: with remat, the stash of the
    layer being recomputed beyond its kept inputs."""

    @property
    def persistent(self) -> float:
        """Held for the whole iteration: parameters, gradients and optimizer state."""
        return self.parameters + self.gradients + self.optimizer_state

    def peak(self, in_flight: int) -> float:
        """Peak bytes per device with ``in_flight`` micro-batches' activations kept."""
        return self.persistent + self.transient + in_flight * self.activations

    def max_stages_after(self, device_memory: float) -> float:
        """Eq. 5 (:func:`max_stages_after`) for this stage."""
        return float(
            max_stages_after(device_memory, self.persistent + self.transient, self.activations)
        )


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
    recompute_time: float = 0.0
    """With remat: the extra forward pass (part of ``latency``)."""
    memory_saving: StageCost | None = None
    """With ``memory_fallback``: the plan with every parameter sharded, a second
    choice for the same function on the same mesh (``construct-stages`` takes
    whichever is fastest among those that fit)."""

    def max_stages_after(self, device_memory: float) -> float:
        return self.memory.max_stages_after(device_memory)


class StageCostModel(Protocol):
    """What ``construct-stages`` asks of a stage cost model (plugin hook
    ``alpa_ir_stage_cost_models``: a factory called with the
    :class:`StageCostOptions` of ``construct-stages``)."""

    name: str

    def stage_cost(
        self,
        function: func.FuncOp,
        mesh: LogicalDeviceMesh,
        cluster: Cluster,
        param_args: Sequence[int] | None = None,
    ) -> StageCost: ...


@runtime_checkable
class ParallelStageCostModel(StageCostModel, Protocol):
    """A stage cost model that ``construct-stages`` may run in worker processes
    (:mod:`alpa_ir.costs.costing_workers`): it names what a cost depends on, so that
    equal pairs are costed once, and makes fresh copies of itself for the
    workers. (A model that measures on the local devices is not one: parallel
    runs would disturb each other's timings.)"""

    def cache_key(
        self,
        function: func.FuncOp,
        mesh: LogicalDeviceMesh,
        cluster: Cluster,
        param_args: Sequence[int] | None = None,
    ) -> Hashable:
        """Pairs with equal keys have equal :meth:`keyed_cost`."""
        ...

    def keyed_cost(
        self,
        function: func.FuncOp,
        mesh: LogicalDeviceMesh,
        cluster: Cluster,
        param_args: Sequence[int] | None = None,
    ) -> StageCost:
        """What a worker computes for a pair."""
        ...

    def adjustment(self, function: func.FuncOp, mesh: LogicalDeviceMesh) -> Hashable:
        """What turns :meth:`keyed_cost` into ``stage_cost`` for this pair."""
        ...

    def adjust(self, cost: StageCost, adjustment: Hashable) -> StageCost:
        """``stage_cost`` is ``adjust(keyed_cost(...), adjustment(...))``."""
        ...

    def remember(self, key: Hashable, cost: StageCost) -> None: ...

    def worker_copy(self) -> StageCostModel: ...


@dataclass
class CacheStats:
    hits: int = 0
    misses: int = 0


def cached_cost(
    cache: dict[tuple[object, ...], StageCost],
    stats: CacheStats,
    key: tuple[object, ...],
    compute: Callable[[], StageCost],
) -> StageCost:
    """``cache[key]``, computed by ``compute`` on a miss; counts hits and misses."""
    cached = cache.get(key)
    if cached is not None:
        stats.hits += 1
        return cached
    stats.misses += 1
    cost = cache[key] = compute()
    return cost


def mesh_key(mesh: LogicalDeviceMesh, *, keep_axis_order: bool = False) -> tuple[object, ...]:
    """What a plan's cost depends on in ``mesh``: its axes of more than one
    device with their α and β. Unless ``keep_axis_order`` (argument shardings
    name axes by position), the axes are sorted: permuting a mesh's axes with
    their α/β permutes the plans and keeps their costs, so the views (2, 4) and
    (4, 2) of one node, or (1, 16) and (16, 1) of two, are planned once."""
    assert mesh.alpha is not None and mesh.beta is not None
    if keep_axis_order:
        return (mesh.shape, mesh.alpha, mesh.beta)
    axes = [(n, a, b) for n, a, b in zip(mesh.shape, mesh.alpha, mesh.beta, strict=True) if n > 1]
    return (tuple(sorted(axes)),)


@dataclass
class AnalyticalStageCostModel:
    """The analytical model (module docstring); keeps its own cache."""

    options: StageCostOptions = field(default_factory=StageCostOptions)
    name: str = "analytical"
    stats: CacheStats = field(default_factory=CacheStats)
    _cache: dict[tuple[object, ...], StageCost] = field(default_factory=dict, repr=False)
    _strategies: dict[tuple[object, ...], StrategyCache] = field(default_factory=dict, repr=False)
    """Per ILP mesh (shape, α, β) and reshard options: the strategies every
    function planned on it shares (``StrategyCache``)."""
    _pricers: dict[tuple[str, Cluster], object] = field(default_factory=dict, repr=False)
    """Per cost model name and cluster: the bound model that prices the collectives."""
    _fingerprint: tuple[func.FuncOp, str, frozenset[int]] | None = field(default=None, repr=False)
    """The last function, its fingerprint and its dimension sizes: a cost table
    asks for one function on every view in turn."""

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
        cost = self.keyed_cost(function, mesh, cluster, param_args)
        return self.adjust(cost, self.adjustment(function, mesh))

    def keyed_cost(
        self,
        function: func.FuncOp,
        mesh: LogicalDeviceMesh,
        cluster: Cluster,
        param_args: Sequence[int] | None = None,
    ) -> StageCost:
        """The cost kept under :meth:`cache_key`: that of ``function`` on the
        mesh's live axes (:meth:`live_mesh`), before :meth:`adjust`."""
        params = param_args_of(function, param_args)
        key = self.cache_key(function, mesh, cluster, params)
        live = self.live_mesh(function, mesh)
        return cached_cost(
            self._cache, self.stats, key, lambda: self._compute(function, live, cluster, params)
        )

    def cache_key(
        self,
        function: func.FuncOp,
        mesh: LogicalDeviceMesh,
        cluster: Cluster,
        param_args: Sequence[int] | None = None,
    ) -> tuple[object, ...]:
        """What :meth:`keyed_cost` depends on: equal keys, equal costs (the
        module docstring)."""
        params = param_args_of(function, param_args)
        return (
            self._identity(function)[1],
            *mesh_key(
                self.live_mesh(function, mesh), keep_axis_order=self.options.keep_argument_specs
            ),
            cluster.peak_flops,
            cluster.hbm_bandwidth,
            self.options,
            params,
            _argument_specs(function) if self.options.keep_argument_specs else (),
        )

    def live_mesh(self, function: func.FuncOp, mesh: LogicalDeviceMesh) -> LogicalDeviceMesh:
        """``mesh`` with every axis that can split none of the function's
        dimensions (no dimension size divides by the axis size) set to size 1:
        no plan can use such an axis, so the plans, their communication, FLOPs
        and local shapes are those of the live axes (ZeRO's partitions, which
        use every replica, are :meth:`adjust`'s business). Views such as
        (5, 8) and (1, 8) of a model of power-of-two dimensions are then
        planned once. Not with fixed argument shardings (axes by position)."""
        if self.options.keep_argument_specs:
            return mesh
        dims = self._identity(function)[2]
        shape = tuple(n if any(d % n == 0 for d in dims) else 1 for n in mesh.shape)
        if shape == mesh.shape:
            return mesh
        return LogicalDeviceMesh(shape, mesh.alpha, mesh.beta, axis_names=mesh.axis_names)

    def adjustment(self, function: func.FuncOp, mesh: LogicalDeviceMesh) -> int:
        """What :meth:`adjust` needs to turn :meth:`keyed_cost`'s cost into the
        cost on ``mesh`` itself: the replicas along the dead axes."""
        return mesh.size // self.live_mesh(function, mesh).size

    def adjust(self, cost: StageCost, adjustment: Hashable) -> StageCost:
        """With ZeRO, the gradients and optimizer state are also partitioned
        over the replicas along the dead axes (``adjustment`` of them)."""
        assert isinstance(adjustment, int)
        if adjustment == 1 or not self.options.zero:
            return cost
        return _spread(cost, adjustment)

    def _identity(self, function: func.FuncOp) -> tuple[func.FuncOp, str, frozenset[int]]:
        if self._fingerprint is None or self._fingerprint[0] is not function:
            self._fingerprint = (
                function,
                function_fingerprint(function),
                function_dimensions(function),
            )
        return self._fingerprint

    def remember(self, key: tuple[object, ...], cost: StageCost) -> None:
        """Keep ``cost``, computed elsewhere (a worker process), under ``key``."""
        self.stats.misses += 1
        self._cache[key] = cost

    def worker_copy(self) -> AnalyticalStageCostModel:
        """A model with the same options and empty caches, for a worker process."""
        return AnalyticalStageCostModel(self.options)

    def _compute(
        self,
        function: func.FuncOp,
        mesh: LogicalDeviceMesh,
        cluster: Cluster,
        params: tuple[int, ...],
    ) -> StageCost:
        cost = self._plan_and_price(function, mesh, cluster, params, self.options)
        if not (self.options.memory_fallback and mesh.size > 1 and params):
            return cost
        if cost.memory.persistent < cluster.device_memory * MEMORY_FALLBACK_FROM:
            return cost
        sharded_options = replace(
            self.options,
            allow_replicated_parameters=False,
            time_limit=min(self.options.time_limit, MEMORY_FALLBACK_TIME_LIMIT),
        )
        try:
            sharded = self._plan_and_price(function, mesh, cluster, params, sharded_options)
        except AlpaError:
            return cost  # some parameter cannot be sharded on this mesh
        if sharded.memory.persistent >= cost.memory.persistent:
            return cost
        return replace(cost, memory_saving=sharded)

    def _plan_and_price(
        self,
        function: func.FuncOp,
        mesh: LogicalDeviceMesh,
        cluster: Cluster,
        params: tuple[int, ...],
        options: StageCostOptions,
    ) -> StageCost:
        if mesh.size == 1 and not options.keep_argument_specs:
            # one device: every plan keeps every value whole and moves nothing,
            # so the function as it is prices the same as its ILP plan would
            planned = function
        else:
            planned = plan_function(function, mesh, options, self._strategies, cluster=cluster)
        shape = mesh.shape

        local_shapes: dict[SSAValue, tuple[int, ...]] = {}

        def local(value: SSAValue) -> tuple[int, ...]:
            # asked for many times per value (FLOPs, traffic, liveness, memory)
            found = local_shapes.get(value)
            if found is None:
                found = local_shapes[value] = spec_of_value(value, planned).local_shape(
                    shape_of(value.type), shape
                )
            return found

        flops = function_flops(planned, local)
        block = planned.body.block
        traffic = (
            fused_traffic_bytes(block, local)
            if options.fusion
            else sum(op_bytes(op, local) for op in block.ops if isinstance(op, LaxOp))
        )
        compute = flops / (cluster.peak_flops * options.compute_efficiency)
        hbm = cluster.hbm_bandwidth * options.memory_efficiency
        memory_time = traffic / hbm if hbm > 0 else 0.0
        comm, count = collective_time(planned, mesh, self._pricer(cluster, options))
        memory = self._memory(planned, local, params, shape)
        objective = planned.attributes.get("sharding.objective")
        recompute = FORWARD_SHARE * (compute + memory_time) if options.remat else 0.0
        return StageCost(
            latency=compute + memory_time + comm + recompute,
            compute_time=compute,
            memory_time=memory_time,
            communication_time=comm,
            flops=flops,
            memory=memory,
            objective=float(objective.value.data) if isinstance(objective, FloatAttr) else 0.0,
            num_collectives=count,
            recompute_time=recompute,
        )

    def _pricer(self, cluster: Cluster, options: StageCostOptions) -> object:
        """The communication cost model of ``options`` bound to ``cluster`` (kept)."""
        key = (options.cost_model, cluster)
        if key not in self._pricers:
            self._pricers[key] = bound_cost_model(options.cost_model, cluster)
        return self._pricers[key]

    def _memory(
        self,
        planned: func.FuncOp,
        local: object,
        params: tuple[int, ...],
        mesh_shape: tuple[int, ...],
    ) -> StageMemory:
        assert callable(local)

        def nbytes(value: SSAValue) -> float:
            return float(math.prod(local(value)) * dtype_of(value.type).itemsize)

        block = planned.body.block
        parameters = sum(nbytes(block.args[k]) for k in params)
        # ZeRO partitions what a parameter's replicas would each hold.
        partitioned = (
            sum(
                nbytes(block.args[k]) / replication(block.args[k], planned, mesh_shape)
                for k in params
            )
            if self.options.zero
            else parameters
        )
        full = peak_live_bytes(block, set(params), nbytes, fusion=self.options.fusion)
        activations, transient = full, 0.0
        if self.options.remat:
            inputs = forward_inputs(block, set(params))
            kept = sum(nbytes(block.args[k]) for k in inputs)
            activations, transient = min(kept, full), max(full - kept, 0.0)
        return StageMemory(
            parameters=parameters,
            gradients=partitioned * self.options.gradient_factor,
            optimizer_state=partitioned * self.options.optimizer_state_factor,
            activations=activations,
            transient=transient,
        )


def _spread(cost: StageCost, replicas: int) -> StageCost:
    """``cost`` with its gradients and optimizer state partitioned over
    ``replicas`` times more devices (ZeRO over replicas no plan can use)."""
    m = cost.memory
    memory = replace(
        m, gradients=m.gradients / replicas, optimizer_state=m.optimizer_state / replicas
    )
    saving = None if cost.memory_saving is None else _spread(cost.memory_saving, replicas)
    return replace(cost, memory=memory, memory_saving=saving)


def max_stages_after(
    device_memory: float, held: npt.ArrayLike, activations: npt.ArrayLike
) -> npt.NDArray[np.float64]:
    """Eq. 5, elementwise: the most later stages a stage can have (1F1B keeps
    ``s + 1`` of its micro-batches) within ``device_memory``, given the bytes it
    holds whatever the micro-batches (``held``: persistent + transient) and
    its ``activations`` per micro-batch; ``-1`` if not even one micro-batch
    fits, ``inf`` if activations take no memory."""
    held_bytes = np.asarray(held, dtype=np.float64)
    per_batch = np.asarray(activations, dtype=np.float64)
    free = device_memory - held_bytes - per_batch
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.where(
            free < 0, -1.0, np.where(per_batch <= 0, np.inf, np.floor(free / per_batch))
        )


def function_dimensions(function: func.FuncOp) -> frozenset[int]:
    """Every dimension size of every value of ``function`` (regions included)."""
    sizes: set[int] = set()

    def add(value: SSAValue) -> None:
        try:
            sizes.update(shape_of(value.type))
        except Exception:  # not a tensor (a token): no dimensions
            pass

    for arg in function.body.block.args:
        add(arg)
    for op in function.walk():
        for result in op.results:
            add(result)
        for region in op.regions:
            for block in region.blocks:
                for arg in block.args:
                    add(arg)
    return frozenset(sizes)


def forward_inputs(block: Block, params: set[int]) -> list[int]:
    """The non-parameter arguments a forward+backward function needs for its
    forward pass (what remat keeps), as opposed to the gradients it receives
    for its backward. In program order a layer's forward ops precede its
    backward ops, and its first-produced result is a forward output (the
    activation the next layer takes; a function without gradient inputs may
    produce a loss first): arguments first used after that result are taken to
    be incoming gradients."""
    ops = list(block.ops)
    position = {op: i for i, op in enumerate(ops)}

    def top(op: Operation) -> Operation:
        while op.parent_block() is not block and op.parent_op() is not None:
            op = op.parent_op()  # type: ignore[assignment]
        return op

    returned = block.last_op.operands if block.last_op is not None else ()
    produced = [
        position[v.owner]
        for v in returned
        if isinstance(v.owner, Operation) and v.owner in position
    ]
    first_output = min(produced, default=len(ops))
    out = []
    for k, arg in enumerate(block.args):
        if k in params or not arg.uses:
            continue
        first = min(position.get(top(u.operation), len(ops)) for u in arg.uses)
        if first <= first_output:
            out.append(k)
    return out


def replication(value: SSAValue, planned: func.FuncOp, mesh_shape: tuple[int, ...]) -> int:
    """On how many devices of the mesh each block of ``value`` lives (1: fully sharded)."""
    spec = spec_of_value(value, planned)
    shape = shape_of(value.type)
    shards = math.prod(spec.num_shards(mesh_shape, d) for d in range(len(shape)))
    return max(1, math.prod(mesh_shape) // max(shards, 1))


def with_argument_specs(function: func.FuncOp, specs: dict[int, ShardingSpec]) -> func.FuncOp:
    """A copy of ``function`` whose arguments ``specs`` names carry those
    shardings (``sharding.spec`` in ``arg_attrs``), for ``keep_argument_specs``."""
    clone = function.clone()
    num = len(clone.body.block.args)
    bad = [k for k in specs if not 0 <= k < num]
    if bad:
        raise AlpaError(
            f"stage cost: argument {bad[0]} of @{function.sym_name.data} does not exist "
            f"(it has {num} arguments)"
        )
    old = clone.arg_attrs.data if clone.arg_attrs is not None else [DictionaryAttr({})] * num
    attrs = []
    for k, entry in enumerate(old):
        entries = dict(entry.data)  # type: ignore[attr-defined]
        if k in specs:
            entries[SPEC_ATTR] = specs[k].to_attr()
        attrs.append(DictionaryAttr(entries))
    clone.arg_attrs = ArrayAttr(attrs)
    return clone


def _argument_specs(function: func.FuncOp) -> tuple[str, ...]:
    attrs = function.arg_attrs
    if attrs is None:
        return ()
    return tuple(str(d.data.get(SPEC_ATTR, "")) for d in attrs)  # type: ignore[attr-defined]


def param_args_of(function: func.FuncOp, param_args: Sequence[int] | None) -> tuple[int, ...]:
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
    function: func.FuncOp,
    mesh: LogicalDeviceMesh,
    options: StageCostOptions,
    strategy_caches: dict[tuple[object, ...], StrategyCache] | None = None,
    statistics: list[Any] | None = None,
    registry: PluginRegistry | None = None,
    cluster: Cluster | None = None,
) -> func.FuncOp:
    """A copy of ``function`` auto-sharded on ``mesh`` (as ``@main`` of its own
    module, with ``cluster``'s ``mesh.cluster`` op for the cost model to bind
    to). ``strategy_caches``: where to keep (and find) the strategies of
    the ILP mesh, for many functions planned on the same meshes;
    ``statistics``: a list that receives the planner's statistics. The
    planner is :class:`~alpa_ir.autosharding.planner.ShardingPlanner` (the
    library of ``auto-sharding``) with ``registry``'s rules, cost models and
    solvers (default: the default registry)."""
    from alpa_ir.autosharding.planner import ShardingOptions, ShardingPlanner
    from alpa_ir.ir.context import make_context
    from alpa_ir.plugins.registry import default_registry

    registry = registry or default_registry()

    clone = function.clone()
    clone.sym_name = StringAttr("main")
    clone.attributes.pop(MESH_ATTR, None)
    kept_fields = ("res_attrs",) if options.keep_argument_specs else ("arg_attrs", "res_attrs")
    for field_name in kept_fields:
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
    module = ModuleOp([*([cluster.to_op()] if cluster is not None else []), mesh_op, clone])
    planner = ShardingPlanner(
        ShardingOptions(
            cost_model=options.cost_model,
            solver=options.solver,
            time_limit=options.time_limit,
            memory_budget=options.memory_budget,
            allow_all_gather=options.allow_all_gather,
            allow_replicated_parameters=options.allow_replicated_parameters,
            mip_gap=options.mip_gap,
            repeated_layers=options.repeated_layers,
        )
    )
    ctx = make_context(registry)
    ctx.statistics = statistics
    cache = None
    if strategy_caches is not None:
        model = bound_cost_model(options.cost_model, cluster, registry)
        key = (
            ilp_mesh.shape,
            ilp_mesh.alpha,
            ilp_mesh.beta,
            options.allow_all_gather,
            model,
            ilp_mesh.devices if prices_by_devices(model) else (),
        )
        cache = strategy_caches.get(key)
        if cache is None:
            cache = strategy_caches[key] = planner.strategy_cache(ctx, ilp_mesh, model)
    planner.plan(ctx, module, cache)
    return main_function(module)


def bound_cost_model(
    name: str, cluster: Cluster | None, registry: PluginRegistry | None = None
) -> CommCostModel:
    """The registered communication cost model ``name`` (``registry``, default
    the default registry), bound to ``cluster`` (or to none) if it binds to
    clusters (``for_cluster``: ``auto``, ``calibrated``)."""
    from alpa_ir.plugins.registry import default_registry

    return bound_to_cluster((registry or default_registry()).get("cost_models", name)(), cluster)


def collective_time(
    function: func.FuncOp, mesh: LogicalDeviceMesh, pricer: object = None
) -> tuple[float, int]:
    """Seconds of the explicit collectives of a planned function, and their
    number. ``pricer``: a bound cost model with ``seconds(kind, mesh, bytes,
    axes)`` (``calibrated``); else the mesh's real α/β (slowest axis of each
    collective) times the bytes on the wire."""
    assert mesh.alpha is not None and mesh.beta is not None
    seconds = getattr(pricer, "seconds", None)
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
            if seconds is not None:
                kind = collective.kind.replace("-", "_")
                total += seconds(kind, mesh, collective.bytes, axes)
            else:
                total += alpha + beta * collective.wire_bytes
            count += 1
    return total, count


def peak_live_bytes(
    block: Block, excluded_args: set[int], nbytes: object, *, fusion: bool = False
) -> float:
    """Peak bytes of the values live at once in ``block`` in program order: an
    argument (not excluded) from the start, a result from its op, each until
    its last use; returned values stay live to the end. With ``fusion``, only
    the values :mod:`alpa_ir.costs.fusion` materializes, each until the last kernel
    that reads it."""
    assert callable(nbytes)
    if fusion:
        return _peak(
            [(nbytes(v), born, last) for v, born, last in fused_live_ranges(block, excluded_args)],
            len(block.ops),
        )
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

    values: list[tuple[SSAValue, int]] = [
        (a, 0) for k, a in enumerate(block.args) if k not in excluded_args
    ]
    values += [(r, i) for i, op in enumerate(ops) for r in op.results]
    ranges = merge_identity_ranges(
        block,
        [
            (value, born, last_use(value, born))
            for value, born in values
            if value.uses or born != 0 or not isinstance(value.owner, Block)  # not unused
        ],
    )
    return _peak([(nbytes(value), born, last) for value, born, last in ranges], end)


def _peak(ranges: list[tuple[float, int, int]], end: int) -> float:
    """The largest sum of sizes of ``(size, born, last)`` ranges alive at once."""
    delta = [0.0] * (end + 2)
    for size, born, last in ranges:
        delta[born] += size
        delta[last + 1] -= size
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
    "FORWARD_SHARE",
    "AnalyticalStageCostModel",
    "ParallelStageCostModel",
    "StageCost",
    "StageCostModel",
    "StageCostOptions",
    "StageMemory",
    "collective_time",
    "forward_inputs",
    "function_dimensions",
    "function_fingerprint",
    "max_stages_after",
    "peak_live_bytes",
    "plan_function",
    "replication",
    "with_argument_specs",
]
