"""``PipeshardParallel(manual_sharding_option=...)`` (Alpa's): the user's
PartitionSpecs of the step's inputs, on each stage's mesh by its own axis
names, and ``pipeline_intermediate_axes`` on the activations stages pass
forward; the rest is left to the planner, and the step equals one device."""

from __future__ import annotations

import jax
import numpy as np
import pytest
from alpa_mlp_fixtures import alpa_mlp_args as _args
from alpa_mlp_fixtures import alpa_mlp_step as _step
from jax.sharding import PartitionSpec as P

import alpa_ir
from alpa_ir import (
    AutoShardingOption,
    ManualShardingOption,
    ManualStageOption,
    PipeshardParallel,
)
from alpa_ir.dialects.sharding import ShardingSpec
from alpa_ir.errors import AlpaError
from alpa_ir.testing import HloParser


def _method(option: ManualShardingOption) -> PipeshardParallel:
    return PipeshardParallel(
        devices=list(range(4)),
        num_micro_batches=2,
        layer_option="manual",
        stage_option=ManualStageOption([[0], [1]], [(1, 2)] * 2, [(1, 2)] * 2, [{}] * 2),
        manual_sharding_option=option,
    )


# stage 0: Megatron's split over "model"; the rest replicated (None, as in Alpa)
IN_SPECS = ((P(None, "model"), P("model"), P("model", None), None, None, None, None, None), None)
SUBMESH_NAMES = (("dummy", "model"), ("dummy", "data"))


def test_stage_specs_follow_the_user_and_the_step_equals_one_device() -> None:
    params, batch = _args()
    want = jax.jit(_step)(params, batch)
    option = ManualShardingOption(
        None, SUBMESH_NAMES, IN_SPECS, pipeline_intermediate_axes=(("data", 1),)
    )
    parallel = alpa_ir.parallelize(_step, method=_method(option), batch_argnums=(1,))
    executable = parallel.get_executable(params, batch)
    specs = executable.stage_input_shard_specs
    split, rep = ShardingSpec(((), (1,))), ShardingSpec(((), ()))
    # stage 0's forward takes x, w0, b0, w1, b1: x replicated (None, as in
    # Alpa), the weights split over "model" (axis 1 of ("dummy", "model"))
    assert specs[0][:5] == (
        rep, split, ShardingSpec(((1,),)), ShardingSpec(((1,), ())), ShardingSpec(((),))
    )  # fmt: skip
    # stage 1's forward takes z split over "data" (axis 1 of ("dummy", "data"))
    # by columns, as asked (left alone, the ILP splits its rows)
    assert specs[1][0] == ShardingSpec(((), (1,)))
    texts = executable.get_hlo_text()
    stage1 = HloParser.parse_param_shapes(HloParser.get_param_line(texts[1]))
    assert "f32[32,5]" in stage1 and "f32[32,10]" not in stage1
    assert {"f32[10,12]", "f32[12]", "f32[12,14]", "f32[14]"} <= set(stage1)  # replicated
    jax.tree.map(
        lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-5),
        parallel(params, batch),
        want,
    )


def test_alpa_positional_order() -> None:
    assert AutoShardingOption(False).enable_auto_sharding is False
    option = ManualShardingOption(None, SUBMESH_NAMES, IN_SPECS)
    assert option.submesh_axis_names == SUBMESH_NAMES and option.in_axis_resources == IN_SPECS


@pytest.mark.parametrize(
    ("option", "match"),
    [
        (
            ManualShardingOption(None, (("a", "b"), ("a", "b")), IN_SPECS),
            "mesh axis 'model' is not an axis of its stage's mesh",
        ),
        (
            ManualShardingOption(None, (("a", "model"),) * 3, IN_SPECS),
            "submesh_axis_names names 3 meshes, the pipeline has 2",
        ),
    ],
    ids=["axis-not-on-mesh", "mesh-count"],
)
def test_bad_names_are_one_line_errors(option: ManualShardingOption, match: str) -> None:
    params, batch = _args()
    parallel = alpa_ir.parallelize(_step, method=_method(option), batch_argnums=(1,))
    with pytest.raises(AlpaError, match=match):
        parallel.get_executable(params, batch)


def test_options_it_cannot_honour_are_refused() -> None:
    with pytest.raises(AlpaError, match="needs mesh_axis_names or submesh_axis_names"):
        _method(ManualShardingOption(in_axis_resources=IN_SPECS))
    with pytest.raises(AlpaError, match="out_axis_resources is not supported"):
        _method(ManualShardingOption(("a", "b"), out_axis_resources=None or P()))
    shard = alpa_ir.ShardParallel(
        devices=list(range(4)), manual_sharding_option=ManualShardingOption(None, SUBMESH_NAMES)
    )
    params, batch = _args()
    with pytest.raises(AlpaError, match="are for PipeshardParallel's stages"):
        alpa_ir.parallelize(_step, method=shard).get_executable(params, batch)


def test_without_auto_sharding_no_ilp_runs_and_xla_propagates_the_given_specs(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """``AutoShardingOption(enable_auto_sharding=False)`` (Alpa's): no stage
    function is planned by the ILP; each keeps the given specs and XLA's
    propagation lays out the rest, and the step still equals one device."""
    from alpa_ir.autosharding.planner import OBJECTIVE_ATTR
    from alpa_ir.dialects.attrs import PROPAGATED_ATTR
    from alpa_ir.pipeline.stage_specs import main_calls

    params, batch = _args()
    option = ManualShardingOption(
        None, SUBMESH_NAMES, IN_SPECS, pipeline_intermediate_axes=(("data", 0),)
    )
    method = PipeshardParallel(
        devices=list(range(4)),
        num_micro_batches=2,
        layer_option="manual",
        stage_option=ManualStageOption([[0], [1]], [(1, 2)] * 2, [(1, 2)] * 2, [{}] * 2),
        manual_sharding_option=option,
        default_auto_sharding_option=AutoShardingOption(False),
    )
    parallel = alpa_ir.parallelize(_step, method=method, batch_argnums=(1,))
    with caplog.at_level("INFO", logger="alpa_ir.api.pipeshard_pipeline"):
        executable = parallel.get_executable(params, batch)
    assert any("no ILP" in r.getMessage() for r in caplog.records)
    assert "propagate=true" in executable.pass_pipeline
    functions = [f for _, _, f, _ in main_calls(executable.module)]
    assert functions and not any(OBJECTIVE_ATTR in f.attributes for f in functions)
    assert all(PROPAGATED_ATTR in f.attributes for f in functions)
    specs = executable.stage_input_shard_specs
    split, rep = ShardingSpec(((), (1,))), ShardingSpec(((), ()))
    assert specs[0][:5] == (
        rep, split, ShardingSpec(((1,),)), ShardingSpec(((1,), ())), ShardingSpec(((),))
    )  # fmt: skip
    assert specs[1][0] == ShardingSpec(((1,), ()))  # the intermediate split by rows
    l0_fwd, _, l1_bwd, _, _, _ = executable.get_hlo_text()
    # stage 0's activation: replicated, as XLA's propagation leaves it after
    # the row-split w1's all-reduce; stage 1 returns its gradient in the
    # layout the activation arrived in (propagated, not chosen by an ILP)
    assert "f32[32,10]" in HloParser.parse_root_shapes(HloParser.get_root_line(l0_fwd))
    assert "f32[16,10]" in HloParser.parse_root_shapes(HloParser.get_root_line(l1_bwd))
    jax.tree.map(
        lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-5),
        parallel(params, batch),
        jax.jit(_step)(params, batch),
    )
