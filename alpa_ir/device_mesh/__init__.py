"""Alpa's ``alpa.device_mesh`` name (import alpa_ir.device_mesh): a shim over
:mod:`alpa_ir.compat.device_cluster` and :mod:`alpa_ir.hardware.device_mesh`."""

from alpa_ir.compat.device_cluster import (
    ClusterMesh,
    DeviceCluster,
    DistributedArray,
    LocalPhysicalDeviceMesh,
    get_global_cluster,
    get_global_num_devices,
    get_global_physical_mesh,
    get_global_virtual_physical_mesh,
    prefetch,
    set_global_physical_mesh,
    set_global_virtual_physical_mesh,
)
from alpa_ir.hardware.device_mesh import (
    LogicalDeviceMesh,
    PhysicalDeviceMesh,
)

__all__ = [
    "ClusterMesh",
    "DeviceCluster",
    "DistributedArray",
    "LocalPhysicalDeviceMesh",
    "LogicalDeviceMesh",
    "PhysicalDeviceMesh",
    "get_global_cluster",
    "get_global_num_devices",
    "get_global_physical_mesh",
    "get_global_virtual_physical_mesh",
    "prefetch",
    "set_global_physical_mesh",
    "set_global_virtual_physical_mesh",
]
