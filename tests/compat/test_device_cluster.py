"""Alpa's ``DeviceCluster`` on a Ray cluster of two hosts on this machine:
its hosts and devices, and meshes cut from them that a method takes as
``devices``; ``get_global_cluster`` is None without Ray."""

from __future__ import annotations

import pytest
from ray_cluster_fixture import joined_cluster

import alpa_ir
from alpa_ir.device_mesh import (
    DeviceCluster,
    LocalPhysicalDeviceMesh,
    PhysicalDeviceMesh,
    get_global_cluster,
    get_global_num_devices,
)
from alpa_ir.errors import AlpaError
from alpa_ir.hardware.device_mesh import resolve_mesh
from alpa_ir.runtime.ray_cluster import backend_devices

pytestmark = pytest.mark.ray


def test_without_ray_there_is_no_cluster() -> None:
    alpa_ir.shutdown()
    assert get_global_cluster() is None
    assert get_global_num_devices() == 8  # this process's devices
    assert LocalPhysicalDeviceMesh is PhysicalDeviceMesh
    with pytest.raises(AlpaError, match=r"call alpa_ir\.init"):
        DeviceCluster()


def test_device_cluster_of_two_hosts() -> None:
    host = {"num_cpus": 1, "resources": {"alpa_cpu_device": 4}}
    with joined_cluster(host, {"num_cpus": 1, "resources": {"alpa_cpu_device": 2}}):
        cluster = alpa_ir.DeviceCluster()
        assert cluster.num_hosts == 2 and cluster.num_devices == 6
        assert sorted(cluster.host_num_devices) == [2, 4]
        assert cluster.num_cpus == 2
        assert all(info["Alive"] for info in cluster.host_info)
        assert get_global_cluster() is not None and get_global_num_devices() == 6

        first = cluster.host_num_devices[0]
        second = cluster.get_physical_mesh(host_ids=[1], num_devices_per_host=2)
        assert second.shape == (1, 2)
        assert second.device_ids == (first, first + 1)  # counted host by host
        # a method takes it as devices: its logical mesh on the cluster's ids
        mesh = resolve_mesh(second, backend_devices("ray"))
        assert mesh.shape == (1, 2) and mesh.devices == (first, first + 1)
        both = cluster.get_virtual_physical_mesh(num_devices_per_host=2)
        assert both.shape == (2, 2)
        assert both.get_logical_mesh((4, 1)).devices == (0, 1, first, first + 1)

        with pytest.raises(AlpaError, match="fewer than"):
            cluster.get_physical_mesh(num_devices_per_host=3)  # the small host has 2
        with pytest.raises(AlpaError, match="host ids \\[2\\]"):
            cluster.get_physical_mesh(host_ids=[2])
        assert DeviceCluster(num_nodes=1).num_hosts == 1
        assert DeviceCluster(num_devices_per_node=2).host_num_devices == [2, 2]
        with pytest.raises(AlpaError, match="fewer than 3 devices"):
            DeviceCluster(num_devices_per_node=3)
