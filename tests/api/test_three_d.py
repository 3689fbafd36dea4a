"""get_3d_parallel_method: dp x op x pp on the 8 CPU devices equals one device
(tiny GPT); pp = 1 degenerates into ShardParallel; bad degrees are one-line errors."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import pytest
from pipeshard_fixtures import _assert_same_steps
from xdsl.dialects import func

import alpa_ir
from alpa_ir.api.pipeshard import AutoLayerOption, ManualStageOption, PipeshardParallel
from alpa_ir.api.shard_parallel import ShardParallel
from alpa_ir.dialects.lax_attrs import ints_of
from alpa_ir.dialects.sharding import spec_of_value
from alpa_ir.errors import AlpaError
from alpa_ir.hardware.device_mesh import LogicalDeviceMesh
from alpa_ir.ir.module_utils import symbol_op


def test_dp2_op2_pp2_equals_one_device_on_the_tiny_gpt() -> None:
    from alpa_ir.models.train_step import make_train_step

    method = alpa_ir.get_3d_parallel_method(2, 2, 2, 2)
    assert isinstance(method, PipeshardParallel)
    assert method.layer_option == AutoLayerOption(layer_num=2)
    assert method.stage_option == ManualStageOption([[0], [1]], [(2, 2), (2, 2)])
    assert method.auto_sharding_option.force_batch_dim_to_mesh_dim == 0
    step, (state, batch) = make_train_step("gpt-tiny")
    parallel = _assert_same_steps(step, method, state, batch, steps=2)
    executable = parallel.get_executable(state, batch)
    text = executable.plan_text()
    assert "stage 0: layers 0..0 on mesh [2, 2] devices [0, 1, 2, 3]" in text
    assert "stage 1: layers 1..1 on mesh [2, 2] devices [4, 5, 6, 7]" in text
    # the batch arguments of the first stage are split over mesh axis 0 (data parallel)
    forward = symbol_op(executable.module, "stage0_forward", func.FuncOp)
    assert isinstance(forward, func.FuncOp)
    batch_args = list(ints_of(forward.attributes["alpa.batch_args"]))  # type: ignore[arg-type]
    assert batch_args
    for k in batch_args:
        assert 0 in spec_of_value(forward.args[k], forward).dims[0]


def test_one_pipeline_stage_degenerates_into_shard_parallel() -> None:
    method = alpa_ir.get_3d_parallel_method(4, 2, 4, 1)
    assert isinstance(method, ShardParallel)
    assert isinstance(method.devices, LogicalDeviceMesh)
    assert method.devices.shape == (2, 4) and method.devices.devices == tuple(range(8))
    assert method.num_micro_batches == 4
    assert method.auto_sharding_option.force_batch_dim_to_mesh_dim == 0
    kept = alpa_ir.get_3d_parallel_method(4, 2, 4, 1, allow_degenerate_into_shard_parallel=False)
    assert isinstance(kept, PipeshardParallel)
    assert kept.stage_option == ManualStageOption([[0]], [(2, 4)])
    # dp = 1: no batch axis to force
    assert (
        alpa_ir.get_3d_parallel_method(1, 1, 8, 1).auto_sharding_option.force_batch_dim_to_mesh_dim
        is None
    )


def _loss(p: dict[str, jax.Array], x: jax.Array) -> jax.Array:
    return jnp.mean(jnp.tanh(x @ p["w0"]) @ p["w1"])


def _step(p: dict[str, jax.Array], x: jax.Array) -> dict[str, jax.Array]:
    grads = alpa_ir.grad(_loss)(p, x)
    return jax.tree.map(lambda a, g: a - 0.1 * g, p, grads)


@pytest.mark.parametrize(
    ("degrees", "message"),
    [
        ((2, 2, 2, 4), "2 x 2 x 4 = 16, but there are 8 devices"),
        ((2, 3, 1, 1), "3 x 1 x 1 = 3, but there are 8 devices"),
        ((2, 0, 2, 2), "data_parallel must be a positive integer"),
        ((0, 2, 2, 2), "num_micro_batches must be a positive integer"),
    ],
)
def test_bad_degrees_are_one_line_errors(degrees: tuple[int, ...], message: str) -> None:
    with pytest.raises(AlpaError, match=message) as err:
        alpa_ir.get_3d_parallel_method(*degrees)
    assert "\n" not in str(err.value)


def test_more_pipeline_stages_than_layers_is_a_one_line_error() -> None:
    p = {"w0": jnp.ones((4, 8)), "w1": jnp.ones((8, 2))}
    method = alpa_ir.get_3d_parallel_method(1, 1, 1, 8)
    with pytest.raises(AlpaError, match="8 layers requested but @main has only") as err:
        alpa_ir.parallelize(_step, method=method, donate_argnums=()).get_executable(
            p, jnp.ones((8, 4))
        )
    assert "\n" not in str(err.value)


# ------------------------------------------------ the space of real pre-training runs


def test_virtual_stages_zero_and_recompute_build_what_was_asked() -> None:
    from alpa_ir.api.pipeshard import UniformStageOption

    method = alpa_ir.get_3d_parallel_method(
        4, 2, 2, 2, virtual_stages=2, zero_stage=3, recompute="full"
    )
    assert isinstance(method, PipeshardParallel)
    assert method.layer_option == AutoLayerOption(layer_num=4, remat_layer=True)
    assert method.stage_option == UniformStageOption(num_stages=2, submesh_logical_shape=(2, 2))
    assert method.pipeline_schedule == "interleaved-1f1b" and method.chunks_per_mesh == 2
    assert method.auto_sharding_option.reduce_scatter == "zero3"
    modes = {
        z: alpa_ir.get_3d_parallel_method(1, 2, 2, 2, zero_stage=z).auto_sharding_option
        for z in (0, 1, 2, 3)
    }
    assert [modes[z].reduce_scatter for z in (0, 1, 2, 3)] == ["none", "zero2", "zero2", "zero3"]
    # recompute on one stage keeps the pipeline runner (layers are what is recomputed)
    single = alpa_ir.get_3d_parallel_method(1, 2, 4, 1, recompute="full")
    assert isinstance(single, PipeshardParallel) and single.remat_layer


def test_context_parallelism_splits_batch_and_sequence() -> None:
    from jax.sharding import PartitionSpec

    method = alpa_ir.get_3d_parallel_method(1, 2, 2, 1, context_parallel=2)
    assert isinstance(method, ShardParallel)
    assert isinstance(method.devices, LogicalDeviceMesh) and method.devices.shape == (2, 2, 2)
    manual = method.manual_sharding_option
    assert manual is not None and manual.mesh_axis_names == ("data", "context", "tensor")
    assert manual.in_axis_resources == (None, PartitionSpec("data", "context"))


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"context_parallel": 2}, "2 x 2 x 2 x 2 = 16, but there are 8 devices"),
        ({"recompute": "selective"}, "selective recomputation is not implemented"),
        ({"zero_stage": 4}, "zero_stage must be 0, 1, 2 or 3, got 4"),
        ({"virtual_stages": 0}, "virtual_stages must be a positive integer, got 0"),
    ],
)
def test_bad_pretraining_options_are_one_line_errors(kwargs: dict, message: str) -> None:
    with pytest.raises(AlpaError, match=message) as err:
        alpa_ir.get_3d_parallel_method(1, 2, 2, 2, **kwargs)
    assert "\n" not in str(err.value)
    with pytest.raises(AlpaError, match="with pipeline stages it is simulated only"):
        alpa_ir.get_3d_parallel_method(1, 1, 2, 2, context_parallel=2)
    with pytest.raises(AlpaError, match="virtual_stages=2 needs pipeline stages"):
        alpa_ir.get_3d_parallel_method(1, 2, 4, 1, virtual_stages=2)


def test_parallel_config_micro_batches_and_cluster_checks() -> None:
    from alpa_ir.api.parallel_config import ParallelConfig, chunk_layers, interleaved_mesh_of

    config = ParallelConfig(tensor=8, pipeline=64, data=6, virtual_stages=2, micro_batch_size=1)
    assert config.micro_batches(3072) == 512 and config.num_devices == 3072
    assert config.describe() == "TP8·PP64x2v·DP6"
    config.check_cluster(3072, 8)
    with pytest.raises(AlpaError, match="tensor parallelism 16 does not stay within a node of 8"):
        ParallelConfig(tensor=16, data=2).check_cluster(32, 8)
    with pytest.raises(AlpaError, match="micro_batch_size 5 does not divide the 512 sequences"):
        ParallelConfig(data=6, micro_batch_size=5).micro_batches(3072)
    with pytest.raises(AlpaError, match="is not the global batch 64"):
        ParallelConfig(data=2, micro_batch_size=4, num_micro_batches=4).micro_batches(64)
    assert chunk_layers(126, 32)[:2] == [(0, 3), (4, 7)]
    assert interleaved_mesh_of(2, 3) == [0, 1, 0, 1, 0, 1]


def test_interleaved_zero3_full_recompute_equals_one_device_on_the_tiny_llama() -> None:
    from alpa_ir.models.train_step import make_train_step

    method = alpa_ir.get_3d_parallel_method(
        2, 2, 2, 2, virtual_stages=2, zero_stage=3, recompute="full"
    )
    step, (state, batch) = make_train_step("llama-tiny")
    parallel = _assert_same_steps(step, method, state, batch, steps=2)
    text = parallel.get_executable(state, batch).plan_text()
    assert text.count("on mesh [2, 2] devices [0, 1, 2, 3]") == 2  # two chunks on mesh 0


def test_context_parallel_equals_one_device_on_the_tiny_llama() -> None:
    from alpa_ir.models.train_step import make_train_step

    method = alpa_ir.get_3d_parallel_method(1, 2, 2, 1, context_parallel=2)
    step, (state, batch) = make_train_step("llama-tiny")
    parallel = alpa_ir.parallelize(step, method=method, donate_argnums=())
    _, loss = parallel(state, batch)
    _, want = jax.jit(step)(state, batch)
    assert abs(float(loss) - float(want)) < 1e-5
    executable = parallel.get_executable(state, batch)
    specs = executable.get_input_placement_specs()[1]
    tokens = specs["tokens"]
    assert "all-gather" in executable.get_hlo_text()
    assert tokens is not None
