"""Stage costs for stage construction (Alpa §5.2): what a stage costs on a
logical mesh (:class:`StageCost`: latency per micro-batch and memory, Eq. 3
and 5), the options of the cost model, the protocol a cost model implements
(the analytical one is :mod:`alpa_ir.costs.analytical_stage_cost`) and its
cache keys."""

from __future__ import annotations

from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass, fields
from typing import Literal, Protocol, runtime_checkable

import numpy as np
import numpy.typing as npt
from xdsl.dialects import func

from alpa_ir.autosharding.planner import ShardingOptions
from alpa_ir.errors import AlpaError
from alpa_ir.hardware.clusters import Cluster
from alpa_ir.hardware.device_mesh import LogicalDeviceMesh

ILP_TIME_UNIT = 1e6
"""α/β are given to the ILP in microseconds (see :mod:`alpa_ir.costs.analytical_stage_cost`)."""
FORWARD_SHARE = 1.0 / 3.0
"""The forward pass's share of a forward+backward function's work (backward
matmuls: the gradients of both operands, twice the forward FLOPs)."""


MEMORY_FALLBACK_FROM = 1 / 256
"""``memory_fallback`` plans again where persistent bytes reach this share of
the device memory (64 MiB of 16 GiB). Smaller layers take little even
replicated; larger ones add up: with a layer per block, a stage holds tens of
them (the 0.4 GiB dense layers of MoE-27B on 32 devices come to 3.3 GiB
replicated where sharded they take 0.2)."""
MEMORY_FALLBACK_MIP_GAP = 0.03
"""Relative gap to the LP bound at which the second plan is accepted (at
least; a larger ``mip_gap`` applies as it is). Where the LP is fractional, the
plan found by diving from it is usually within 1 to 3 % of the bound, and
solving to optimality takes 7 to 17 s (GPT-3 39B's layers on (2, 16) and
(2, 2) meshes, optima 0 to 1.4 % better). The second plan runs no branch and
bound (``branch_and_bound`` off): it keeps the best plan the LP, its dives and
exact elimination found. (It had a 2 s time limit for CBC instead, which
decided on a loaded machine whether the LP and its dives finished: GPT-3 39B's
layer on (4, 8) got a plan 40 times slower at a load of 20.)"""


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
    branch_and_bound: bool = True
    """Passed to auto-sharding: False keeps the best plan found before branch
    and bound (the memory-fallback plans, ``MEMORY_FALLBACK_MIP_GAP``)."""
    memory_budget: float = 0.0
    """Passed to auto-sharding (bytes per device; 0 = none)."""
    remat: bool = False
    """Rematerialize every layer (:mod:`alpa_ir.costs.analytical_stage_cost`): keep layer inputs only."""
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
    tiled_attention: bool = False
    """The attention runs as one tiled kernel (FlashAttention, as Llama 3 and
    Megatron-LM run it): its ``[.., S, S]`` scores, probabilities and their
    gradients are never written to device memory (:class:`~alpa_ir.costs.fusion.BlockFusion`)."""
    cost_model: str = "auto"
    """Passed to auto-sharding: the registered communication cost model of the
    plans, bound to the stage's cluster if it can be (``auto``: ``calibrated``
    on GPU clusters, ``alpha-beta`` elsewhere); the stage's communication time
    is priced by the same model."""
    force_batch_dim_to_mesh_dim: int = -1
    """Passed to auto-sharding: split the batch over this mesh axis (Alpa's
    option, which its published plans set); -1: the ILP chooses."""
    num_micro_batches: int = 1
    """Micro-batches per step: the gradients' reductions run once per step
    (:attr:`StageCost.gradient_sync_time`), so the plans weigh them 1 : this
    against the per-micro-batch work (auto-sharding's ``compute_grad_scale``)."""
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
        if isinstance(self.num_micro_batches, bool) or self.num_micro_batches < 1:
            raise AlpaError(
                f"stage cost: num_micro_batches must be >= 1, got {self.num_micro_batches}"
            )
        if not 0 <= self.mip_gap < 1:
            raise AlpaError(f"stage cost: mip_gap must be in [0, 1), got {self.mip_gap}")

    def sharding_options(self) -> ShardingOptions:
        """The options of the planner each stage function is auto-sharded with:
        the fields these options share with it, by name (:data:`SHARED_WITH_PLANNER`)."""
        return ShardingOptions(**{name: getattr(self, name) for name in SHARED_WITH_PLANNER})


SHARED_WITH_PLANNER = tuple(
    f.name for f in fields(StageCostOptions) if f.name in {g.name for g in fields(ShardingOptions)}
)
"""The stage cost options that are the planner's own (solver, time limit, MIP
gap, memory budget, cost model, ...), passed to it as they are."""


@dataclass(frozen=True)
class StageMemory:
    """Bytes per device of one stage (see :mod:`alpa_ir.costs.analytical_stage_cost`)."""

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
    gradient_sync_time: float = 0.0
    """Seconds of the reductions that run once per step, after the
    micro-batches (the gradients' all-reduce or reduce-scatter, deferred under
    gradient accumulation as the runtime does it); ``latency`` carries their
    share of one micro-batch (``/ num_micro_batches``), ``communication_time``
    only the per-micro-batch collectives."""
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
