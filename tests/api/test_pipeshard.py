"""PipeshardParallel on the 8 CPU devices equals the single-device step.

Manual layers (``mark_pipeline_boundary``) on a small MLP cover the stage
options, micro-batch counts and schedules cheaply; automatic layers
(``cluster-operators``) on the tiny GPT cover a real model. Three steps are
compared, losses and parameters at rtol 1e-4.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import pytest
from pipeshard_fixtures import _assert_same_steps, _example, _step

import alpa_ir
from alpa_ir.api.pipeshard import (
    AutoLayerOption,
    ManualStageOption,
    PipeshardParallel,
    UniformStageOption,
)
from alpa_ir.errors import AlpaError
from alpa_ir.frontend.markers import AutomaticLayers, automatic_layers
from alpa_ir.ir.module_utils import main_function
from alpa_ir.pipeline.stage_assignment import count_layers


@pytest.mark.parametrize("micro_batches", [1, 2, 4])
@pytest.mark.parametrize("schedule", ["gpipe", "1f1b", "zb-h1"])
def test_uniform_stages_equal_one_device(micro_batches: int, schedule: str) -> None:
    state, batch = _example()
    method = PipeshardParallel(
        num_micro_batches=micro_batches,
        stage_option=UniformStageOption(num_stages=3, submesh_logical_shape=(1, 2)),
        devices=range(6),
        pipeline_schedule=schedule,  # type: ignore[arg-type]
    )
    _assert_same_steps(_step, method, state, batch)


def test_manual_stages_on_meshes_of_different_shapes() -> None:
    state, batch = _example()
    method = PipeshardParallel(
        num_micro_batches=2,
        stage_option=ManualStageOption([[0], [1, 2]], [(1, 4), (2, 2)]),
    )
    _assert_same_steps(_step, method, state, batch)
    executable = alpa_ir.parallelize(_step, method=method).get_executable(state, batch)
    text = executable.plan_text()
    assert "stage 0: layers 0..0 on mesh [1, 4] devices [0, 1, 2, 3]" in text
    assert "stage 1: layers 1..2 on mesh [2, 2] devices [4, 5, 6, 7]" in text


def test_transfers_follow_their_tile_plans_with_a_local_all_gather() -> None:
    """Values cross meshes as the plans of cross-mesh-resharding say: each
    tile once, then an all-gather on the destination mesh (BROADCAST). The
    last stage keeps its batch on the size-1 mesh axis, so the activation it
    receives is replicated there (left free, it splits the batch as the
    sender does, and nothing is gathered)."""
    state, batch = _example()
    stages = ManualStageOption(
        [[0], [1], [2]], [(1, 2)] * 3, None, [{}, {}, dict(force_batch_dim_to_mesh_dim=0)]
    )
    method = PipeshardParallel(num_micro_batches=2, stage_option=stages, devices=range(6))
    _assert_same_steps(_step, method, state, batch)
    executable = alpa_ir.parallelize(_step, method=method).get_executable(state, batch)
    program = executable.program
    gathered = [t for t in program.transfers.values() if t.gather]
    assert gathered, "no transfer of this plan uses the local all-gather"
    assert all(t.plan is not None for t in program.transfers.values())
    executable.runner.transport.bytes_moved = 0
    executable(state, batch)
    sends = [
        program.transfers[i.target]
        for instructions in program.instructions.values()
        for i in instructions
        if i.kind == "send"
    ]
    planned = sum(t.plan.cross_bytes for t in sends if t.plan is not None)
    assert executable.runner.transport.bytes_moved == planned
    # without the rewrite every destination replica would get the whole tile
    whole = sum(
        t.plan.tensor_bytes * len(t.plan.dst.devices)
        for t in sends
        if t.plan is not None and t.gather
    )
    assert sum(t.plan.cross_bytes for t in sends if t.plan is not None and t.gather) < whole


def test_the_module_holds_the_pipeline_plan() -> None:
    state, batch = _example()
    method = PipeshardParallel(num_micro_batches=2, stage_option=UniformStageOption(num_stages=2))
    executable = alpa_ir.parallelize(_step, method=method).get_executable(state, batch)
    text = str(executable.module)
    assert "pipeline.plan @plan {stages = [@stage0, @stage1], num_micro_batches = 2" in text
    for name in ("stage0_forward", "stage0_backward", "stage0_apply_grad", "stage1_forward"):
        assert f"func.func @{name}(" in text
        assert f"func.call @{name}(" in text
    assert "sharding.spec" in text


def test_automatic_layers_on_the_tiny_gpt() -> None:
    from alpa_ir.models.train_step import make_train_step

    step, (state, batch) = make_train_step("gpt-tiny")
    method = PipeshardParallel(
        num_micro_batches=2,
        layer_option=AutoLayerOption(layer_num=2),
        stage_option=UniformStageOption(num_stages=2),
    )
    _assert_same_steps(step, method, state, batch)


def test_cluster_operators_marks_the_differentiated_function() -> None:
    from alpa_ir.frontend.jaxpr_import import import_jax

    def loss(p: jax.Array, x: jax.Array) -> jax.Array:
        for _ in range(4):
            x = jnp.tanh(x @ p)
        return jnp.sum(x)

    def step(p: jax.Array, x: jax.Array) -> Any:
        return alpa_ir.grad(loss)(p, x)

    p, x = jnp.ones((8, 8)), jnp.ones((4, 8))
    with automatic_layers(AutomaticLayers(layers=4)):
        module = import_jax(lambda a, b: step(a, b), p, x)
    assert count_layers(main_function(module)) == 4


def test_cluster_operators_balances_flops_and_marks_crossing_values() -> None:
    from xdsl.context import Context

    from alpa_ir.frontend.jaxpr_import import import_jax
    from alpa_ir.passes.cluster_operators import ClusterOperators

    def forward(p: jax.Array, x: jax.Array) -> jax.Array:
        for _ in range(4):
            x = jnp.tanh(x @ p)
        return jnp.sum(x)

    module = import_jax(forward, jnp.ones((8, 8)), jnp.ones((4, 8)))
    ClusterOperators(layers=4, delta=0.0).apply(Context(), module)
    main = main_function(module)
    markers = [
        op for op in main.body.block.ops if getattr(op, "primitive_name", "") == "pipeline_marker"
    ]
    assert len(markers) == 3
    assert all(len(m.operands) == 1 for m in markers)  # only the activation crosses
    flops = [a.value.data for a in main.attributes["pipeline.layer_flops"].data]  # type: ignore[attr-defined]
    assert max(flops) - min(flops) <= 4 * 8  # one tanh/sum of imbalance at most


@pytest.mark.parametrize(
    ("option", "message"),
    [
        (UniformStageOption(num_stages=4), "4 stages requested but the step has only 3 layers"),
        (UniformStageOption(num_stages=3), "8 devices cannot be split evenly into 3 stages"),
        (ManualStageOption([[0, 2], [1]], [(1, 4), (1, 4)]), "are not consecutive"),
        (ManualStageOption([[0], [1, 2]], [(1, 4), (1, 2)]), "hold 6 devices but the plan has 8"),
    ],
)
def test_bad_stage_options(option: Any, message: str) -> None:
    state, batch = _example()
    method = PipeshardParallel(stage_option=option)
    with pytest.raises(AlpaError, match=message):
        alpa_ir.parallelize(_step, method=method).get_executable(state, batch)


def test_plan_for_more_devices_than_exist() -> None:
    state, batch = _example()
    method = PipeshardParallel(devices=range(16), stage_option=UniformStageOption(num_stages=2))
    with pytest.raises(AlpaError, match="needs 16 devices but only 8 local devices exist"):
        alpa_ir.parallelize(_step, method=method).get_executable(state, batch)


def test_instruction_lists_follow_the_schedule() -> None:
    state, batch = _example()
    orders = {}
    for schedule in ("gpipe", "1f1b", "zb-h1"):
        method = PipeshardParallel(
            num_micro_batches=4,
            stage_option=UniformStageOption(num_stages=3, submesh_logical_shape=(1, 2)),
            devices=range(6),
            pipeline_schedule=schedule,  # type: ignore[arg-type]
        )
        program = alpa_ir.parallelize(_step, method=method).get_executable(state, batch).program
        orders[schedule] = [
            (i.target, i.micro_batch) for i in program.instructions["mesh0"] if i.kind == "run"
        ]
        orders[schedule + "@mesh1"] = [
            (i.target, i.micro_batch) for i in program.instructions["mesh1"] if i.kind == "run"
        ]
    # GPipe: every forward of stage 0 before any backward; 1F1B: stage 0 runs
    # its first backward before its last forward (at most 3 in flight).
    gpipe, one_f = orders["gpipe"], orders["1f1b"]
    assert gpipe.index(("stage0_backward", 0)) > gpipe.index(("stage0_forward", 3))
    assert one_f.index(("stage0_backward", 0)) < one_f.index(("stage0_forward", 3))
    assert sorted(gpipe) == sorted(one_f)
    # ZB-H1: the backward is B and W; stage 1 defers W of micro-batch 0 past its
    # second B, where 1F1B's fused backward would have run it, and holds at most
    # 3 micro-batches (1F1B's peak on stage 0)
    zb = orders["zb-h1@mesh1"]
    assert {("stage1_backward_weight", b) for b in range(4)} <= set(zb)
    assert zb.index(("stage1_backward_weight", 0)) > zb.index(("stage1_backward", 1))


def _same_mesh_layout_mismatches(module: Any) -> list[str]:
    """Values of @main read on the mesh that produced them (or an argument
    read by several functions of one mesh) with another spec than they have."""
    from xdsl.dialects import func

    from alpa_ir.dialects.sharding import SPEC_ATTR
    from alpa_ir.ir.module_utils import symbol_op

    def spec(attrs: Any, k: int) -> Any:
        return None if attrs is None else attrs.data[k].data.get(SPEC_ATTR)

    layout: dict[Any, Any] = {}
    bad = []
    for call in main_function(module).body.block.ops:
        if not isinstance(call, func.CallOp):
            continue
        f = symbol_op(module, call.callee.root_reference.data, func.FuncOp)
        mesh = f.attributes["mesh.mesh"].root_reference.data
        for k, v in enumerate(call.operands):
            have = layout.setdefault((v, mesh), spec(f.arg_attrs, k))
            if have != spec(f.arg_attrs, k):
                bad.append(f"{f.sym_name.data} arg {k}")
        for r, v in enumerate(call.results):
            layout[(v, mesh)] = spec(f.res_attrs, r)
    return bad


def test_functions_of_one_mesh_agree_on_the_layouts_they_share() -> None:
    from alpa_ir.models.train_step import make_train_step

    step, (state, batch) = make_train_step("gpt-tiny")
    method = PipeshardParallel(
        num_micro_batches=2,
        layer_option=AutoLayerOption(layer_num=2),
        stage_option=UniformStageOption(num_stages=2),
    )
    executable = alpa_ir.parallelize(step, method=method).get_executable(state, batch)
    assert _same_mesh_layout_mismatches(executable.module) == []
    _assert_same_steps(step, method, state, batch)


def test_bench_pipeshard_overhead_reports_time_per_instruction(
    capsys: pytest.CaptureFixture[str],
) -> None:
    from alpa_ir.tools.bench_pipeshard import main

    argv = ["overhead", "--stages", "2", "--micro-batches", "2", "--repeat", "2"]
    assert main([*argv, "--backends", "xla"]) == 0
    out = capsys.readouterr().out
    assert "xla: 2 stages of 1 device, B=2:" in out and "ms per instruction" in out


def _masked_loss(p: dict[str, Any], x: jax.Array, y: jax.Array) -> jax.Array:
    """A boolean mask made in the first layer crosses the boundary with the
    activations (as a causal mask does): it has no cotangent to mirror."""
    h = jnp.tanh(x @ p["w0"])
    mask = h > 0
    h, mask = alpa_ir.mark_pipeline_boundary(h, mask)
    h = jnp.where(mask, h, 0.5 * h) @ p["w1"]
    return jnp.mean((h @ p["w2"] - y) ** 2)


def _masked_step(state: dict[str, Any], batch: dict[str, jax.Array]) -> Any:
    loss, grads = alpa_ir.value_and_grad(_masked_loss)(state["p"], batch["x"], batch["y"])
    return {"p": jax.tree.map(lambda a, g: a - 0.1 * g, state["p"], grads), "n": state["n"]}, loss


def test_a_boolean_crossing_a_layer_boundary_equals_one_device() -> None:
    state, batch = _example()
    method = PipeshardParallel(num_micro_batches=2, stage_option=UniformStageOption(num_stages=2))
    _assert_same_steps(_masked_step, method, state, batch)
