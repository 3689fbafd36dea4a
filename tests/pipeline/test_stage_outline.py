"""Outlining an optimizer step whose apply ops do not all depend on the gradients.

Adam's step counter (``count + 1``), its bias corrections and the decay of its
moments (``b1 * mu``) depend only on ``@main`` arguments and constants. Every
apply-grad function that uses such a value computes its own copy, so no value
crosses from one stage's apply-grad function to another's (which
``emit-instructions`` rejects), and the step still equals one device.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import pytest
from pipeshard_fixtures import _assert_same_steps
from xdsl.dialects import func
from xdsl.dialects.builtin import ModuleOp
from xdsl.ir import SSAValue

import alpa_ir
from alpa_ir.api.pipeshard import AutoLayerOption, PipeshardParallel, UniformStageOption
from alpa_ir.frontend.jaxpr_import import import_jax
from alpa_ir.frontend.markers import AutomaticLayers, automatic_layers
from alpa_ir.ir.module_utils import main_function, symbol_op
from alpa_ir.pipeline.stage_assignment import StageSlice
from alpa_ir.pipeline.stage_outline import outline_stages

RESHARD_AND_EMIT = "builtin.module(cross-mesh-resharding,emit-instructions)"


def _adam_step() -> tuple[Any, tuple[Any, Any]]:
    from alpa_ir.models.train_step import make_train_step

    return make_train_step("mlp-tiny", optimizer="adam")


def _count_index(state: Any) -> int:
    """The flat argument index of Adam's step counter in ``(state, batch)``."""
    paths = [jax.tree_util.keystr(p) for p, _ in jax.tree_util.tree_flatten_with_path(state)[0]]
    (index,) = [k for k, p in enumerate(paths) if p.endswith(".count")]
    return index


def _calls(module: ModuleOp) -> list[func.CallOp]:
    return [op for op in main_function(module).body.block.ops if isinstance(op, func.CallOp)]


def _caller(value: SSAValue) -> str | None:
    owner = value.owner
    return owner.callee.string_value() if isinstance(owner, func.CallOp) else None


def _apply_to_apply_operands(module: ModuleOp) -> list[tuple[str, str]]:
    """(reader, producer) for every apply-grad call operand made by an apply-grad call."""
    crossing = []
    for call in _calls(module):
        reader = call.callee.string_value()
        if not reader.endswith("_apply_grad"):
            continue
        for operand in call.operands:
            producer = _caller(operand)
            if producer is not None and producer.endswith("_apply_grad"):
                crossing.append((reader, producer))
    return crossing


def _outlined_adam(num_stages: int) -> tuple[ModuleOp, Any]:
    step, (state, batch) = _adam_step()
    with automatic_layers(AutomaticLayers(layers=num_stages)):
        module = import_jax(lambda *a: step(*a), state, batch, batch_argnums=(1,))
    slices = [StageSlice(k, k, f"mesh{k}") for k in range(num_stages)]
    outline_stages(module, slices, num_micro_batches=2)
    return module, state


@pytest.mark.parametrize("num_stages", [2, 3])
def test_adam_apply_grad_functions_read_no_other_apply_grad(num_stages: int) -> None:
    module, state = _outlined_adam(num_stages)
    assert _apply_to_apply_operands(module) == []
    main = main_function(module)
    count = main.body.block.args[_count_index(state)]
    applies = [c for c in _calls(module) if c.callee.string_value().endswith("_apply_grad")]
    assert len(applies) == num_stages
    # every stage increments its own copy of the counter for its bias corrections
    for call in applies:
        assert count in call.operands, call.callee.string_value()
        function = symbol_op(module, call.callee.string_value(), func.FuncOp)
        assert isinstance(function, func.FuncOp)
        arg = function.body.block.args[list(call.operands).index(count)]
        assert any(use.operation.name == "lax.add" for use in arg.uses)
    # the step returns the new count computed by the lowest stage
    returned = main.body.block.last_op.operands  # type: ignore[union-attr]
    new_count = returned[_count_index(state)]
    assert _caller(new_count) == "stage0_apply_grad"


def test_adam_step_passes_resharding_and_instruction_emission() -> None:
    from alpa_ir.dialects.pipeline import ProgramOp
    from alpa_ir.ir.module_utils import top_level_ops
    from alpa_ir.passmanager.pass_manager import PassManager
    from alpa_ir.plugins.registry import default_registry

    step, (state, batch) = _adam_step()
    method = PipeshardParallel(
        num_micro_batches=2,
        layer_option=AutoLayerOption(layer_num=2),
        stage_option=UniformStageOption(num_stages=2),
    )
    executable = alpa_ir.parallelize(step, method=method, donate_argnums=()).get_executable(
        state, batch
    )
    module = executable.module.clone()
    assert _apply_to_apply_operands(module) == []
    PassManager(default_registry(), RESHARD_AND_EMIT).run(module)
    assert len(list(top_level_ops(module, ProgramOp))) == 2


@pytest.mark.parametrize("num_stages", [2, 3])
def test_pipeshard_adam_step_equals_one_device(num_stages: int) -> None:
    step, (state, batch) = _adam_step()
    method = PipeshardParallel(
        num_micro_batches=2,
        layer_option=AutoLayerOption(layer_num=num_stages),
        stage_option=UniformStageOption(num_stages=num_stages, submesh_logical_shape=(1, 2)),
        devices=range(2 * num_stages),
    )
    _assert_same_steps(step, method, state, batch)


def _loss(p: dict[str, Any], x: jax.Array) -> jax.Array:
    h = jnp.tanh(x @ p["w0"])
    h = alpa_ir.mark_pipeline_boundary(h)
    return jnp.mean(jnp.tanh(h @ p["w1"]) ** 2)


