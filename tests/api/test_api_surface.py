"""Alpa's API surface on ``alpa_ir``: the top-level names, devices given as
JAX ``Device`` objects, physical meshes and their logical meshes,
``dump_debug_info``, and rematerialization (``jax.checkpoint`` in user code
survives into the compiled program; Alpa's ``remat_layer`` for stages)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from xdsl.dialects import func
from zoo_fixtures import fresh

import alpa_ir
from alpa_ir.api.pipeshard import AutoLayerOption, PipeshardParallel, UniformStageOption
from alpa_ir.errors import AlpaError

ALPA_NAMES = (
    "init shutdown parallelize grad value_and_grad mark_pipeline_boundary ShardParallel "
    "DataParallel Zero2Parallel Zero3Parallel PipeshardParallel AutoShardingOption "
    "ManualShardingOption AutoLayerOption ManualLayerOption AutoStageOption UniformStageOption "
    "ManualStageOption get_3d_parallel_method save_checkpoint restore_checkpoint "
    "LogicalDeviceMesh PhysicalDeviceMesh get_global_physical_mesh stage_dp"
).split()


@pytest.mark.parametrize("name", ALPA_NAMES)
def test_alpa_names_at_the_top_level(name: str) -> None:
    assert getattr(alpa_ir, name) is not None


_RNG = np.random.default_rng(0)
PARAMS = {f"w{i}": jnp.asarray(_RNG.normal(size=(32, 32)) * 0.3, jnp.float32) for i in range(4)}
BATCH = {
    "x": jnp.asarray(_RNG.normal(size=(16, 32)), jnp.float32),
    "y": jnp.asarray(_RNG.normal(size=(16, 32)), jnp.float32),
}


def _step(block: Any = None) -> Any:
    def layer(h: jax.Array, w: jax.Array) -> jax.Array:
        return jnp.tanh(jnp.tanh(h @ w) @ w)

    apply = block(layer) if block else layer

    def step(p: dict[str, jax.Array], b: dict[str, jax.Array]) -> Any:
        def loss(p: dict[str, jax.Array]) -> jax.Array:
            h = b["x"]
            for i in range(4):
                h = apply(h, p[f"w{i}"])
            return jnp.mean((h - b["y"]) ** 2)

        value, grads = jax.value_and_grad(loss)(p)
        return jax.tree.map(lambda a, g: a - 0.1 * g, p, grads), value

    return step


def _close(a: Any, b: Any) -> None:
    for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b), strict=True):
        np.testing.assert_allclose(np.asarray(x), np.asarray(y), rtol=1e-5, atol=1e-6)


def test_devices_as_jax_device_objects() -> None:
    devices = jax.devices()[4:]
    method = alpa_ir.ShardParallel(devices=devices)
    executable = alpa_ir.parallelize(_step(), method=method).get_executable(PARAMS, BATCH)
    assert executable.mesh.devices == (4, 5, 6, 7)
    pipeline = PipeshardParallel(devices=devices, stage_option=UniformStageOption(num_stages=2))
    placements = alpa_ir.parallelize(_step(), method=pipeline).get_executable(PARAMS, BATCH)
    assert [p.mesh.devices for p in placements.placements] == [(4, 5), (6, 7)]


def test_physical_mesh_gives_logical_meshes() -> None:
    physical = alpa_ir.get_global_physical_mesh()
    assert physical.num_devices == 8
    mesh = physical.get_logical_mesh((2, 4), mesh_alpha=(1.0, 1.0), mesh_beta=(1.0, 0.01))
    assert mesh.shape == (2, 4) and mesh.beta == (1.0, 0.01)
    with pytest.raises(AlpaError, match="holds 6 devices"):
        physical.get_logical_mesh((2, 3))
    with pytest.raises(AlpaError, match="must hold ints"):
        alpa_ir.LogicalDeviceMesh((2.7, 4))  # type: ignore[arg-type]
    with pytest.raises(AlpaError, match="device 3 twice"):
        alpa_ir.LogicalDeviceMesh((1, 2), devices=(3, 3))


def test_dump_debug_info(tmp_path: Path) -> None:
    shard = alpa_ir.parallelize(_step(), method=alpa_ir.ShardParallel())
    shard.get_executable(PARAMS, BATCH).dump_debug_info(tmp_path / "shard")
    files = {p.relative_to(tmp_path / "shard").as_posix() for p in (tmp_path / "shard").rglob("*")}
    assert {"input_module.mlir", "module.mlir", "plan.txt", "pass_pipeline.txt"} <= files
    assert "hlo/step.hlo" in files
    assert (tmp_path / "shard" / "hlo" / "step.hlo").read_text().startswith("HloModule")
    # Alpa's files besides the HLO: memory and where inputs and outputs live
    memory = (tmp_path / "shard" / "mem_usage.txt").read_text()
    assert "total_allocation_size:" in memory
    assert "P(" in (tmp_path / "shard" / "input_placement_specs.txt").read_text()
    assert "P(" in (tmp_path / "shard" / "output_placement_specs.txt").read_text()
    pipeline = PipeshardParallel(
        layer_option=AutoLayerOption(layer_num=2), stage_option=UniformStageOption(num_stages=2)
    )
    executable = alpa_ir.parallelize(_step(), method=pipeline).get_executable(PARAMS, BATCH)
    executable.dump_debug_info(tmp_path / "pipe")
    hlo = sorted(p.name for p in (tmp_path / "pipe" / "hlo").iterdir())
    assert hlo == sorted(f"{n}.hlo" for n in executable.stage_function_names())
    memory = (tmp_path / "pipe" / "mem_usage.txt").read_text().splitlines()
    assert len(memory) == len(executable.stage_function_names()) + 1  # per program, then total


def _hlo_count(text: str, op: str) -> int:
    return sum(1 for line in text.splitlines() if f" {op}(" in line)


def test_jax_checkpoint_survives_into_the_compiled_program() -> None:
    """The recomputation stays behind an optimization barrier: 16 tanh (8
    forward, 8 recomputed) instead of 8, where XLA would merge the copies."""
    counts = []
    for block in (None, jax.checkpoint):
        step = _step(block)
        executable = alpa_ir.parallelize(step, method=alpa_ir.ShardParallel()).get_executable(
            PARAMS, BATCH
        )
        counts.append(_hlo_count(executable.get_hlo_text(PARAMS, BATCH), "tanh"))
        _close(executable(fresh(PARAMS), BATCH), jax.jit(step)(PARAMS, BATCH))
    assert counts[1] > counts[0]


def test_layer_remat_recomputes_the_forward_in_each_stage() -> None:
    step = _step()
    functions = {}
    for remat in (False, True):
        method = PipeshardParallel(
            num_micro_batches=2,
            # Alpa's name for layer remat: remat_mode="coarse_grained_remat"
            layer_option=AutoLayerOption(
                layer_num=2, remat_mode="coarse_grained_remat" if remat else "none"
            ),
            stage_option=UniformStageOption(num_stages=2),
        )
        parallel = alpa_ir.parallelize(step, method=method)
        _close(parallel(fresh(PARAMS), BATCH), jax.jit(step)(PARAMS, BATCH))
        module = parallel.get_executable(PARAMS, BATCH).module
        functions[remat] = next(
            op
            for op in module.ops
            if isinstance(op, func.FuncOp) and op.sym_name.data == "stage0_backward"
        )

    def tanh(f: func.FuncOp) -> int:
        return sum(getattr(o, "primitive_name", "") == "tanh" for o in f.body.ops)

    assert tanh(functions[False]) == 0 and tanh(functions[True]) > 0
    assert len(functions[True].args) < len(functions[False].args)
    assert AutoLayerOption(layer_num=2, remat_mode="coarse_grained_remat").remat_layer
    with pytest.raises(alpa_ir.AlpaError, match="remat_mode 'fine_grained_remat' is not supported"):
        AutoLayerOption(layer_num=2, remat_mode="fine_grained_remat")
