"""``calibrated``: α-β prices whose α and β are read off the P² simulator (beyond Alpa).

Alpa's ``alpha-beta`` model (:mod:`alpa_ir.autosharding.cost_model`) prices a collective
with one α and β per mesh axis, as a cluster preset derives them
(:meth:`alpa_ir.hardware.clusters.Cluster.logical_mesh`). Against the P² simulator on the
same devices (``tools/bench_cost_model_prices.py`` prints the ratios) that is off by
more than 10 % in most places: its all-to-all is half of what an all-to-all puts on the wire
((n−1)/(2n)·B·β against (n−1)/n·B), a ring pays α once rather than once per hop, a collective
over several axes takes the slowest axis's β although its single ring crosses the slow level
only once per unit, an all-to-all across nodes loads the NIC with every cross-node pair, not
one ring edge, and a V100 node's non-neighbour GPUs talk through host memory.

This model keeps the α-β form, with wire-correct byte factors, and takes α and β per
collective kind and mesh axis set from the simulator of the mesh's system::

    price(kind, B) = α[kind, axes] + β[kind, axes] · wire(kind, B, n)

``wire`` is :func:`~alpa_ir.autosharding.cost_model.collective_bytes_on_wire` (all-gather and
reduce-scatter (n−1)/n·B, all-reduce 2(n−1)/n·B, all-to-all (n−1)/n·B), α the simulated time
at 0 bytes (every hop's latency) and β the simulated seconds per wire byte: all the groups of
the axes at once on their devices (``mesh.devices``), so link sharing and the system's
topology are in β. The simulator's times are affine in the bytes, so the prices are its times
at every size (latency-dominated ones too). All-reduce is the plain ring (or tree) all-reduce
NCCL runs, not P²'s synthesized programs (that is the ``p2`` model). Prices are in
microseconds plus ``alpha-beta``'s tie-breakers (0.1 all-gather, 0.01 all-reduce, 0.001
reduce-scatter and all-to-all), as in ``p2``; the mesh's own α/β are not used.

The registered factory builds an unbound model; ``auto-sharding`` binds it with
:meth:`CalibratedCostModel.for_module` (its ``system`` option, else the mesh's ``p2.system``,
else its ``mesh.cluster``: a GCP cluster preset maps back to the P² system it was made from,
with its NVLink ring and PCIe paths; any other cluster becomes one switched interconnect per
level, :func:`~alpa_ir.p2.ir_system.system_from_cluster`). :meth:`for_cluster` binds it to a
:class:`~alpa_ir.hardware.clusters.Cluster`.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
from xdsl.dialects.builtin import ModuleOp, StringAttr

from alpa_ir.autosharding.cost_model import collective_bytes_on_wire
from alpa_ir.dialects.mesh import ClusterOp, LogicalMeshOp
from alpa_ir.dialects.sharding import CollectiveKind
from alpa_ir.errors import AlpaError
from alpa_ir.hardware.clusters import Cluster
from alpa_ir.hardware.device_mesh import LogicalDeviceMesh
from alpa_ir.ir.module_utils import symbol_op
from alpa_ir.p2.ir_system import SYSTEM_ATTR, system_from_cluster
from alpa_ir.p2.semantics import P2_COLLECTIVES
from alpa_ir.p2.simulator import ALGORITHMS, Simulator
from alpa_ir.p2.symmetry import canonical_devices
from alpa_ir.p2.system import System, gcp_a100, gcp_v100, get_system
from alpa_ir.p2.system_clusters import cluster_from_system

MICROSECONDS = 1e6
TIE_BREAKERS = {"all_gather": 0.1, "all_reduce": 0.01, "reduce_scatter": 0.001, "all_to_all": 0.001}
_PROBE = float(2**30)  # bytes per device for the slope (the simulator is affine in them)


def system_of_cluster(cluster: Cluster) -> System:
    """The P² system of ``cluster``: the GCP system it was made from (``gcp-a100-16xN``,
    ``gcp-v100-8xN``: NVSwitch, or NVLink ring and host PCIe; recognised by its levels,
    whatever the op is called), else one switched interconnect per cluster level."""
    nodes = cluster.levels[0].cardinality
    for device, make in (("a100", gcp_a100), ("v100", gcp_v100)):
        system = make(nodes)
        if system.hierarchy != tuple(lv.cardinality for lv in cluster.levels):
            continue
        if cluster_from_system(system, device).levels == cluster.levels:
            return system
    return system_from_cluster(cluster.to_op())


class CalibratedCostModel:
    """α-β prices with α/β per kind and axis set from the simulator (see the module doc)."""

    name = "calibrated"

    def __init__(self, system: System | None = None, algorithm: str = "ring") -> None:
        if algorithm not in ALGORITHMS:
            raise AlpaError(
                f"cost model calibrated: unknown algorithm {algorithm!r}; "
                f"known: {', '.join(ALGORITHMS)}"
            )
        self.system = system
        self.algorithm = algorithm
        self._sim = None if system is None else Simulator(system, algorithm)
        self._lines: dict[tuple[object, ...], tuple[float, float]] = {}

    def __eq__(self, other: object) -> bool:
        return isinstance(other, CalibratedCostModel) and (self.system, self.algorithm) == (
            other.system,
            other.algorithm,
        )

    def __hash__(self) -> int:
        return hash((CalibratedCostModel, self.system, self.algorithm))

    def __repr__(self) -> str:
        where = self.system.name if self.system is not None else "unbound"
        return f"CalibratedCostModel({where}, {self.algorithm})"

    # -- binding ----------------------------------------------------------------

    @classmethod
    def for_cluster(cls, cluster: Cluster | None, algorithm: str = "ring") -> CalibratedCostModel:
        """The model on ``cluster``'s system (:func:`system_of_cluster`); unbound
        without a cluster (it then asks for a system when it prices)."""
        return cls(system_of_cluster(cluster) if cluster is not None else None, algorithm)

    def for_module(self, module: ModuleOp, mesh: LogicalMeshOp, system: str) -> CalibratedCostModel:
        """This model bound to preset ``system`` if given, else to the mesh's ``p2.system``,
        else to its ``mesh.cluster``."""
        attr = mesh.attributes.get(SYSTEM_ATTR)
        if system:
            return CalibratedCostModel(get_system(system), self.algorithm)
        if isinstance(attr, StringAttr):
            return CalibratedCostModel(get_system(attr.data), self.algorithm)
        if mesh.cluster is not None:
            op = symbol_op(module, mesh.cluster.root_reference.data, ClusterOp)
            assert isinstance(op, ClusterOp)
            return CalibratedCostModel.for_cluster(Cluster.from_op(op), self.algorithm)
        raise AlpaError(
            f"auto-sharding (cost model calibrated): no system for mesh @{mesh.sym_name.data}; "
            "give the option system=PRESET (e.g. gcp-a100-16x4) or a mesh.cluster"
        )

    @property
    def sim(self) -> Simulator:
        if self._sim is None:
            raise AlpaError(
                "cost model calibrated needs a system: give auto-sharding the option "
                "system=PRESET (e.g. gcp-a100-16x4), or a mesh with p2.system or a mesh.cluster"
            )
        return self._sim

    # -- prices -----------------------------------------------------------------

    @staticmethod
    def groups(mesh: LogicalDeviceMesh, axes: Sequence[int]) -> np.ndarray:
        """Device groups (rows) of a collective over mesh ``axes``."""
        ids = np.array(mesh.devices).reshape(mesh.shape)
        keep = [a for a in range(ids.ndim) if a not in axes]
        return ids.transpose(keep + list(axes)).reshape(-1, mesh.axes_size(axes))

    def simulated(
        self, kind: str, mesh: LogicalDeviceMesh, nbytes: float, axes: Sequence[int]
    ) -> float:
        """The simulator's seconds for collective ``kind`` over mesh ``axes``, ``nbytes`` per
        device as the cost-model protocol counts them (the all-gather's output)."""
        n = mesh.axes_size(axes)
        if n == 1:
            return 0.0
        groups = self.groups(mesh, axes)
        if int(groups.max()) >= self.sim.system.num_devices:
            raise AlpaError(
                f"cost model calibrated: mesh device {int(groups.max())} is outside system "
                f"{self.sim.system.name!r} ({self.sim.system.num_devices} devices)"
            )
        if kind == "all_to_all":
            return self.sim.all_to_all_time(groups, float(nbytes))
        if kind == "all_gather":
            nbytes /= n  # the simulator starts from the pieces
        return self.sim.program_time([(P2_COLLECTIVES[kind], groups)], float(nbytes))

    def alpha_beta(
        self, kind: str, mesh: LogicalDeviceMesh, axes: Sequence[int]
    ) -> tuple[float, float]:
        """α (seconds) and β (seconds per byte on the wire) of ``kind`` over ``axes``."""
        key = (kind, mesh.shape, mesh.devices, tuple(axes))
        found = self._lines.get(key)
        if found is None:
            # devices the simulator cannot tell apart (alpa_ir.p2.symmetry) share one line:
            # e.g. the same stage shape at another place in a pipeline
            same = mesh.devices
            if same is not None and self._sim is not None:
                same = canonical_devices(self._sim.system, same)
            canonical = ("canonical", kind, mesh.shape, same, tuple(axes))
            found = self._lines.get(canonical)
            if found is None:
                n = mesh.axes_size(axes)
                fixed = self.simulated(kind, mesh, 0.0, axes)
                slope = (self.simulated(kind, mesh, _PROBE, axes) - fixed) / _PROBE
                wire = collective_bytes_on_wire(CollectiveKind(kind).hlo, 1.0, n)
                found = self._lines[canonical] = (fixed, slope / wire if wire else 0.0)
            self._lines[key] = found
        return found

    def seconds(
        self, kind: str, mesh: LogicalDeviceMesh, nbytes: float, axes: Sequence[int]
    ) -> float:
        """Predicted seconds of ``kind`` over ``axes`` (``nbytes`` as the protocol counts
        them), without tie-breakers: α + β · bytes on the wire."""
        n = mesh.axes_size(axes)
        if n == 1:
            return 0.0
        alpha, beta = self.alpha_beta(kind, mesh, axes)
        return alpha + beta * collective_bytes_on_wire(CollectiveKind(kind).hlo, nbytes, n)

    def _priced(
        self, kind: str, mesh: LogicalDeviceMesh, nbytes: float, axes: Sequence[int]
    ) -> float:
        if mesh.axes_size(axes) == 1:
            return 0.0
        return self.seconds(kind, mesh, nbytes, axes) * MICROSECONDS + TIE_BREAKERS[kind]

    def all_gather(self, mesh: LogicalDeviceMesh, nbytes: float, axes: Sequence[int]) -> float:
        return self._priced("all_gather", mesh, nbytes, axes)

    def all_reduce(self, mesh: LogicalDeviceMesh, nbytes: float, axes: Sequence[int]) -> float:
        return self._priced("all_reduce", mesh, nbytes, axes)

    def reduce_scatter(self, mesh: LogicalDeviceMesh, nbytes: float, axes: Sequence[int]) -> float:
        return self._priced("reduce_scatter", mesh, nbytes, axes)

    def all_to_all(self, mesh: LogicalDeviceMesh, nbytes: float, axes: Sequence[int]) -> float:
        return self._priced("all_to_all", mesh, nbytes, axes)
