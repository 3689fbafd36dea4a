"""Alpa's intra-operator planner (§4): the ILP over every op's sharding
strategies, solved and written into the IR; the library of ``auto-sharding``,
used as well by the stage cost model and by P² placement synthesis.

Strategies come from the sharding rules (one per primitive), nodes from the
groups of ``merge-trivial-ops`` (every op is its own group if that pass did not
run), costs from the communication cost model, and the ILP is solved by the
solver plugin. The result: a spec on every value (``sharding.specs`` and the
argument/result attributes), the strategy of every op (``sharding.strategy``),
explicit collectives, and the objective on ``@main`` (``sharding.objective``).

Donated inputs and the outputs that replace them (parameters in, parameters
out) are given the same spec. The batch arguments (``alpa.batch_args``) are
what the ``force-*`` options refer to. :class:`ShardingOptions` are the
options, defined once: the ``auto-sharding`` pass's options are these fields.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass, is_dataclass, replace
from typing import Literal

import numpy as np
from xdsl.context import Context
from xdsl.dialects import func
from xdsl.dialects.builtin import (
    ArrayAttr,
    DenseArrayBase,
    FlatSymbolRefAttr,
    FloatAttr,
    ModuleOp,
    SymbolRefAttr,
    f64,
)
from xdsl.ir import Operation, SSAValue

from alpa_ir.autosharding.apply_plan import apply_plan
from alpa_ir.autosharding.baselines import (
    BaselinePrice,
    baseline_objectives,
    data_parallel_spec,
    heuristic_spec,
    worse_than,
)
from alpa_ir.autosharding.batch_dims import batch_dims
from alpa_ir.autosharding.cost_model import (
    CommCostModel,
    bound_to_cluster,
    prices_by_devices,
)
from alpa_ir.autosharding.dead_code import erase_dead_code
from alpa_ir.autosharding.graph import GraphBuilder, StrategyCache, StrategyGraph
from alpa_ir.autosharding.graph_copy import ModuleCopy, copy_module
from alpa_ir.autosharding.hints import HINT_COST_ATTR, hint_specs
from alpa_ir.autosharding.problem import Aliasing, build_problem
from alpa_ir.autosharding.resharding import INF, ReshardCoster, ReshardOptions
from alpa_ir.autosharding.tie_breaks import with_output_ties
from alpa_ir.dialects.attrs import BATCH_ATTR, GROUP_ATTR
from alpa_ir.dialects.lax_attrs import ints_of
from alpa_ir.dialects.mesh import MESH_ATTR, LogicalMeshOp
from alpa_ir.dialects.sharding import SPEC_ATTR, ShardingSpec, spec_of_value
from alpa_ir.errors import AlpaError
from alpa_ir.frontend.jaxpr_import import ALIASES_ATTR, DONATED_ATTR
from alpa_ir.hardware.device_mesh import LogicalDeviceMesh, function_mesh
from alpa_ir.ir.module_utils import main_function, symbol_op
from alpa_ir.passmanager.pass_statistics import record_statistic
from alpa_ir.passmanager.progress import Spinner
from alpa_ir.plugins.registry import registry_of
from alpa_ir.solvers.ilp import ILPProblem, ILPSolution, evaluate
from alpa_ir.solvers.repeated import TiedProblem, tie_repeated

OBJECTIVE_ATTR = "sharding.objective"
SHARE_LAYERS_FROM = 1500
"""Graph size from which ``repeated-layers=auto`` may share the variables of
repeated layers (with SHARE_PAIRS_FROM). Below it the exact ILP is cheap (its
LP relaxation, integral on these graphs, solves a 942-node GPT-3 1.3B
automatic layer of 3 blocks on a 2x4 mesh in ~3 s) and sharing only loses:
it found the same plan there, but 2-3 % worse plans on a 6-block GPT-3 39B
layer (``tools/bench_stage_ilp.py``)."""
SHARE_PAIRS_FROM = 100_000
"""Strategy pairs on the edges (Σ |S_u|·|S_v|) from which ``auto`` shares: the
size of the exact LP. A 1-D mesh's graphs (~20 pairs per edge) stay exact
(GPT-3 39B layer on 1x8: 32k pairs, ~2 s exact), a 2-D mesh's (~250 per edge)
of the same 1728 nodes are shared (550k pairs: ~20-40 s exact, ~5-10 s shared)."""
REPLICATED_PARAMETER_PENALTY = 1e-6
"""Objective added for an input kept whole on every device (divided by its number of shards)."""


def int_list(function: func.FuncOp, name: str) -> list[int]:
    attr = function.attributes.get(name)
    if attr is None:
        return []
    assert isinstance(attr, DenseArrayBase)
    return list(ints_of(attr))


def aliases_of(function: func.FuncOp) -> list[Aliasing]:
    attr = function.attributes.get(ALIASES_ATTR)
    if attr is None:
        return []
    assert isinstance(attr, ArrayAttr)
    return [Aliasing(*ints_of(pair)) for pair in attr.data]  # type: ignore[arg-type]


STATISTICS_NAME = "auto-sharding"
"""The pass name the planner's statistics are recorded under."""


