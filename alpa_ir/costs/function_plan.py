"""One function planned on one logical mesh for the stage cost model: the
auto-sharding planner run with the mesh's prices (:func:`plan_function`),
the argument specs it keeps, and the time of the plan's collectives."""

from __future__ import annotations

import math
from collections.abc import Callable, Collection, Sequence
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from xdsl.dialects import func
from xdsl.dialects.builtin import (
    ArrayAttr,
    DenseArrayBase,
    DictionaryAttr,
    FlatSymbolRefAttr,
    ModuleOp,
    StringAttr,
)
from xdsl.ir import Block, Operation, SSAValue

from alpa_ir.autosharding.cost_model import CommCostModel, bound_to_cluster, prices_by_devices
from alpa_ir.autosharding.gradient_reductions import (
    StepPartition,
    deferred_reductions,
    gradient_ops,
)
from alpa_ir.autosharding.graph import StrategyCache
from alpa_ir.autosharding.plan_bytes import op_collectives
from alpa_ir.costs.stage_cost import ILP_TIME_UNIT, StageCostOptions
from alpa_ir.dialects.attrs import ACCUMULATED_ATTR, BATCH_ATTR
from alpa_ir.dialects.lax_attrs import ints_of
from alpa_ir.dialects.mesh import MESH_ATTR
from alpa_ir.dialects.sharding import (
    SPEC_ATTR,
    CollectiveOp,
    ShardingSpec,
    spec_of_value,
)
from alpa_ir.dialects.types import shape_of
from alpa_ir.errors import AlpaError
from alpa_ir.hardware.clusters import Cluster
from alpa_ir.hardware.device_mesh import LogicalDeviceMesh
from alpa_ir.ir.module_utils import main_function

if TYPE_CHECKING:
    from alpa_ir.autosharding.planner import ShardingOptions
    from alpa_ir.plugins.registry import PluginRegistry


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


def forward_end(block: Block) -> int:
    """The position of a forward+backward function's first-produced result
    among its ops (the forward's output: the end of its forward pass, see
    :func:`forward_inputs`); the number of ops if no op produces a result."""
    ops = list(block.ops)
    position = {op: i for i, op in enumerate(ops)}
    returned = block.last_op.operands if block.last_op is not None else ()
    produced = [
        position[v.owner]
        for v in returned
        if isinstance(v.owner, Operation) and v.owner in position
    ]
    return min(produced, default=len(ops))


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

    first_output = forward_end(block)
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
    cost_model: CommCostModel | None = None,
) -> func.FuncOp:
    """A copy of ``function`` auto-sharded on ``mesh`` (as ``@main`` of its own
    module, with ``cluster``'s ``mesh.cluster`` op for the cost model to bind
    to). ``strategy_caches``: where to keep (and find) the strategies of
    the ILP mesh, for many functions planned on the same meshes;
    ``statistics``: a list that receives the planner's statistics. The
    planner is :class:`~alpa_ir.autosharding.planner.ShardingPlanner` (the
    library of ``auto-sharding``) with ``registry``'s rules, cost models and
    solvers (default: the default registry); ``cost_model``: as
    :func:`plan_function_and_variant` takes it."""
    planned, _ = plan_function_and_variant(
        function, mesh, options, None, strategy_caches, statistics, registry, cluster, cost_model
    )
    return planned


