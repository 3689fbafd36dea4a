"""Stage cost options of the benchmark: rematerialization (kept layer inputs,
one transient stash, one more forward pass), ZeRO-2 memory and fixed argument
shardings; the transient in construct-stages' layer sums."""

from __future__ import annotations

import pytest
from stage_fixtures import BATCH, HIDDEN, _cluster, _deep_module, _small_cluster, _stage
from xdsl.dialects import func
from xdsl.ir import Block

from alpa_ir.costs.analytical_stage_cost import AnalyticalStageCostModel
from alpa_ir.costs.function_plan import forward_inputs, with_argument_specs
from alpa_ir.costs.stage_cost import FORWARD_SHARE, StageCostOptions
from alpa_ir.costs.stage_table import ViewCost, cost_table
from alpa_ir.dialects.sharding import ShardingSpec
from alpa_ir.dialects.types import shape_of
from alpa_ir.errors import AlpaError
from alpa_ir.ir.module_utils import main_function
from alpa_ir.pipeline.layer_ranges import LayerRanges


def test_remat_keeps_the_inputs_and_pays_one_forward() -> None:
    c = _cluster()
    mesh = c.logical_mesh((1, 1))
    plain = AnalyticalStageCostModel().stage_cost(_stage(0), mesh, c, param_args=(0, 1))
    remat = AnalyticalStageCostModel(StageCostOptions(remat=True)).stage_cost(
        _stage(0), mesh, c, param_args=(0, 1)
    )
    # Kept per micro-batch: the input batch only; the rest of the stash is transient.
    assert remat.memory.activations == BATCH * HIDDEN * 4
    assert remat.memory.activations < plain.memory.activations
    full = plain.memory.activations + plain.memory.transient  # one micro-batch's peak
    assert remat.memory.transient == pytest.approx(full - remat.memory.activations)
    assert remat.memory.peak(1) == pytest.approx(plain.memory.peak(1))
    assert remat.memory.peak(4) < plain.memory.peak(4)
    assert plain.recompute_time == 0.0
    # One more forward pass: a third of the compute and memory traffic.
    extra = FORWARD_SHARE * (plain.compute_time + plain.memory_time)
    assert remat.recompute_time == pytest.approx(extra)
    assert remat.latency == pytest.approx(plain.latency + extra)
    assert remat.latency > plain.latency
    # The transient counts once in Eq. 5, the kept inputs once per later stage.
    budget = remat.memory.persistent + remat.memory.transient + 3.5 * remat.memory.activations
    assert remat.max_stages_after(budget) == 2


def test_without_remat_a_micro_batch_keeps_its_stash_and_the_backward_temporaries_once() -> None:
    """Without remat a micro-batch in flight holds what its forward leaves for
    its backward (the stash); the backward's own temporaries (the gradients
    it makes on the way) are held by one micro-batch at a time, as the
    recomputed stash is with remat: not once per micro-batch in flight."""
    from alpa_ir.costs.live_memory import peak_live_bytes

    c = _cluster()
    mesh = c.logical_mesh((1, 1))
    stage = _stage(0)
    plain = AnalyticalStageCostModel().stage_cost(stage, mesh, c, param_args=(0, 1))
    m = plain.memory
    block = stage.body.block
    full = peak_live_bytes(block, {0, 1}, _bytes)
    assert m.activations + m.transient == pytest.approx(full)
    assert m.transient > 0 and m.activations >= BATCH * HIDDEN * 4  # at least the input
    # four micro-batches in flight: four stashes and one set of temporaries
    assert m.peak(4) == pytest.approx(m.persistent + m.transient + 4 * m.activations)
    assert m.peak(4) < m.persistent + 4 * full


def _bytes(value: object) -> float:
    import math

    return float(math.prod(shape_of(value.type)) * 4)  # type: ignore[attr-defined]


def test_remat_keeps_the_activation_in_not_the_gradient_in() -> None:
    ranges = LayerRanges(main_function(_deep_module()))
    middle = ranges.function(1, 1)  # x from layer 0, its weight, the gradient from layer 2
    block = middle.function.body.block
    non_params = [k for k in range(len(block.args)) if k not in middle.param_args]
    assert len(non_params) == 2
    (kept,) = forward_inputs(block, set(middle.param_args))
    first = min(non_params, key=lambda k: _first_use(block, k))
    assert kept == first
    assert block.args[kept] in block.first_op.operands  # the forward matmul's input
    last = ranges.function(3, 3)  # the loss layer receives no gradient: all its inputs are kept
    lb = last.function.body.block
    assert forward_inputs(lb, set(last.param_args)) == [
        k for k in range(len(lb.args)) if k not in last.param_args and lb.args[k].uses
    ]
    c = _small_cluster()
    model = AnalyticalStageCostModel(StageCostOptions(remat=True))
    cost = model.stage_cost(middle.function, c.logical_mesh((1, 1)), c, middle.param_args)
    assert cost.memory.activations == 8 * 16 * 4  # the [8, 16] f32 activation only