@dataclass(frozen=True)
class ShardingOptions:
    """The options of Alpa's ILP planner (the ``auto-sharding`` pass's options)."""

    solver: str = "cbc"
    """A registered ILP solver (``cbc``, ``highs``, or a plugin's)."""
    time_limit: float = 600.0
    """Seconds the solver may take; past it, the best plan found so far."""
    memory_budget: float = 0.0
    """Bytes per device; 0 means no limit."""
    allow_all_gather: bool = True
    """Let resharding between ops use all-gathers."""
    allow_all_to_all: bool = True
    """Let resharding between ops use all-to-alls."""
    allow_replicated_parameters: bool = True
    """Allow a parameter to be fully replicated over the mesh."""
    allow_mixed_mesh_shape: bool = True
    """Allow a tensor dimension split over several mesh axes at once (S01 on
    a 2-d mesh: Alpa's "1-d strategies in a 2-d mesh")."""
    force_batch_dim_to_mesh_dim: int = -1
    """Every op splits its batch dimension over this mesh axis where it can; -1: free."""
    allow_recompute_heavy_op: bool = False
    """Let heavy ops (matmuls, convolutions) leave a mesh axis unused, computing
    the same thing on its devices (Alpa's ``allow_recompute_heavy_op``); by
    default a heavy op divides its work over every axis that can split it."""
    prefer_reduce_scatter: bool = False
    """Finish with ``reduce-scatter-rewrite{mode=zero2}``: gradients reduce-scattered
    and the weight update sharded wherever that shards optimizer state."""
    force_data_parallel: bool = False
    """Split the batch arguments over all devices (data parallelism); the rest is free."""
    cost_model: str = "auto"
    """A registered communication cost model: ``auto`` (``calibrated`` on a mesh of
    GPUs, ``alpha-beta`` elsewhere: :mod:`alpa_ir.p2.default_cost_model`),
    ``alpha-beta`` (Alpa's), ``calibrated``, ``p2``."""
    system: str = ""
    """For a cost model that prices on the hardware (``p2``): the system preset (e.g.
    gcp-a100-16x4); empty: the mesh's ``p2.system`` or its cluster. Other models ignore it."""
    mesh_shape: tuple[int, ...] = ()
    """Used when @main names no mesh: the logical mesh to plan for (α = 1, β = 1, 0.1, ...)."""
    compute_grad_scale: float = 1.0
    """Weight of the ops before the gradient marker (the number of micro-batches)."""
    strategy_space: Literal["ilp", "data-parallel", "heuristic"] = "ilp"
    """``ilp``: Alpa's ILP over every strategy; ``heuristic``: each argument split
    along its largest dimension (Alpa's "Heuristic" baseline), the ILP choosing the
    rest; ``data-parallel``: as ``force-data-parallel``."""
    repeated_layers: Literal["auto", "share", "separate"] = "auto"
    """``share``: one ILP variable for the copies of a node in identical layers
    (``alpa_ir.solvers.repeated``; the plan treats identical layers alike, the
    objective is that plan's own); ``separate``: every node its own variable
    (exact); ``auto``: share from SHARE_LAYERS_FROM nodes and SHARE_PAIRS_FROM
    strategy pairs on, without a memory budget."""
    check_baselines: bool = False
    """After the solve, price the data-parallel and heuristic plans in the same
    problem (:mod:`alpa_ir.autosharding.baselines`) and warn if the ILP's plan
    costs more than either: the solver lost the optimum. Two more solves."""
    mip_gap: float = 0.0
    """Relative gap to the ILP's lower bound at which the solver may stop with
    a plan (for solvers with a ``mip_gap`` field, such as ``cbc`` and
    ``highs``); 0: the solver's own setting (exact)."""
    branch_and_bound: bool = True
    """False: the solver keeps the best plan its LP relaxation, dives and exact
    elimination found, without the MIP's branch and bound (for solvers with a
    ``branch_and_bound`` field, such as ``cbc`` and ``highs``): a plan that
    depends on no time limit, so not on the machine's load."""


