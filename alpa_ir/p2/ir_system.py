"""The P² view of a module's logical mesh: its system and its placement (parallelism matrix).

The system of a mesh comes, in this order, from a pass option (a preset name), from the
mesh's ``p2.system`` attribute (written by ``synthesize-placement``), or from the
``mesh.cluster`` its ``cluster`` property names. A cluster level becomes one switched
interconnect of that level; a ``shared`` level has one port per unit (a node's NIC), an
unshared one a link per device below, modelled as one port of their summed bandwidth.
A transfer across an outer level (a tier of a fat tree: scalable units, pods) also crosses
the ports of every level between it and the innermost one at both ends (``through``): it
leaves its node by the node's NICs and its unit by the unit's uplinks, so its NIC's
bandwidth bounds it wherever its peer sits. Only the innermost level (the devices' own links
inside a node) is off that path.

The placement of a mesh is its ``placement`` property (P²'s matrix: rows = mesh axes,
columns = hardware levels); without one, the matrix whose device order is the mesh's
``devices``, if there is one.
"""

from __future__ import annotations

import math

import numpy as np
from xdsl.dialects import func
from xdsl.dialects.builtin import ArrayAttr, ModuleOp, StringAttr, SymbolRefAttr

from alpa_ir.dialects.lax_attrs import ints_attr, ints_of
from alpa_ir.dialects.mesh import MESH_ATTR, ClusterOp, LogicalMeshOp
from alpa_ir.errors import AlpaError
from alpa_ir.ir.module_utils import symbol_op
from alpa_ir.p2.placement import ParallelismMatrix, device_array, enumerate_matrices
from alpa_ir.p2.system import Interconnect, Level, System, get_system

SYSTEM_ATTR = "p2.system"
"""Logical mesh attribute: the name of the system preset the mesh is placed on."""


def logical_mesh(module: ModuleOp, function: func.FuncOp, pass_name: str) -> LogicalMeshOp:
    """The ``mesh.logical_mesh`` that ``function`` runs on."""
    ref = function.attributes.get(MESH_ATTR)
    if not isinstance(ref, SymbolRefAttr):
        raise AlpaError(f"{pass_name}: @main names no logical mesh (mesh.mesh); run auto-sharding")
    mesh = symbol_op(module, ref.root_reference.data, LogicalMeshOp)
    assert isinstance(mesh, LogicalMeshOp)
    return mesh


def system_from_cluster(cluster: ClusterOp) -> System:
    """A P² system with one switched interconnect per cluster level (see module doc)."""
    levels = tuple(Level(lv.level_name.data, lv.size.data) for lv in cluster.levels.data)
    cards = [level.cardinality for level in levels]
    names = tuple(level.name for level in levels)
    links = []
    for j, lv in enumerate(cluster.levels.data):
        below = 1 if lv.shared.data else math.prod(cards[j + 1 :])
        bandwidth = lv.bandwidth.value.data * below
        # a transfer across a network tier also leaves through the ports of every tier
        # below it, down to the node's NICs, at both ends; the innermost level (the
        # devices' own links in a node) is not on that path (GPUDirect RDMA)
        through = names[j + 1 : len(names) - 1]
        links.append(Interconnect(names[j], j, bandwidth, lv.latency.value.data, through=through))
    return System(cluster.sym_name.data, levels, tuple(links))


def mesh_system(module: ModuleOp, mesh: LogicalMeshOp, name: str, pass_name: str) -> System:
    """The system of ``mesh``: preset ``name``, else the mesh's ``p2.system``, else its cluster."""
    attr = mesh.attributes.get(SYSTEM_ATTR)
    if name:
        return get_system(name)
    if isinstance(attr, StringAttr):
        return get_system(attr.data)
    if mesh.cluster is not None:
        cluster = symbol_op(module, mesh.cluster.root_reference.data, ClusterOp)
        assert isinstance(cluster, ClusterOp)
        return system_from_cluster(cluster)
    raise AlpaError(
        f"{pass_name}: no system for mesh @{mesh.sym_name.data}; give the option system=PRESET "
        "(e.g. gcp-a100-16x4) or a mesh.cluster"
    )


def check_mesh_fits(mesh: LogicalMeshOp, system: System, pass_name: str) -> None:
    """The mesh must use every device of the system (P² places whole systems)."""
    shape = mesh.mesh_shape
    if math.prod(shape) != system.num_devices:
        raise AlpaError(
            f"{pass_name}: mesh @{mesh.sym_name.data} of shape {list(shape)} has "
            f"{math.prod(shape)} devices but system {system.name!r} has {system.num_devices}"
        )


def mesh_matrix(mesh: LogicalMeshOp, system: System, pass_name: str) -> ParallelismMatrix:
    """The parallelism matrix the mesh is placed with (see module doc)."""
    check_mesh_fits(mesh, system, pass_name)
    devices = np.array(mesh.device_ids)
    if mesh.placement is not None:
        matrix = ParallelismMatrix(tuple(ints_of(row) for row in mesh.placement.data))
        if matrix.hierarchy != system.hierarchy:
            raise AlpaError(
                f"{pass_name}: placement {matrix} of mesh @{mesh.sym_name.data} does not fit "
                f"the hierarchy {list(system.hierarchy)} of system {system.name!r}"
            )
        if not np.array_equal(device_array(matrix).reshape(-1), devices):
            raise AlpaError(
                f"{pass_name}: the devices of mesh @{mesh.sym_name.data} are not in the order "
                f"of its placement {matrix}"
            )
        return matrix
    for matrix in enumerate_matrices(system.hierarchy, mesh.mesh_shape):
        if np.array_equal(device_array(matrix).reshape(-1), devices):
            return matrix
    raise AlpaError(
        f"{pass_name}: the device order of mesh @{mesh.sym_name.data} is no placement on "
        f"system {system.name!r}; run synthesize-placement first"
    )


def place_mesh(mesh: LogicalMeshOp, matrix: ParallelismMatrix, system_name: str | None) -> None:
    """Write ``matrix`` into the mesh: its device order and its ``placement``."""
    mesh.properties["devices"] = ints_attr(device_array(matrix).reshape(-1).tolist())
    mesh.properties["placement"] = ArrayAttr([ints_attr(row) for row in matrix.rows])
    if system_name is not None:
        mesh.attributes[SYSTEM_ATTR] = StringAttr(system_name)