def _decayed_step(state: dict[str, Any], x: jax.Array) -> tuple[dict[str, Any], jax.Array]:
    """SGD whose rate decays with a counter; only the second layer uses the
    counter's square, which the step also returns."""
    loss, grads = alpa_ir.value_and_grad(_loss)(state["p"], x)
    n = state["n"] + 1
    rate = 0.5 / n.astype(jnp.float32)
    square = n * n
    params = {
        "w0": state["p"]["w0"] - rate * grads["w0"],
        "w1": state["p"]["w1"] - rate / square.astype(jnp.float32) * grads["w1"],
    }
    return {"p": params, "n": n, "square": square}, loss


def _decayed_example() -> tuple[dict[str, Any], jax.Array]:
    k = jax.random.split(jax.random.PRNGKey(1), 3)
    state = {
        "p": {"w0": jax.random.normal(k[0], (8, 8)), "w1": jax.random.normal(k[1], (8, 4))},
        "n": jnp.zeros((), jnp.int32),
        "square": jnp.zeros((), jnp.int32),
    }
    return state, jax.random.normal(k[2], (16, 8))


def test_a_returned_copy_comes_from_the_lowest_stage_using_it() -> None:
    state, x = _decayed_example()
    module = import_jax(_decayed_step, state, x, batch_argnums=(1,))
    outline_stages(module, [StageSlice(0, 0, "mesh0"), StageSlice(1, 1, "mesh1")])
    assert _apply_to_apply_operands(module) == []
    returned = main_function(module).body.block.last_op.operands  # type: ignore[union-attr]
    leaves = jax.tree_util.tree_flatten_with_path((state, jnp.zeros(())))[0]
    source = {
        jax.tree_util.keystr(path): _caller(value)
        for (path, _), value in zip(leaves, returned, strict=False)
    }
    assert source["[0]['n']"] == "stage0_apply_grad"  # both stages use n
    assert source["[0]['square']"] == "stage1_apply_grad"  # only stage 1 uses n * n
    assert source["[0]['p']['w0']"] == "stage0_apply_grad"
    assert source["[0]['p']['w1']"] == "stage1_apply_grad"


@pytest.mark.parametrize("micro_batches", [1, 2])
def test_a_counter_shared_by_two_stages_equals_one_device(micro_batches: int) -> None:
    state, x = _decayed_example()
    method = PipeshardParallel(
        num_micro_batches=micro_batches,
        stage_option=UniformStageOption(num_stages=2, submesh_logical_shape=(1, 2)),
        devices=range(4),
    )
    _assert_same_steps(_decayed_step, method, state, x)


def _tied_loss(p: dict[str, Any], tokens: jax.Array) -> jax.Array:
    """A tied embedding: looked up in the first layer, the LM head in the second."""
    h = jnp.tanh(p["emb"][tokens] @ p["w"])
    h = alpa_ir.mark_pipeline_boundary(h)
    logits = h @ p["emb"].T
    return -jnp.mean(jax.nn.log_softmax(logits)[:, 0])


def _tied_step(state: dict[str, Any], tokens: jax.Array) -> Any:
    loss, grads = alpa_ir.value_and_grad(_tied_loss)(state, tokens)
    return jax.tree.map(lambda a, g: a - 0.1 * g, state, grads), loss


def _tied_example() -> tuple[dict[str, Any], jax.Array]:
    k = jax.random.split(jax.random.PRNGKey(1), 3)
    state = {
        "emb": jax.random.normal(k[0], (64, 16)) * 0.3,
        "w": jax.random.normal(k[1], (16, 16)) * 0.3,
    }
    return state, jax.random.randint(k[2], (8,), 0, 64)


def test_a_tied_parameters_gradient_parts_are_added_once_per_step() -> None:
    """The LM head's part of the embedding's gradient does not cross to the
    first stage on every micro-batch: each stage accumulates its part and the
    apply phase adds them."""
    from alpa_ir.pipeline.layer_ranges import LayerRanges

    state, tokens = _tied_example()
    module = import_jax(_tied_step, state, tokens, batch_argnums=(1,))
    first = LayerRanges(main_function(module)).function(0, 0)
    assert first.backward_bytes == 8 * 16 * 4  # the activations' gradient, not 64 x 16
    method = PipeshardParallel(num_micro_batches=2, stage_option=UniformStageOption(num_stages=2))
    _assert_same_steps(_tied_step, method, state, tokens)


def test_the_last_stage_has_a_backward_function_of_its_own() -> None:
    """As in Alpa, every stage's programs are forward, backward and apply-grad:
    the last stage's backward is cut from its forward at the ``backward``
    marker, the forward returning what the backward needs."""
    module, _ = _outlined_adam(2)
    names = [c.callee.string_value() for c in _calls(module)]
    assert names[:4] == ["stage0_forward", "stage1_forward", "stage1_backward", "stage0_backward"]
    forward = symbol_op(module, "stage1_forward", func.FuncOp)
    assert isinstance(forward, func.FuncOp)
    # the forward ends at the loss: no transpose of a matmul (a dot_general of
    # the loss's cotangent) is left in it
    dots = [op for op in forward.body.walk() if op.name == "lax.dot_general"]
    backward = symbol_op(module, "stage1_backward", func.FuncOp)
    assert isinstance(backward, func.FuncOp)
    backward_dots = [op for op in backward.body.walk() if op.name == "lax.dot_general"]
    assert len(dots) >= 1 and len(backward_dots) >= 2 * len(dots)
