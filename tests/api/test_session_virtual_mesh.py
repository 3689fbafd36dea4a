"""Alpa's ``set_global_virtual_physical_mesh``: the mesh is kept by the Ray
session (as ``set_global_physical_mesh``'s, tests/api/test_session_meshes.py),
not by a module global; pipelines given no ``devices`` cut their stages from
it, and it ends with ``shutdown()``."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import pytest
from ray_cluster_fixture import joined_cluster

import alpa_ir
from alpa_ir.device_mesh import (
    ClusterMesh,
    get_global_virtual_physical_mesh,
    set_global_virtual_physical_mesh,
)
from alpa_ir.dialects.mesh import LogicalMeshOp
from alpa_ir.errors import AlpaError

pytestmark = pytest.mark.ray


def _step(w: tuple[jnp.ndarray, jnp.ndarray], x: jnp.ndarray) -> jnp.ndarray:
    def loss(w: tuple[jnp.ndarray, jnp.ndarray]) -> jnp.ndarray:
        h = jnp.tanh(x @ w[0])
        alpa_ir.mark_pipeline_boundary()
        return jnp.mean(jnp.tanh(h @ w[1]) ** 2)

    grads = alpa_ir.grad(loss)(w)
    return jax.tree.map(lambda p, g: p - 0.1 * g, w, grads)


def _planned_devices() -> set[int]:
    w, x = (jnp.ones((4, 4)), jnp.ones((4, 4))), jnp.ones((8, 4))
    method = alpa_ir.PipeshardParallel(
        num_micro_batches=2, layer_option="manual", stage_option="uniform"
    )
    plan = alpa_ir.compile(_step, w, x, method=method)
    meshes = [op for op in plan.module.walk() if isinstance(op, LogicalMeshOp)]
    return {d for m in meshes for d in m.device_ids}


def test_without_ray_there_is_no_session_to_keep_a_virtual_mesh() -> None:
    alpa_ir.shutdown()
    assert get_global_virtual_physical_mesh() is None
    with pytest.raises(AlpaError, match=r"set_global_virtual_physical_mesh: .*alpa_ir\.init"):
        set_global_virtual_physical_mesh(alpa_ir.get_global_physical_mesh())


def test_the_session_virtual_mesh_is_the_pipelines_default() -> None:
    host = {"num_cpus": 1, "resources": {"alpa_cpu_device": 2}}
    with joined_cluster(host, host):
        whole = get_global_virtual_physical_mesh()
        assert isinstance(whole, ClusterMesh) and whole.device_ids == (0, 1, 2, 3)
        assert _planned_devices() == {0, 1, 2, 3}  # the whole cluster
        second = alpa_ir.get_global_cluster().get_virtual_physical_mesh([1], 2)
        alpa_ir.set_global_virtual_physical_mesh(second)
        kept = get_global_virtual_physical_mesh()
        assert isinstance(kept, ClusterMesh)
        assert kept.host_ids == (1,) and kept.device_ids == (2, 3)
        assert _planned_devices() == {2, 3}  # PipeshardParallel() without devices
        with pytest.raises(AlpaError, match="expected a physical mesh"):
            set_global_virtual_physical_mesh("mesh")  # type: ignore[arg-type]
    host = {"num_cpus": 1, "resources": {"alpa_cpu_device": 2}}
    with joined_cluster(host, host):  # a new session starts without it
        assert get_global_virtual_physical_mesh().device_ids == (0, 1, 2, 3)  # type: ignore[union-attr]