@dataclass(frozen=True)
class ShardingPlanner:
    """Plans modules with ``options`` (:meth:`plan`). ``scaled_ops``: the ops of
    a function (given its batch arguments) that ``compute-grad-scale`` weighs,
    those that run once per micro-batch (the pass gives the step partition's)."""

    options: ShardingOptions
    scaled_ops: Callable[[func.FuncOp, Sequence[int]], Collection[Operation]] | None = None

    @property
    def _data_parallel(self) -> bool:
        return self.options.force_data_parallel or self.options.strategy_space == "data-parallel"

    def plan(
        self,
        ctx: Context,
        op: ModuleOp,
        cache: StrategyCache | None = None,
        variant: ShardingOptions | None = None,
    ) -> PlanVariant | None:
        """Plan ``op``'s ``@main`` (module docstring), with the strategies memoized
        in ``cache`` (a cache of the module's mesh and of these options' cost
        model and reshard options, from :meth:`strategy_cache`; shared when
        many functions are planned on one mesh, e.g. by the stage cost model).
        Statistics are recorded under ``auto-sharding``. Without
        ``prefer-reduce-scatter``'s rewrite: the pass runs that after.

        ``variant``: options that differ from these at most in
        :data:`VARIANT_FIELDS` (which strategies the arguments may take, the
        solver's time limit and gap). A copy of ``op`` is then taken before
        the plan is written, and the returned :class:`PlanVariant` plans that
        copy under ``variant`` on request, from this plan's strategy graph
        (None without ``variant``, and with the user's sharding hints)."""
        if variant is not None and not _differs_in_variant_fields(self.options, variant):
            raise AlpaError(
                "auto-sharding: a plan variant may change only " + ", ".join(sorted(VARIANT_FIELDS))
            )
        registry = registry_of(ctx)
        function = main_function(op)
        mesh = function_mesh(op, function)
        if mesh is None:
            if not self.options.mesh_shape:
                raise AlpaError(
                    "auto-sharding: @main names no logical mesh (mesh.mesh); give the option "
                    "mesh-shape, e.g. auto-sharding{mesh-shape=2,4}"
                )
            mesh = LogicalDeviceMesh(self.options.mesh_shape)
            mesh_op = mesh.to_op("mesh")
            op.body.block.insert_op_before(mesh_op, function)
            function.attributes[MESH_ATTR] = FlatSymbolRefAttr("mesh")
        cost_model = registry.get("cost_models", self.options.cost_model)()
        bind = getattr(cost_model, "for_module", None)
        if bind is not None:  # a model that prices on the module's hardware (see cost_model.py)
            ref = function.attributes[MESH_ATTR]
            assert isinstance(ref, SymbolRefAttr)
            cost_model = bind(
                op, symbol_op(op, ref.root_reference.data, LogicalMeshOp), self.options.system
            )
        options = ReshardOptions(self.options.allow_all_gather, self.options.allow_all_to_all)
        if cache is not None and not _cache_fits(cache, mesh, cost_model, options):
            raise AlpaError(
                "auto-sharding: the strategy cache was made for another mesh, cost model or "
                "reshard options"
            )
        coster = cache.coster if cache is not None else ReshardCoster(mesh, cost_model, options)
        erased = erase_dead_code(function)  # as XLA's DCE before Alpa's pass (dead_code.py)
        record_statistic(ctx, STATISTICS_NAME, "dead-ops", erased, "dead ops erased before the ILP")
        groups = {
            o: o.attributes[GROUP_ATTR].value.data  # type: ignore[attr-defined]
            for o in function.body.block.ops
            if GROUP_ATTR in o.attributes
        }
        batch = batch_leaves_with_rows(function, int_list(function, BATCH_ATTR))
        if (self._data_parallel or self.options.force_batch_dim_to_mesh_dim >= 0) and not batch:
            raise AlpaError(
                "auto-sharding: force-data-parallel / force-batch-dim-to-mesh-dim need the batch "
                "arguments (import with batch_argnums)"
            )
        if self._data_parallel:
            for k in sorted(batch):
                shape = function.args[k].type.get_shape()  # type: ignore[attr-defined]
                if shape and shape[0] % mesh.size:
                    raise AlpaError(
                        f"auto-sharding: data parallelism splits the batch over all {mesh.size} "
                        f"devices, but batch argument {k} has {shape[0]} rows (per micro-batch)"
                    )
        given = {
            k: spec_of_value(a, function)
            for k, a in enumerate(function.args)
            if _has_spec(function, k)
        }
        batch_axis = None
        split = [a for a, n in enumerate(mesh.shape) if n > 1]
        if self._data_parallel and len(split) == 1:
            # Alpa's force_data_parallel: on the flattened mesh every op's batch
            # dimension is split, not only the batch arguments'
            batch_axis = (
                batch_dims(function, sorted(batch), registry.sharding_rules.get),
                split[0],
            )
        elif self.options.force_batch_dim_to_mesh_dim >= 0:
            if self.options.force_batch_dim_to_mesh_dim >= len(mesh.shape):
                raise AlpaError(
                    f"auto-sharding: force-batch-dim-to-mesh-dim={self.options.force_batch_dim_to_mesh_dim} "
                    f"but the mesh {list(mesh.shape)} has {len(mesh.shape)} axes"
                )
            # (on an axis of size 1, as Alpa: the batch dimensions stay whole)
            batch_axis = (
                batch_dims(function, sorted(batch), registry.sharding_rules.get),
                self.options.force_batch_dim_to_mesh_dim,
            )
        hints = hint_specs(function, mesh)

        def build(hinted: bool) -> tuple[StrategyGraph, ILPProblem]:
            graph = GraphBuilder(
                function,
                groups,
                mesh.shape,
                coster,
                rule_lookup=registry.sharding_rules.get,  # the built-in rules and the plugins'
                arg_filter=self._arg_cost(mesh, batch, given),
                cache=cache
                if batch_axis is None
                and self.options.allow_mixed_mesh_shape
                and not self.options.allow_recompute_heavy_op
                else None,
                batch_axis=batch_axis,
                allow_mixed_mesh_shape=self.options.allow_mixed_mesh_shape,
                allow_recompute_heavy_op=self.options.allow_recompute_heavy_op,
                hints=hints if hinted else None,
            ).build()
            node_scale = None
            if self.options.compute_grad_scale != 1.0:
                if self.scaled_ops is None:
                    raise AlpaError(
                        "auto-sharding: compute-grad-scale needs the planner's scaled_ops "
                        "(the ops that run once per micro-batch)"
                    )
                compute = set(self.scaled_ops(function, sorted(batch)))
                node_scale = np.array(
                    [
                        self.options.compute_grad_scale if any(o in compute for o in n.ops) else 1.0
                        for n in graph.nodes
                    ]
                )
            problem = build_problem(
                graph,
                function,
                mesh.shape,
                memory_budget=self.options.memory_budget or None,
                aliases=aliases_of(function),
                donated=set(int_list(function, DONATED_ATTR)),
                node_scale=node_scale,
                coster=coster,
            )
            aliased = {a.output for a in aliases_of(function)}
            return graph, with_output_ties(graph, problem, function, mesh.shape, aliased)

        graph, problem = build(hinted=True)
        solver = self._solver(registry.get("solvers", self.options.solver)())
        tied = None
        if self.options.repeated_layers == "share" or (
            self.options.repeated_layers == "auto" and share_automatically(problem)
        ):
            tied = tie_repeated(problem)

        def solve(problem: ILPProblem, tied: TiedProblem | None) -> ILPSolution:
            return solve_ilp(solver, problem, tied, self.options.time_limit)

        label = (
            f"auto-sharding: solving the ILP of {problem.num_nodes} nodes ({self.options.solver})"
        )
        with Spinner(label):
            solution = solve(problem, tied)
        variables = tied.problem.num_nodes if tied is not None else problem.num_nodes
        if (
            self.options.check_baselines
            and self.options.strategy_space == "ilp"
            and not self._data_parallel
        ):
            prices = self._price_baselines(
                ctx, problem, graph, mesh, (batch, given), solver, tied is not None
            )
            _warn_if_beaten(solution.objective, prices)
        objective = _without_tie_breaks(solution.objective, graph, solution.choice)
        if hints:  # what the user's hints cost: the plan without them, in the same problem
            free_graph, free_problem = build(hinted=False)
            free = solve(free_problem, tie_repeated(free_problem) if tied is not None else None)
            cost = objective - _without_tie_breaks(free.objective, free_graph, free.choice)
            function.attributes[HINT_COST_ATTR] = FloatAttr(max(cost, 0.0), f64)
            record_statistic(
                ctx, STATISTICS_NAME, "hint-cost", max(cost, 0.0),
                "objective the user's sharding hints add to the plan without them",
            )  # fmt: skip
        later = None
        if variant is not None and not hints:
            other = ShardingPlanner(variant, self.scaled_ops)
            later = PlanVariant(
                copy_module(op),
                graph,
                problem,
                tied is not None,
                other,
                registry.get("solvers", variant.solver)(),
                other._arg_cost(mesh, batch, given),
            )
        apply_plan(function, graph, solution.choice, aliases_of(function))
        function.attributes[OBJECTIVE_ATTR] = FloatAttr(objective, f64)
        record_statistic(ctx, STATISTICS_NAME, "num-nodes", len(graph.nodes), "nodes of the ILP")
        record_statistic(ctx, STATISTICS_NAME, "num-variables", variables, "ILP choice variables")
        record_statistic(
            ctx, STATISTICS_NAME, "solve-time", solution.solve_time, "seconds in the ILP solver"
        )
        return later

    def _price_baselines(
        self,
        ctx: Context,
        problem: ILPProblem,
        graph: object,
        mesh: LogicalDeviceMesh,
        args: tuple[set[int], dict[int, ShardingSpec]],
        solver: object,
        share: bool,
    ) -> list[BaselinePrice]:
        """Price the baselines in ``problem`` (solved as the plan was: shared
        repeated layers if it was) and keep the prices as statistics."""

        def solve(narrow: ILPProblem) -> Sequence[int]:
            tied = tie_repeated(narrow) if share else None
            if tied is None:
                return solver.solve(narrow, time_limit=self.options.time_limit).choice  # type: ignore[attr-defined]
            shared = solver.solve(tied.problem, time_limit=self.options.time_limit)  # type: ignore[attr-defined]
            return tied.expand(shared.choice)

        batch, given = args
        prices = baseline_objectives(problem, graph, mesh, batch, solve, given)  # type: ignore[arg-type]
        for price in prices:
            record_statistic(
                ctx, STATISTICS_NAME, f"baseline-{price.name}", price.objective,
                f"objective of the {price.name} plan in this problem (inf: not in its space)",
            )  # fmt: skip
        return prices

    def _solver(self, solver: object) -> object:
        """``solver`` with this pass's ``mip-gap``, if one is set, and without
        branch and bound if ``branch-and-bound`` is off."""
        if not self.options.branch_and_bound:
            if not (is_dataclass(solver) and hasattr(solver, "branch_and_bound")):
                raise AlpaError(
                    f"auto-sharding: solver '{self.options.solver}' has no branch-and-bound setting"
                )
            solver = replace(solver, branch_and_bound=False)  # type: ignore[type-var]
        if self.options.mip_gap == 0.0:
            return solver
        if not 0.0 < self.options.mip_gap < 1.0:
            raise AlpaError(f"auto-sharding: mip-gap must be in [0, 1), got {self.options.mip_gap}")
        if not (is_dataclass(solver) and hasattr(solver, "mip_gap")):
            raise AlpaError(f"auto-sharding: solver '{self.options.solver}' has no mip-gap setting")
        return replace(solver, mip_gap=self.options.mip_gap)  # type: ignore[type-var]

    def strategy_cache(
        self, ctx: Context, mesh: LogicalDeviceMesh, cost_model: CommCostModel | None = None
    ) -> StrategyCache:
        """A cache for :meth:`plan` on modules planned on ``mesh`` with these
        reshard options and ``cost_model``: the model :meth:`plan` binds for
        those modules (``calibrated`` on their cluster, say), by default the
        options' cost model as bound for modules without a cluster."""
        if cost_model is None:
            model = registry_of(ctx).get("cost_models", self.options.cost_model)()
            cost_model = bound_to_cluster(model, None)
        options = ReshardOptions(self.options.allow_all_gather, self.options.allow_all_to_all)
        return StrategyCache(mesh.shape, ReshardCoster(mesh, cost_model, options))

    def _arg_cost(
        self, mesh: LogicalDeviceMesh, batch: set[int], given: dict[int, ShardingSpec]
    ) -> Callable[[int, SSAValue, ShardingSpec], float]:
        def cost(index: int, arg: SSAValue, spec: ShardingSpec) -> float:
            if index in given:  # a user's annotation (manual sharding) is kept
                return 0.0 if spec == given[index] else INF
            if self.options.strategy_space == "heuristic":
                return 0.0 if spec == heuristic_spec(arg, mesh) else INF
            is_batch = index in batch
            if self._data_parallel:  # rows divide: checked in apply
                return 0.0 if spec == data_parallel_spec(arg, mesh, is_batch) else INF
            forced = self.options.force_batch_dim_to_mesh_dim
            if is_batch and forced >= 0 and spec.rank:
                # on an axis of size 1 (a model-parallel mesh), Alpa keeps the batch whole
                split = forced in spec.dims[0] if mesh.shape[forced] > 1 else not spec.dims[0]
                return 0.0 if split else INF
            if not is_batch and spec.is_replicated() and spec.rank:
                if not self.options.allow_replicated_parameters:
                    return INF
            # Ties go to the plan that keeps less of the inputs on each device.
            shape = arg.type.get_shape()  # type: ignore[attr-defined]
            shards = math.prod(spec.num_shards(mesh.shape, d) for d in range(len(shape)))
            return REPLICATED_PARAMETER_PENALTY / shards

        return cost


