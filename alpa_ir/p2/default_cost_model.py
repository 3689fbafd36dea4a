"""``auto``: the communication cost model the mesh's hardware calls for (the default).

A mesh on GPUs is priced by ``calibrated`` (:mod:`alpa_ir.p2.calibrated`): α and β per
collective kind and axis set read off the P² simulator of its system, within a few per cent
of the simulator for every kind. A mesh is on GPUs when it names a ``p2.system``, when
``auto-sharding`` is given the option ``system``, or when its cluster (the mesh's
``mesh.cluster``, else the module's only ``mesh.cluster`` op) has GPU devices: a device name
that is neither empty nor ``cpu`` (the presets ``alpa-testbed``, ``dgx-*``, ``gcp-*``).

Every other mesh (the local CPU devices, a mesh given by shape alone, a cluster written by
hand without a device name) is priced by Alpa's ``alpha-beta`` on the mesh's own α and β.
Alpa's formulas stay available by name (``cost-model=alpha-beta``) for compatibility.
"""

from __future__ import annotations

from dataclasses import dataclass

from xdsl.dialects.builtin import ModuleOp

from alpa_ir.autosharding.cost_model import AlphaBetaCostModel, CommCostModel
from alpa_ir.dialects.mesh import ClusterOp, LogicalMeshOp
from alpa_ir.hardware.clusters import Cluster
from alpa_ir.ir.module_utils import symbol_op, top_level_ops
from alpa_ir.p2.calibrated import CalibratedCostModel
from alpa_ir.p2.ir_system import SYSTEM_ATTR


def on_gpus(cluster: Cluster) -> bool:
    """Whether ``cluster``'s devices are GPUs (module docstring)."""
    return cluster.device_name.strip().lower() not in ("", "cpu")


def mesh_cluster(module: ModuleOp, mesh: LogicalMeshOp) -> Cluster | None:
    """The cluster of ``mesh``: its ``mesh.cluster``, else the module's only cluster op."""
    if mesh.cluster is not None:
        op = symbol_op(module, mesh.cluster.root_reference.data, ClusterOp)
        return Cluster.from_op(op) if isinstance(op, ClusterOp) else None
    ops = list(top_level_ops(module, ClusterOp))
    return Cluster.from_op(ops[0]) if len(ops) == 1 else None


@dataclass(frozen=True)
class DefaultCostModel(AlphaBetaCostModel):
    """``auto`` (module docstring). Unbound it prices as ``alpha-beta``."""

    name: str = "auto"

    def for_module(self, module: ModuleOp, mesh: LogicalMeshOp, system: str) -> CommCostModel:
        """``calibrated`` bound to the mesh's GPUs, else ``alpha-beta``."""
        if system or SYSTEM_ATTR in mesh.attributes:
            return CalibratedCostModel().for_module(module, mesh, system)
        cluster = mesh_cluster(module, mesh)
        return self.for_cluster(cluster) if cluster is not None else AlphaBetaCostModel()

    @staticmethod
    def for_cluster(cluster: Cluster | None) -> CommCostModel:
        """``calibrated`` on ``cluster`` if its devices are GPUs, else (and with no
        cluster) ``alpha-beta``."""
        if cluster is not None and on_gpus(cluster):
            return CalibratedCostModel.for_cluster(cluster)
        return AlphaBetaCostModel()
