"""Alpa's ``set_global_physical_mesh``: the mesh is kept by the Ray session
(its key-value store, this driver's job), not by a module global; methods
given no ``devices`` plan on it, and it ends with ``shutdown()``."""

from __future__ import annotations

import jax.numpy as jnp
import pytest
from ray_cluster_fixture import joined_cluster

import alpa_ir
from alpa_ir.device_mesh import ClusterMesh, get_global_physical_mesh, set_global_physical_mesh
from alpa_ir.dialects.mesh import LogicalMeshOp
from alpa_ir.errors import AlpaError

pytestmark = pytest.mark.ray


def _step(w: jnp.ndarray, x: jnp.ndarray) -> jnp.ndarray:
    return jnp.tanh(x @ w)


def _planned_devices() -> tuple[int, ...]:
    w, x = jnp.ones((4, 4)), jnp.ones((8, 4))
    plan = alpa_ir.compile(_step, w, x, method=alpa_ir.ShardParallel())
    meshes = [op for op in plan.module.walk() if isinstance(op, LogicalMeshOp)]
    assert len(meshes) == 1
    return tuple(meshes[0].device_ids)


def test_without_ray_there_is_no_session_to_keep_a_mesh() -> None:
    alpa_ir.shutdown()
    with pytest.raises(AlpaError, match=r"set_global_physical_mesh: .*alpa_ir\.init"):
        set_global_physical_mesh(alpa_ir.get_global_physical_mesh())
    assert get_global_physical_mesh().num_devices == 8  # the local devices
    assert get_global_physical_mesh(create_if_not_exist=False) is None


def test_the_session_mesh_is_the_default_and_ends_with_shutdown() -> None:
    host = {"num_cpus": 1, "resources": {"alpa_cpu_device": 2}}
    with joined_cluster(host, host):
        assert get_global_physical_mesh(create_if_not_exist=False) is None
        assert _planned_devices() == (0, 1, 2, 3)  # the whole cluster
        second = alpa_ir.DeviceCluster().get_physical_mesh(host_ids=[1])
        set_global_physical_mesh(second)
        kept = get_global_physical_mesh()
        assert isinstance(kept, ClusterMesh)
        assert kept.host_ids == (1,) and kept.device_ids == (2, 3)
        assert _planned_devices() == (2, 3)  # ShardParallel() without devices
        with pytest.raises(AlpaError, match="expected a physical mesh"):
            set_global_physical_mesh("mesh")  # type: ignore[arg-type]
    # a new session (another job) starts without it
    host = {"num_cpus": 1, "resources": {"alpa_cpu_device": 2}}
    with joined_cluster(host, host):
        assert get_global_physical_mesh(create_if_not_exist=False) is None