VARIANT_FIELDS = frozenset(
    {"allow_replicated_parameters", "time_limit", "mip_gap", "branch_and_bound"}
)
"""The options a :class:`PlanVariant` may change: they leave the strategy graph
as it is but for the arguments' strategy costs (``_arg_cost``)."""


def _differs_in_variant_fields(a: ShardingOptions, b: ShardingOptions) -> bool:
    return replace(b, **{f: getattr(a, f) for f in VARIANT_FIELDS}) == a


def solve_ilp(
    solver: object, problem: ILPProblem, tied: TiedProblem | None, time_limit: float
) -> ILPSolution:
    """``problem`` solved by ``solver`` (through ``tied``, its repeated layers
    sharing variables, if given)."""
    if tied is None:
        return solver.solve(problem, time_limit=time_limit)  # type: ignore[attr-defined, no-any-return]
    shared = solver.solve(tied.problem, time_limit=time_limit)  # type: ignore[attr-defined]
    choice = tied.expand(shared.choice)
    return replace(shared, choice=choice, objective=evaluate(problem, choice))


@dataclass(frozen=True)
class PlanVariant:
    """A second plan of a planned module under other options
    (:meth:`ShardingPlanner.plan`'s ``variant``), made on request from the
    first plan's strategy graph and ILP: the arguments' strategies priced
    again by the variant's options, the ILP solved again with its solver,
    and the plan written into ``copy``, the module as it was before the
    first plan. The same plan as planning ``copy`` with those options from
    the start, which would build the same graph again (its nodes, their
    strategies and the edges' matrices are those options' too)."""

    copy: ModuleCopy
    graph: StrategyGraph
    problem: ILPProblem
    tied: bool
    planner: ShardingPlanner
    solver: object
    """The variant's solver as the registry makes it (its options put on at
    :meth:`plan`)."""
    arg_cost: Callable[[int, SSAValue, ShardingSpec], float]

    def plan(self) -> ModuleOp:
        """The copy, planned under the variant's options (an :class:`AlpaError`
        where they leave no plan, as planning it from the start would)."""
        costs = list(self.problem.node_costs)
        for node in self.graph.nodes:
            if node.arg is not None:
                k = node.arg.index  # type: ignore[attr-defined]
                costs[node.index] = np.array(
                    [self.arg_cost(k, node.arg, s.value_specs[node.arg]) for s in node.strategies],
                    dtype=np.float64,
                )
        problem = replace(self.problem, node_costs=tuple(costs))
        tied = tie_repeated(problem) if self.tied else None
        options = self.planner.options
        # the variant's settings are put on its solver here, so that a solver
        # they do not fit fails this plan only, not the first
        solver = self.planner._solver(self.solver)
        solution = solve_ilp(solver, problem, tied, options.time_limit)
        graph, choice = self.copy.graph_of_choice(self.graph, solution.choice)
        function = self.copy.function
        apply_plan(function, graph, choice, aliases_of(function))
        objective = _without_tie_breaks(solution.objective, self.graph, solution.choice)
        function.attributes[OBJECTIVE_ATTR] = FloatAttr(objective, f64)
        return self.copy.module


