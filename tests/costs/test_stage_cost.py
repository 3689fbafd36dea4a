"""The analytical stage cost model: FLOPs, communication from the auto-sharding
plan, memory parts, Eq. 5's max_stages_after, and the structural cache."""

from __future__ import annotations

import math
from dataclasses import replace
from typing import Any

import jax
import jax.numpy as jnp
import pytest
from stage_fixtures import BATCH, HIDDEN, _cluster, _stage
from xdsl.dialects import func

import alpa_ir
import alpa_ir.costs.analytical_stage_cost as analytical_stage_cost
from alpa_ir.autosharding.cost_model import collective_bytes_on_wire
from alpa_ir.autosharding.dead_code import erase_dead_code
from alpa_ir.autosharding.plan_bytes import predicted_collectives
from alpa_ir.costs.analytical_stage_cost import AnalyticalStageCostModel
from alpa_ir.costs.flops import function_flops
from alpa_ir.costs.function_fingerprint import function_fingerprint
from alpa_ir.costs.function_plan import plan_function
from alpa_ir.costs.stage_cost import StageCostOptions, StageMemory
from alpa_ir.dialects.types import shape_of
from alpa_ir.errors import AlpaError
from alpa_ir.hardware.clusters import Cluster, ClusterLevel, get_cluster
from alpa_ir.hardware.device_mesh import LogicalDeviceMesh
from alpa_ir.ir.module_utils import main_function
from alpa_ir.plugins.registry import default_registry


def test_registered_as_the_analytical_stage_cost_model() -> None:
    model = default_registry().get("stage_cost_models", "analytical")()
    assert isinstance(model, AnalyticalStageCostModel)


def test_flops_of_the_matmuls_and_elementwise_ops() -> None:
    matmul = 2 * BATCH * HIDDEN * HIDDEN
    elementwise = BATCH * HIDDEN  # one tanh: 1 FLOP per element
    # One layer: forward h @ w and the weight gradient x^T @ dh (x needs no gradient).
    one = function_flops(_stage(0, count=1))
    assert 2 * matmul + elementwise <= one < 2 * matmul * 1.05
    # Two layers: 2 forwards, 2 weight gradients, 1 input gradient of the second layer.
    two = function_flops(_stage(0, count=2))
    assert 5 * matmul + 2 * elementwise <= two < 5 * matmul * 1.05


def test_flops_of_a_convolution() -> None:
    def conv(x: jax.Array, k: jax.Array) -> jax.Array:
        return jax.lax.conv_general_dilated(x, k, (1, 1), "SAME")

    f = main_function(alpa_ir.import_jax(conv, jnp.ones((2, 3, 8, 8)), jnp.ones((4, 3, 3, 3))))
    assert function_flops(f) == 2 * (2 * 4 * 8 * 8) * (3 * 3 * 3)


def test_single_device_cost_parts() -> None:
    c = _cluster()
    model = AnalyticalStageCostModel()
    cost = model.stage_cost(_stage(0), c.logical_mesh((1, 1)), c, param_args=(0, 1))
    assert cost.communication_time == 0.0 and cost.num_collectives == 0
    live = _stage(0).clone()
    assert erase_dead_code(live) > 0  # its loss: nothing the stage returns reads it
    assert cost.flops == function_flops(live) < function_flops(_stage(0))
    # compute: each matmul at the profile's GEMM price for its shape (the
    # testbed's V100: a roofline over whole waves of tiles, plus the launch)
    prices = model.device_model(c, model.options)
    dots = [
        op for op in _stage(0).body.block.ops if getattr(op, "primitive_name", "") == "dot_general"
    ]
    assert dots
    assert cost.compute_time == pytest.approx(
        sum(prices.op_gemm_time(op, lambda v: tuple(shape_of(v.type))) for op in dots)
    )
    assert cost.memory_time > 0
    assert cost.latency == pytest.approx(
        cost.compute_time + cost.memory_time + cost.communication_time
    )
    params = 2 * HIDDEN * HIDDEN * 4
    assert cost.memory.parameters == params
    assert cost.memory.gradients == params and cost.memory.optimizer_state == 2 * params
    # Activations: at least the input batch and one hidden layer's output, at most all values.
    assert 2 * BATCH * HIDDEN * 4 <= cost.memory.activations < 40 * BATCH * HIDDEN * 4