def _first_use(block: Block, k: int) -> int:
    ops = list(block.ops)
    return min(ops.index(u.operation) for u in block.args[k].uses)


def test_zero_partitions_optimizer_state_of_replicated_parameters() -> None:
    c = _cluster()
    mesh = c.logical_mesh((4, 1))  # the ILP data-parallelizes the batch of 16 over 4
    options = StageCostOptions(keep_argument_specs=True)
    function = _annotated(_stage(0), {0: (), 1: ()})  # parameters replicated
    plain = AnalyticalStageCostModel(options).stage_cost(function, mesh, c, param_args=(0, 1))
    zero = AnalyticalStageCostModel(
        StageCostOptions(keep_argument_specs=True, zero=True)
    ).stage_cost(function, mesh, c, param_args=(0, 1))
    params = 2 * HIDDEN * HIDDEN * 4
    assert plain.memory.parameters == zero.memory.parameters == params
    assert plain.memory.optimizer_state == 2 * params
    assert zero.memory.optimizer_state == pytest.approx(2 * params / 4)
    assert zero.memory.gradients == pytest.approx(params / 4)
    assert zero.latency == pytest.approx(plain.latency)


def test_kept_argument_specs_constrain_the_plan() -> None:
    c = _cluster()
    mesh = c.logical_mesh((1, 4))
    free = AnalyticalStageCostModel().stage_cost(_stage(0), mesh, c, param_args=(0, 1))
    # both weights split by rows over the 4 devices (and the annotation is ignored without the option)
    function = _annotated(_stage(0), {0: ((1,), ()), 1: ((1,), ())})
    kept = AnalyticalStageCostModel(StageCostOptions(keep_argument_specs=True)).stage_cost(
        function, mesh, c, param_args=(0, 1)
    )
    dropped = AnalyticalStageCostModel().stage_cost(function, mesh, c, param_args=(0, 1))
    assert kept.memory.parameters == 2 * HIDDEN * HIDDEN * 4 / 4
    assert dropped.latency == pytest.approx(free.latency)
    replicated = _annotated(_stage(0), {0: (), 1: ()})
    whole = AnalyticalStageCostModel(StageCostOptions(keep_argument_specs=True)).stage_cost(
        replicated, mesh, c, param_args=(0, 1)
    )
    assert whole.memory.parameters == 2 * HIDDEN * HIDDEN * 4


def test_layer_sums_keep_the_largest_transient() -> None:
    ranges = LayerRanges(main_function(_deep_module()))
    model = AnalyticalStageCostModel(StageCostOptions(remat=True))
    table = cost_table(ranges, _small_cluster(), model, cost_mode="layer-sum", progress=False)
    singles = [table.cost(k, k, (1, 1)) for k in range(4)]
    whole = table.cost(0, 3, (1, 1))
    assert all(s.transient > 0 for s in singles)
    assert whole.transient == max(s.transient for s in singles)
    assert whole.activations == pytest.approx(sum(s.activations for s in singles))
    assert whole.peak(2) == whole.persistent + whole.transient + 2 * whole.activations
    view = ViewCost(1.0, 10.0, 2.0, 0.0, transient=5.0)
    assert view.max_stages_after(10.0 + 5.0 + 2.0 * 3) == 2


def test_bad_argument_index_is_one_line() -> None:
    with pytest.raises(AlpaError, match="argument 9 of @main does not exist") as err:
        with_argument_specs(_stage(0), {9: ShardingSpec(((),))})
    assert "\n" not in str(err.value)


def _annotated(function: func.FuncOp, specs: dict[int, tuple[tuple[int, ...], ...]]) -> func.FuncOp:
    """``function`` with the given argument shardings (``()``: replicated; else
    the mesh axes of each dimension)."""
    out = {}
    for k, dims in specs.items():
        rank = len(shape_of(function.body.block.args[k].type))
        out[k] = ShardingSpec(dims or ((),) * rank)
    return with_argument_specs(function, out)