def batch_leaves_with_rows(function: func.FuncOp, batch: Sequence[int]) -> set[int]:
    """The batch arguments that hold the batch's rows: those whose leading
    dimension is the batch size (the leading dimension most batch arguments
    share, the largest on a tie). A leaf passed with the batch but without its
    rows (a PRNG key of shape (2,), a scalar) is planned as any other input."""
    leading = {}
    for k in batch:
        shape = function.args[k].type.get_shape()  # type: ignore[attr-defined]
        if shape:
            leading[k] = shape[0]
    if not leading:
        return set(batch)
    counts = Counter(leading.values())
    rows = max(counts, key=lambda n: (counts[n], n))
    return {k for k, n in leading.items() if n == rows}


def _without_tie_breaks(objective: float, graph: object, choice: Sequence[int]) -> float:
    """The objective less the tie-breaking penalties of the arguments and of
    the fresh outputs (which prefer the plan that keeps less of them on each
    device): what the plan's communication costs, 0 for a plan without any."""
    ties = sum(
        node.strategies[choice[node.index]].cost
        for node in graph.nodes  # type: ignore[attr-defined]
        if node.arg is not None and math.isfinite(node.strategies[choice[node.index]].cost)
    )
    ties += sum(float(t[choice[n]]) for n, t in graph.output_ties.items())  # type: ignore[attr-defined]
    return max(objective - ties, 0.0) if abs(objective - ties) > 1e-12 else 0.0