def test_one_device_is_priced_without_the_ilp_and_as_the_ilp_would(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    c = _cluster()
    mesh = c.logical_mesh((1, 1))
    for options in (StageCostOptions(), StageCostOptions(remat=True, fusion=True, zero=True)):
        ilp = AnalyticalStageCostModel(options)._plan_and_price(
            plan_function(_stage(0), mesh, options), mesh, c, (0, 1), options
        )  # the function already planned on the one-device mesh: priced as it is
        with monkeypatch.context() as patch:
            patch.setattr(analytical_stage_cost, "plan_function", _no_ilp)
            direct = AnalyticalStageCostModel(options).stage_cost(_stage(0), mesh, c, (0, 1))
        assert direct == ilp


def _no_ilp(*args: Any, **kwargs: Any) -> Any:
    raise AssertionError("a one-device mesh needs no ILP")


def test_communication_is_the_plans_collectives_priced_with_alpha_beta() -> None:
    c = _cluster()
    mesh = c.logical_mesh((1, 4))
    model = AnalyticalStageCostModel(StageCostOptions(cost_model="alpha-beta"))
    cost = model.stage_cost(_stage(0), mesh, c, param_args=(0, 1))
    planned = plan_function(_stage(0), mesh, model.options)
    collectives = predicted_collectives(planned, mesh.shape)
    assert collectives and cost.num_collectives == len(collectives)
    alpha, beta = mesh.alpha[1], mesh.beta[1]  # every collective runs on axis 1 (size 4)
    expected = sum(
        alpha + beta * collective_bytes_on_wire(p.kind, p.bytes, p.group_size) for p in collectives
    )
    assert cost.communication_time == pytest.approx(expected)
    # Work is split over the 4 devices; the ILP objective is the same plan in µs.
    single = model.stage_cost(_stage(0), c.logical_mesh((1, 1)), c, param_args=(0, 1))
    assert cost.flops < single.flops / 2
    assert cost.objective == pytest.approx(cost.communication_time * 1e6, rel=0.05)


def test_slower_links_cost_more() -> None:
    fast = _cluster()
    slow = Cluster(
        "slow",
        (ClusterLevel("node", 1, 1e9, 1e-4, shared=True), ClusterLevel("gpu", 8, 1e9, 1e-4)),
        fast.device_memory,
        fast.peak_flops,
        fast.hbm_bandwidth,
        device_name="slow GPU",
    )
    for cost_model in ("alpha-beta", "auto"):  # Alpa's formulas; calibrated on both GPUs
        model = AnalyticalStageCostModel(StageCostOptions(cost_model=cost_model))
        a = model.stage_cost(_stage(0), fast.logical_mesh((1, 4)), fast, param_args=(0, 1))
        b = model.stage_cost(_stage(0), slow.logical_mesh((1, 4)), slow, param_args=(0, 1))
        assert b.communication_time > 10 * a.communication_time, cost_model


def test_views_that_differ_only_in_axis_order_share_one_plan() -> None:
    """Permuting a mesh's axes with their α/β permutes the plans, not their cost."""
    c = _cluster()  # one node: both axes of a view have the node's α/β
    model = AnalyticalStageCostModel()
    first = model.stage_cost(_stage(0), c.logical_mesh((2, 4)), c, param_args=(0, 1))
    swapped = model.stage_cost(_stage(0), c.logical_mesh((4, 2)), c, param_args=(0, 1))
    assert swapped is first
    row = model.stage_cost(_stage(0), c.logical_mesh((1, 8)), c, param_args=(0, 1))
    column = model.stage_cost(_stage(0), c.logical_mesh((8, 1)), c, param_args=(0, 1))
    assert column is row
    assert (model.stats.hits, model.stats.misses) == (2, 2)
    # across nodes the axes differ in α/β: (2, 8) and (8, 2) are other problems
    two = get_cluster("alpa-testbed", num_nodes=2)
    model.stage_cost(_stage(0), two.logical_mesh((2, 8)), two, param_args=(0, 1))
    model.stage_cost(_stage(0), two.logical_mesh((8, 2)), two, param_args=(0, 1))
    assert model.stats.misses == 4
    # fixed argument shardings name axes by position: no sharing
    fixed = AnalyticalStageCostModel(StageCostOptions(keep_argument_specs=True))
    fixed.stage_cost(_stage(0), c.logical_mesh((2, 4)), c, param_args=(0, 1))
    fixed.stage_cost(_stage(0), c.logical_mesh((4, 2)), c, param_args=(0, 1))
    assert (fixed.stats.hits, fixed.stats.misses) == (0, 2)


def test_identical_layer_ranges_hit_the_cache() -> None:
    c = _cluster()
    model = AnalyticalStageCostModel()
    early, late = _stage(0), _stage(2)  # layers 0-1 and 2-3: other names, same structure
    assert early is not late
    assert function_fingerprint(early) == function_fingerprint(late)
    mesh = c.logical_mesh((2, 2))
    first = model.stage_cost(early, mesh, c, param_args=(0, 1))
    assert (model.stats.hits, model.stats.misses) == (0, 1)
    again = model.stage_cost(late, c.logical_mesh((2, 2), (4, 5, 6, 7)), c, param_args=(0, 1))
    assert again is first and (model.stats.hits, model.stats.misses) == (1, 1)
    # Another structure, mesh view, or option misses.
    model.stage_cost(_stage(0, hidden=32), mesh, c, param_args=(0, 1))
    model.stage_cost(early, c.logical_mesh((4, 1)), c, param_args=(0, 1))
    model.stage_cost(early, mesh, c, param_args=(0,))
    assert (model.stats.hits, model.stats.misses) == (1, 4)
    assert function_fingerprint(_stage(0, hidden=32)) != function_fingerprint(early)
    # without a device profile (nor a memory bandwidth: no memory-bound
    # GEMMs), the nominal prices read the efficiencies
    nominal = replace(c, profile=None, hbm_bandwidth=0.0)
    base = AnalyticalStageCostModel().stage_cost(early, mesh, nominal, param_args=(0, 1))
    other = AnalyticalStageCostModel(StageCostOptions(compute_efficiency=0.25))
    slower = other.stage_cost(early, mesh, nominal, param_args=(0, 1))
    assert slower.compute_time == pytest.approx(2 * base.compute_time)


def test_memory_gives_eq5_max_stages_after() -> None:
    memory = StageMemory(parameters=4.0, gradients=4.0, optimizer_state=8.0, activations=3.0)
    assert memory.persistent == 16.0 and memory.peak(2) == 22.0
    assert memory.max_stages_after(16.0 + 3.0) == 0  # one micro-batch: no later stage
    assert memory.max_stages_after(16.0 + 3.0 * 4 + 2.0) == 3
    assert memory.max_stages_after(18.0) == -1  # not even one micro-batch fits
    assert StageMemory(1.0, 1.0, 0.0, 0.0).max_stages_after(2.0) == math.inf
    c = _cluster()
    cost = AnalyticalStageCostModel().stage_cost(
        _stage(0), c.logical_mesh((1, 1)), c, param_args=(0, 1)
    )
    budget = cost.memory.persistent + 5.5 * cost.memory.activations
    assert cost.max_stages_after(budget) == 4


def test_sharded_parameters_take_less_memory_per_device() -> None:
    c = _cluster()
    model = AnalyticalStageCostModel()
    single = model.stage_cost(_stage(0), c.logical_mesh((1, 1)), c, param_args=(0, 1))
    four = model.stage_cost(_stage(0), c.logical_mesh((1, 4)), c, param_args=(0, 1))
    assert four.memory.parameters <= single.memory.parameters
    assert four.memory.activations < single.memory.activations


def test_default_parameters_are_the_non_batch_arguments() -> None:
    c = _cluster()
    mesh = c.logical_mesh((1, 1))
    model = AnalyticalStageCostModel()
    every = model.stage_cost(_stage(0), mesh, c)  # no batch attribute: every argument
    explicit = model.stage_cost(_stage(0), mesh, c, param_args=(0, 1))
    assert every.memory.parameters == explicit.memory.parameters + BATCH * HIDDEN * 4


@pytest.mark.parametrize(
    ("make", "message"),
    [
        (lambda: StageCostOptions(compute_efficiency=0.0), "compute_efficiency must be in"),
        (lambda: StageCostOptions(memory_efficiency=1.5), "memory_efficiency must be in"),
        (lambda: StageCostOptions(optimizer_state_factor=-1.0), "optimizer_state_factor must be"),
        (
            lambda: AnalyticalStageCostModel().stage_cost(
                _stage(0), LogicalDeviceMesh((1, 1)), _cluster(), param_args=(7,)
            ),
            "parameter argument 7 of @main does not exist",
        ),
    ],
)
def test_bad_input_is_one_line(make: Any, message: str) -> None:
    with pytest.raises(AlpaError, match=message) as err:
        make()
    assert "\n" not in str(err.value)


def _plan_text(function: func.FuncOp) -> str:
    return str(function)  # nothing run-dependent (solve times are pass statistics)


def test_functions_planned_with_shared_strategies_get_the_same_plans() -> None:
    c = _cluster()
    caches: dict[tuple[object, ...], Any] = {}
    options = StageCostOptions()
    for shape in [(2, 4), (1, 8)]:
        mesh = c.logical_mesh(shape)
        for function in [_stage(0), _stage(0, count=3), _stage(0, hidden=32)]:
            shared = plan_function(function, mesh, options, caches)
            alone = plan_function(function, mesh, options)
            assert _plan_text(shared) == _plan_text(alone)
    # one cache per ILP mesh, reused by all three functions
    assert len(caches) == 2
    cache = next(iter(caches.values()))
    assert cache.op_strategies and cache.groups and cache.matrices


def test_a_strategy_cache_of_another_mesh_is_refused() -> None:
    from alpa_ir.autosharding.planner import ShardingOptions, ShardingPlanner
    from alpa_ir.ir.context import make_context

    c = _cluster()
    planner = ShardingPlanner(ShardingOptions())
    other = planner.strategy_cache(make_context(), c.logical_mesh((1, 8)))
    caches = {}
    plan_function(_stage(0), c.logical_mesh((2, 4)), StageCostOptions(), caches)
    (key,) = caches
    caches[key] = other
    with pytest.raises(AlpaError, match="strategy cache was made for another mesh"):
        plan_function(_stage(0), c.logical_mesh((2, 4)), StageCostOptions(), caches)


def test_an_axis_that_splits_no_dimension_is_planned_as_absent() -> None:
    """On (3, 8), the axis of 3 divides no dimension of the stage (16, 64):
    the view costs what (1, 8) costs, planned once, and it prices exactly like
    planning on (3, 8) itself; with ZeRO the 3 replicas still share the
    gradients and optimizer state."""
    three = get_cluster("alpa-testbed", num_nodes=3)
    one = _cluster()
    for zero in (False, True):
        model = AnalyticalStageCostModel(StageCostOptions(zero=zero))
        wide = three.logical_mesh((3, 8))
        assert model.live_mesh(_stage(0), wide).shape == (1, 8)
        node = model.stage_cost(_stage(0), one.logical_mesh((1, 8)), one, param_args=(0, 1))
        cost = model.stage_cost(_stage(0), wide, three, param_args=(0, 1))
        assert (model.stats.hits, model.stats.misses) == (1, 1)
        direct = model._compute(_stage(0), wide, three, (0, 1))  # no reduction
        assert cost.latency == pytest.approx(direct.latency)
        assert cost.memory == direct.memory
        assert cost.latency == node.latency
        if zero:
            assert cost.memory.optimizer_state == pytest.approx(node.memory.optimizer_state / 3)
        else:
            assert cost.memory == node.memory


def test_the_options_the_planner_takes_pass_through_by_name() -> None:
    """The stage cost options that are the planner's own reach it unchanged,
    and only those (a new option named like a planner's is a choice, seen here)."""
    from alpa_ir.costs.stage_cost import SHARED_WITH_PLANNER

    assert set(SHARED_WITH_PLANNER) == {
        "solver", "time_limit", "mip_gap", "memory_budget", "allow_all_gather",
        "allow_replicated_parameters", "cost_model", "repeated_layers",
        "force_batch_dim_to_mesh_dim", "branch_and_bound",
    }  # fmt: skip
    options = StageCostOptions(
        solver="highs", time_limit=7.0, mip_gap=0.05, memory_budget=1e9, allow_all_gather=False,
        allow_replicated_parameters=False, cost_model="alpha-beta", repeated_layers="share",
        force_batch_dim_to_mesh_dim=1, branch_and_bound=False,
    )  # fmt: skip
    planner = options.sharding_options()
    assert {name: getattr(planner, name) for name in SHARED_WITH_PLANNER} == {
        name: getattr(options, name) for name in SHARED_WITH_PLANNER
    }


def test_layers_that_differ_only_in_constant_values_share_a_fingerprint() -> None:
    """Blocks that draw dropout from seeds of their own (Hugging Face GPT-2's)
    cost the same; another constant shape is another structure."""
    from alpa_ir.ir.module_utils import main_function
    from alpa_ir.ir.text import parse_module

    def block(seed: int, shape: str = "tensor<ui32>") -> func.FuncOp:
        text = (
            "builtin.module {\n"
            f"  func.func @main(%x: tensor<4xf32>) -> ({shape}, tensor<4xf32>) {{\n"
            f"    %s = lax.constant {seed} : {shape}\n"
            "    %y = lax.tanh %x : (tensor<4xf32>) -> tensor<4xf32>\n"
            f"    func.return %s, %y : {shape}, tensor<4xf32>\n"
            "  }\n"
            "}"
        )
        return main_function(parse_module(text))

    assert function_fingerprint(block(572844704)) == function_fingerprint(block(2099313785))
    assert function_fingerprint(block(1)) != function_fingerprint(block(1, "tensor<f32>"))


def test_a_model_fingerprints_each_of_its_recent_functions_once(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A worker asks for each of its functions on one view in turn: the
    fingerprints of the last IDENTITIES_KEPT functions are kept, not only the
    last one's (GPT-2 small's parent process fingerprinted its 4 layers 20 times)."""
    counted: list[func.FuncOp] = []
    real = analytical_stage_cost.function_fingerprint

    def counting(function: func.FuncOp) -> str:
        counted.append(function)
        return real(function)

    monkeypatch.setattr(analytical_stage_cost, "function_fingerprint", counting)
    c = _cluster()
    functions = [_stage(0, count=1), _stage(0, count=2), _stage(1, count=1)]
    model = AnalyticalStageCostModel()
    keys = [
        [model.cache_key(f, c.logical_mesh(shape), c) for f in functions]
        for shape in ((1, 2), (2, 1), (1, 4))
    ]
    assert len(counted) == len(functions)
    assert keys[0][0] != keys[0][1] and keys[0][0] == model.cache_key(
        functions[0], c.logical_mesh((1, 2)), c
    )
    # beyond IDENTITIES_KEPT functions, the oldest is forgotten (and not held alive)
    many = [functions[0].clone() for _ in range(analytical_stage_cost.IDENTITIES_KEPT + 1)]
    for f in many:
        model.cache_key(f, c.logical_mesh((1, 2)), c)
    counted.clear()
    model.cache_key(many[0], c.logical_mesh((1, 2)), c)
    model.cache_key(many[-1], c.logical_mesh((1, 2)), c)
    assert counted == [many[0]]


def test_a_transposed_convolution_counts_only_the_products_of_real_inputs() -> None:
    """The input gradient of a stride-2 convolution dilates its input by 2 in
    each spatial dimension: of the window's products, one in 4 meets a value;
    it has the forward convolution's FLOPs, not four times them."""

    def conv(x: jax.Array, k: jax.Array) -> jax.Array:
        return jax.lax.conv_general_dilated(x, k, (2, 2), "SAME")

    x, k = jnp.ones((2, 3, 8, 8)), jnp.ones((4, 3, 3, 3))
    forward = function_flops(main_function(alpa_ir.import_jax(conv, x, k)))

    def input_grad(x: jax.Array, k: jax.Array) -> jax.Array:
        return jax.grad(lambda x: conv(x, k).sum())(x)

    backward = function_flops(main_function(alpa_ir.import_jax(input_grad, x, k)))
    assert backward - forward == pytest.approx(forward, rel=0.35)
