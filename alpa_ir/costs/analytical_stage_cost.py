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
  2) and the activations one micro-batch keeps: the values its forward
  leaves for its backward (live across the forward's last op, the function's
  first-produced result; results live to the end), while the rest of the
  peak of the live values in program order (the backward's own temporaries)
  is a transient held once, not per micro-batch in flight (Wide-ResNet 250M
  without remat, 48 micro-batches of 32 images on one V100: 11.0 GiB here
  against the artifact's measured 11.9 GiB peak; 19.1 GiB when every
  micro-batch in flight was charged the whole peak).
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

import math
from collections import OrderedDict
from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass, field, replace

from xdsl.dialects import func
from xdsl.dialects.builtin import (
    FloatAttr,
)
from xdsl.ir import SSAValue

from alpa_ir.autosharding.dead_code import dead_ops, erase_dead_code
from alpa_ir.autosharding.graph import StrategyCache
from alpa_ir.costs.device_model import DeviceModel, nominal_profile
from alpa_ir.costs.flops import function_flops
from alpa_ir.costs.function_fingerprint import function_fingerprint
from alpa_ir.costs.function_plan import (
    _argument_specs,
    bound_cost_model,
    collective_time,
    deferred_collectives,
    forward_end,
    forward_inputs,
    function_dimensions,
    param_args_of,
    plan_function,
    plan_function_and_variant,
    replication,
)
from alpa_ir.costs.fusion import BlockFusion
from alpa_ir.costs.live_memory import live_across, peak_live_bytes
from alpa_ir.costs.stage_cost import (
    FORWARD_SHARE,
    MEMORY_FALLBACK_FROM,
    MEMORY_FALLBACK_MIP_GAP,
    CacheStats,
    StageCost,
    StageCostOptions,
    StageMemory,
    cached_cost,
    mesh_key,
)
from alpa_ir.dialects.sharding import (
    spec_of_value,
)
from alpa_ir.dialects.types import dtype_of, shape_of
from alpa_ir.errors import AlpaError
from alpa_ir.hardware.clusters import Cluster
from alpa_ir.hardware.device_mesh import LogicalDeviceMesh

IDENTITIES_KEPT = 16
"""Functions whose fingerprints a model keeps (it holds them alive meanwhile)."""


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
    _devices: dict[tuple[object, ...], DeviceModel] = field(default_factory=dict, repr=False)
    """Per profile (or nominal figures): the model that prices the kernels."""
    _identities: OrderedDict[func.FuncOp, tuple[str, frozenset[int]]] = field(
        default_factory=OrderedDict, repr=False
    )
    """The fingerprints and dimension sizes of the last ``IDENTITIES_KEPT``
    functions asked about: a cost table asks for one function on every view in
    turn, a worker for each of its functions on one view."""

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
            self._identity(function)[0],
            *mesh_key(
                self.live_mesh(function, mesh), keep_axis_order=self.options.keep_argument_specs
            ),
            cluster.peak_flops,
            cluster.hbm_bandwidth,
            cluster.profile,
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
        dims = self._identity(function)[1]
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

    def _identity(self, function: func.FuncOp) -> tuple[str, frozenset[int]]:
        found = self._identities.get(function)
        if found is None:
            found = (function_fingerprint(function), function_dimensions(function))
            self._identities[function] = found
            if len(self._identities) > IDENTITIES_KEPT:
                self._identities.popitem(last=False)
        else:
            self._identities.move_to_end(function)
        return found

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
        threshold = cluster.device_memory * MEMORY_FALLBACK_FROM
        if not (
            self.options.memory_fallback
            and mesh.size > 1
            and params
            and _persistent_at_most(function, params, self.options) >= threshold
        ):
            return self._plan_and_price(function, mesh, cluster, params, self.options)
        sharded_options = replace(
            self.options,
            allow_replicated_parameters=False,
            mip_gap=max(self.options.mip_gap, MEMORY_FALLBACK_MIP_GAP),
            branch_and_bound=False,  # no time limit decides the plan (MEMORY_FALLBACK_MIP_GAP)
        )
        # The second plan differs from the first only in the parameters'
        # strategies: it is made from the first one's strategy graph.
        planned, sharded_plan = plan_function_and_variant(
            function,
            mesh,
            self.options,
            sharded_options,
            self._strategies,
            cluster=cluster,
            cost_model=self._pricer(cluster, self.options),  # type: ignore[arg-type]
        )
        cost = self.price_planned(planned, mesh, cluster, params, self.options)
        if cost.memory.persistent < threshold:
            return cost
        try:
            if sharded_plan is not None:
                sharded_function = sharded_plan()
            else:
                sharded_function = plan_function(
                    function,
                    mesh,
                    sharded_options,
                    self._strategies,
                    cluster=cluster,
                    cost_model=self._pricer(cluster, sharded_options),  # type: ignore[arg-type]
                )
        except AlpaError:
            return cost  # some parameter cannot be sharded on this mesh
        # Its persistent bytes first (cheap: the arguments' specs): a plan that
        # holds no less is no memory saving, and pricing it would not change
        # that (the same sum, in the same order, as its price's memory).
        if self.persistent_bytes(sharded_function, mesh, params) >= cost.memory.persistent:
            return cost
        sharded = self.price_planned(sharded_function, mesh, cluster, params, sharded_options)
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
            # so the function as it is prices the same as its ILP plan would,
            # less its dead code, which the planner erases before its ILP
            planned = function
            if dead_ops(function.body.block):
                planned = function.clone()
                erase_dead_code(planned)
        else:
            pricer = self._pricer(cluster, options)
            planned = plan_function(
                function,
                mesh,
                options,
                self._strategies,
                cluster=cluster,
                cost_model=pricer,  # type: ignore[arg-type]
            )
        return self.price_planned(planned, mesh, cluster, params, options)

    def price_planned(
        self,
        planned: func.FuncOp,
        mesh: LogicalDeviceMesh,
        cluster: Cluster,
        param_args: Sequence[int] | None = None,
        options: StageCostOptions | None = None,
    ) -> StageCost:
        """The cost of ``planned``, a function already planned on ``mesh`` (its
        values carry their specs, its collectives are explicit), priced as this
        model prices its own plans: a plan made elsewhere (``ShardParallel``'s
        ``auto-sharding`` pass) at the prices the planner uses. Not cached."""
        options = options or self.options
        params = param_args_of(planned, param_args)
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
        decisions = BlockFusion(block, options.tiled_attention)  # for traffic and memory
        times = self.device_model(cluster, options).block_times(
            block, local, decisions, fused=options.fusion
        )
        compute = times.gemm
        memory_time = times.memory + times.launches
        if not options.fusion:
            decisions = None
        # the gradients' reductions run once per step (deferred past the micro-batches)
        pricer = self._pricer(cluster, options)
        deferred = deferred_collectives(planned)
        comm, count = collective_time(planned, mesh, pricer, skip=deferred)
        sync, synced = collective_time(planned, mesh, pricer, only=deferred)
        memory = self._memory(planned, local, params, shape, decisions)
        objective = planned.attributes.get("sharding.objective")
        recompute = FORWARD_SHARE * (compute + memory_time) if options.remat else 0.0
        return StageCost(
            latency=compute
            + memory_time
            + comm
            + recompute
            + self.exposed_sync(sync, cluster) / options.num_micro_batches,
            compute_time=compute,
            memory_time=memory_time,
            communication_time=comm,
            flops=flops,
            memory=memory,
            objective=float(objective.value.data) if isinstance(objective, FloatAttr) else 0.0,
            num_collectives=count + synced,
            recompute_time=recompute,
            gradient_sync_time=sync,
        )

    @staticmethod
    def exposed_sync(sync: float, cluster: Cluster) -> float:
        """The part of a stage's gradient synchronization the backward pass does
        not hide (the profile's ``overlap.gradient_sync``; none without a profile)."""
        share = cluster.profile.overlap.gradient_sync if cluster.profile is not None else 0.0
        return sync * (1.0 - share)

    def device_model(self, cluster: Cluster, options: StageCostOptions) -> DeviceModel:
        """The kernel prices of ``cluster``'s devices: its profile, else the
        nominal one from its peak and bandwidth at ``options``' efficiencies (kept)."""
        key = (cluster.profile, cluster.peak_flops, cluster.hbm_bandwidth, options)
        found = self._devices.get(key)
        if found is None:
            profile = cluster.profile or nominal_profile(
                cluster.peak_flops,
                cluster.hbm_bandwidth,
                options.compute_efficiency,
                options.memory_efficiency,
            )
            found = self._devices[key] = DeviceModel(profile)
        return found

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
        decisions: BlockFusion | None = None,
    ) -> StageMemory:
        assert callable(local)

        def nbytes(value: SSAValue) -> float:
            return float(math.prod(local(value)) * dtype_of(value.type).itemsize)

        block = planned.body.block
        parameters, gradients, optimizer_state = self._held(planned, params, mesh_shape, nbytes)
        full = peak_live_bytes(
            block, set(params), nbytes, fusion=self.options.fusion, decisions=decisions
        )
        if self.options.remat:
            inputs = forward_inputs(block, set(params))
            kept = sum(nbytes(block.args[k]) for k in inputs)
        else:
            # what the forward leaves for the backward; the backward's own
            # temporaries are held once, not per micro-batch in flight
            kept = live_across(
                block,
                set(params),
                nbytes,
                forward_end(block),
                fusion=self.options.fusion,
                decisions=decisions,
            )
        activations, transient = min(kept, full), max(full - kept, 0.0)
        return StageMemory(
            parameters=parameters,
            gradients=gradients,
            optimizer_state=optimizer_state,
            activations=activations,
            transient=transient,
        )

    def _held(
        self,
        planned: func.FuncOp,
        params: tuple[int, ...],
        mesh_shape: tuple[int, ...],
        nbytes: Callable[[SSAValue], float],
    ) -> tuple[float, float, float]:
        """Bytes per device of the parameters, their gradients and their
        optimizer state under ``planned``'s argument specs."""
        args = planned.body.block.args
        parameters = sum(nbytes(args[k]) for k in params)
        # ZeRO partitions what a parameter's replicas would each hold.
        partitioned = (
            sum(nbytes(args[k]) / replication(args[k], planned, mesh_shape) for k in params)
            if self.options.zero
            else parameters
        )
        return (
            parameters,
            partitioned * self.options.gradient_factor,
            partitioned * self.options.optimizer_state_factor,
        )

    def persistent_bytes(
        self, planned: func.FuncOp, mesh: LogicalDeviceMesh, params: tuple[int, ...]
    ) -> float:
        """``StageMemory.persistent`` of :meth:`price_planned`'s cost of
        ``planned`` on ``mesh`` (the same floats), without pricing the rest."""
        shape = mesh.shape

        def nbytes(value: SSAValue) -> float:
            local = spec_of_value(value, planned).local_shape(shape_of(value.type), shape)
            return float(math.prod(local) * dtype_of(value.type).itemsize)

        parameters, gradients, optimizer_state = self._held(planned, params, shape, nbytes)
        return StageMemory(parameters, gradients, optimizer_state, 0.0).persistent


def _persistent_at_most(
    function: func.FuncOp, params: tuple[int, ...], options: StageCostOptions
) -> float:
    """The most persistent bytes any plan of ``function`` holds per device:
    its parameters whole, with their gradients and optimizer state."""
    args = function.body.block.args
    whole = sum(
        float(math.prod(shape_of(args[k].type)) * dtype_of(args[k].type).itemsize) for k in params
    )
    return whole * (1.0 + options.gradient_factor + options.optimizer_state_factor)


def _spread(cost: StageCost, replicas: int) -> StageCost:
    """``cost`` with its gradients and optimizer state partitioned over
    ``replicas`` times more devices (ZeRO over replicas no plan can use)."""
    m = cost.memory
    memory = replace(
        m, gradients=m.gradients / replicas, optimizer_state=m.optimizer_state / replicas
    )
    saving = None if cost.memory_saving is None else _spread(cost.memory_saving, replicas)
    return replace(cost, memory=memory, memory_saving=saving)