def _cache_fits(
    cache: StrategyCache, mesh: LogicalDeviceMesh, cost_model: object, options: ReshardOptions
) -> bool:
    """Whether ``cache`` prices like a fresh coster of ``mesh`` would: the
    same model (a model bound to hardware, such as ``calibrated``, compares
    equal on the same system), options, shape and α/β; the devices matter
    only to a model bound to hardware (it prices the links between them)."""
    have = cache.coster
    bound = prices_by_devices(cost_model)
    return (
        have.cost_model == cost_model
        and have.options == options
        and (have.mesh.shape, have.mesh.alpha, have.mesh.beta)
        == (mesh.shape, mesh.alpha, mesh.beta)
        and (not bound or have.mesh.devices == mesh.devices)
    )


def share_automatically(problem: ILPProblem) -> bool:
    """Whether ``repeated-layers=auto`` shares the variables of repeated layers:
    for graphs of at least SHARE_LAYERS_FROM nodes and SHARE_PAIRS_FROM strategy
    pairs on their edges (``tie_repeated`` itself declines under a memory budget)."""
    if problem.num_nodes < SHARE_LAYERS_FROM:
        return False
    return sum(e.cost.size for e in problem.edges) >= SHARE_PAIRS_FROM


def _has_spec(function: func.FuncOp, index: int) -> bool:
    attrs = function.arg_attrs
    return attrs is not None and SPEC_ATTR in attrs.data[index].data  # type: ignore[attr-defined]


def _warn_if_beaten(objective: float, prices: Sequence[BaselinePrice]) -> None:
    """Say loudly that a baseline beats the ILP's plan (the plan is kept)."""
    import warnings

    beaten = worse_than(objective, prices)
    if beaten is not None:
        warnings.warn(
            f"auto-sharding: the ILP's plan costs {objective:,.6g} but the {beaten.name} plan "
            f"costs {beaten.objective:,.6g} in the same problem: the solver lost the optimum "
            "(a bug; please report it with the module and pass pipeline)",
            UserWarning,
            stacklevel=3,
        )


__all__ = [
    "OBJECTIVE_ATTR",
    "SHARE_LAYERS_FROM",
    "SHARE_PAIRS_FROM",
    "VARIANT_FIELDS",
    "PlanVariant",
    "ShardingOptions",
    "ShardingPlanner",
    "aliases_of",
    "int_list",
    "share_automatically",
    "solve_ilp",
]