def plan_function_and_variant(
    function: func.FuncOp,
    mesh: LogicalDeviceMesh,
    options: StageCostOptions,
    variant: StageCostOptions | None,
    strategy_caches: dict[tuple[object, ...], StrategyCache] | None = None,
    statistics: list[Any] | None = None,
    registry: PluginRegistry | None = None,
    cluster: Cluster | None = None,
    cost_model: CommCostModel | None = None,
) -> tuple[func.FuncOp, Callable[[], func.FuncOp] | None]:
    """:func:`plan_function`, and where ``variant`` is given (options that
    differ only in what :data:`~alpa_ir.autosharding.planner.VARIANT_FIELDS`
    names, e.g. ``allow_replicated_parameters``), a function that returns
    another copy planned with ``variant``'s options, from the first plan's
    strategy graph (:class:`~alpa_ir.autosharding.planner.PlanVariant`: the
    same plan as ``plan_function`` with ``variant`` gives, without building
    the graph again). None instead where the planner cannot make one.
    ``cost_model``: ``options``' communication cost model bound to ``cluster``
    (:func:`bound_cost_model`), where the caller keeps it for many plans (it
    memoizes its prices); default: bound again here."""
    from alpa_ir.autosharding.planner import ShardingPlanner
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
    scaled = options.num_micro_batches > 1 and accumulation_of(clone) is not None

    def sharding_options(options: StageCostOptions) -> ShardingOptions:
        sharding = options.sharding_options()
        if scaled:  # the per-micro-batch ops weigh B times what the gradients' reductions do
            sharding = replace(sharding, compute_grad_scale=float(options.num_micro_batches))
        return sharding

    planner = ShardingPlanner(sharding_options(options), scaled_ops=per_micro_batch_ops)
    ctx = make_context(registry)
    ctx.statistics = statistics
    cache = None
    if strategy_caches is not None:
        model = cost_model or bound_cost_model(options.cost_model, cluster, registry)
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
    later = planner.plan(ctx, module, cache, None if variant is None else sharding_options(variant))
    if later is None:
        return main_function(module), None
    return main_function(module), lambda: main_function(later.plan())


def accumulation_of(function: func.FuncOp) -> StepPartition | None:
    """``function`` as a step partition whose accumulated values are the
    results :data:`ACCUMULATED_ATTR` names (None without any)."""
    attr = function.attributes.get(ACCUMULATED_ATTR)
    indices = [int(k) for k in attr.get_values()] if isinstance(attr, DenseArrayBase) else []
    ret = function.body.block.last_op
    if not indices or ret is None:
        return None
    ops = tuple(op for op in function.body.block.ops if op is not ret)
    return StepPartition((), ops, (), tuple(ret.operands[k] for k in indices))


def per_micro_batch_ops(function: func.FuncOp, batch: Sequence[int]) -> set[Operation]:
    """The ops of a layer range's function that run per micro-batch: all but
    the gradients' producers (:func:`~alpa_ir.pipeline.step_partition.gradient_ops`)."""
    part = accumulation_of(function)
    if part is None:
        return set(function.body.block.ops)
    return set(part.compute) - gradient_ops(part)


def deferred_collectives(function: func.FuncOp) -> frozenset[Operation]:
    """The reductions of a planned layer range's function that a deferring
    runtime runs once per step, after the micro-batches
    (:func:`~alpa_ir.pipeline.step_partition.deferred_reductions`, ZeRO's
    slices included)."""
    part = accumulation_of(function)
    return frozenset() if part is None else deferred_reductions(part, function, any_reshard=True)


def bound_cost_model(
    name: str, cluster: Cluster | None, registry: PluginRegistry | None = None
) -> CommCostModel:
    """The registered communication cost model ``name`` (``registry``, default
    the default registry), bound to ``cluster`` (or to none) if it binds to
    clusters (``for_cluster``: ``auto``, ``calibrated``)."""
    from alpa_ir.plugins.registry import default_registry

    return bound_to_cluster((registry or default_registry()).get("cost_models", name)(), cluster)


def collective_time(
    function: func.FuncOp,
    mesh: LogicalDeviceMesh,
    pricer: object = None,
    only: Collection[Operation] | None = None,
    skip: Collection[Operation] = (),
) -> tuple[float, int]:
    """Seconds of the explicit collectives of a planned function, and their
    number. ``pricer``: a bound cost model with ``seconds(kind, mesh, bytes,
    axes)`` (``calibrated``); else the mesh's real α/β (slowest axis of each
    collective) times the bytes on the wire. ``only``: these collectives
    alone; ``skip``: all but these."""
    assert mesh.alpha is not None and mesh.beta is not None
    seconds = getattr(pricer, "seconds", None)
    total, count = 0.0, 0
    for op in function.walk():
        if not isinstance(op, CollectiveOp):
            continue
        if (only is not None and op not in only) or op in skip:
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
