"""``p2``: an auto-sharding cost model that prices collectives on the hardware (beyond P²).

Alpa's ``alpha-beta`` model gives every mesh axis one α and β, so it cannot see where the
axes land on a hierarchical system. This model knows the system and reads the placement
from the mesh's device order (the parallelism matrix whose device order it is):

* all-reduce: the predicted time of the fastest synthesized program over those mesh axes,
  priced as the SPMD executor runs it (``choice.ReductionPricer``, as
  ``synthesize-reductions`` will run it);
* all-gather and reduce-scatter: one such collective over the axes' device groups, simulated
  on the interconnects they cross (``Simulator``);
* all-to-all: the simulator's point-to-point all-to-all over the groups.

Times are in microseconds, so that one unit is of the order of α = 1 of the ``alpha-beta``
model and the auto-sharding pass's tiny tie-breaking penalties (1e-6 for replicated inputs)
stay negligible. The ``alpha-beta`` model's tie-breakers are kept: + 0.001 for a
reduce-scatter, 0.01 for an all-reduce, 0.1 for an all-gather, 0.001 for an all-to-all.

A mesh whose device order is no parallelism matrix (e.g. a mesh flattened to one axis) is
still priced: its all-reduces as one plain all-reduce over their groups.

The registered factory builds an unbound model; ``auto-sharding`` binds it to the module's
system with :meth:`P2CostModel.for_module` (its ``system`` option, else the mesh's
``p2.system``, else its cluster).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
from xdsl.dialects.builtin import ModuleOp

from alpa_ir.dialects.mesh import LogicalMeshOp
from alpa_ir.errors import AlpaError
from alpa_ir.hardware.device_mesh import LogicalDeviceMesh
from alpa_ir.p2.choice import ChoiceOptions, ReductionPricer
from alpa_ir.p2.ir_system import mesh_system
from alpa_ir.p2.placement import ParallelismMatrix, device_array, enumerate_matrices
from alpa_ir.p2.semantics import P2_COLLECTIVES
from alpa_ir.p2.synthesis import DEFAULT_MAX_SIZE
from alpa_ir.p2.system import System

MICROSECONDS = 1e6


class P2CostModel:
    """Placement-aware collective prices on ``system`` (see the module doc)."""

    name = "p2"

    def __init__(
        self,
        system: System | None = None,
        algorithm: str = "ring",
        max_size: int = DEFAULT_MAX_SIZE,
    ) -> None:
        ChoiceOptions(max_size, algorithm).check("p2 cost model")
        self.system = system
        self.algorithm = algorithm
        self.max_size = max_size
        self._pricer = None if system is None else ReductionPricer(system, algorithm, max_size)
        self._matrices: dict[tuple[tuple[int, ...], tuple[int, ...]], ParallelismMatrix | None]
        self._matrices = {}
        self._lines: dict[tuple[object, ...], tuple[float, float]] = {}

    def for_module(self, module: ModuleOp, mesh: LogicalMeshOp, system: str) -> P2CostModel:
        """This model bound to the system of ``mesh`` (preset ``system`` if given)."""
        found = mesh_system(module, mesh, system, "auto-sharding (cost model p2)")
        return P2CostModel(found, self.algorithm, self.max_size)

    @property
    def pricer(self) -> ReductionPricer:
        if self._pricer is None:
            raise AlpaError(
                "cost model p2 needs a system: give auto-sharding the option system=PRESET "
                "(e.g. gcp-a100-16x4), or a mesh with p2.system or a mesh.cluster"
            )
        return self._pricer

    def matrix(self, mesh: LogicalDeviceMesh) -> ParallelismMatrix | None:
        """The parallelism matrix whose device order is the mesh's, or None."""
        assert mesh.devices is not None
        key = (mesh.shape, mesh.devices)
        if key not in self._matrices:
            system = self.pricer.system
            if mesh.size != system.num_devices:
                raise AlpaError(
                    f"cost model p2: a mesh of shape {list(mesh.shape)} has {mesh.size} devices "
                    f"but system {system.name!r} has {system.num_devices}"
                )
            devices = np.array(mesh.devices)
            self._matrices[key] = next(
                (
                    m
                    for m in enumerate_matrices(system.hierarchy, mesh.shape)
                    if np.array_equal(device_array(m).reshape(-1), devices)
                ),
                None,
            )
        return self._matrices[key]

    @staticmethod
    def groups(mesh: LogicalDeviceMesh, axes: Sequence[int]) -> np.ndarray:
        """Device groups (rows) of a collective over mesh ``axes``."""
        ids = np.array(mesh.devices).reshape(mesh.shape)
        keep = [a for a in range(ids.ndim) if a not in axes]
        return ids.transpose(keep + list(axes)).reshape(-1, mesh.axes_size(axes))

    def _line(self, kind: str, mesh: LogicalDeviceMesh, axes: Sequence[int]) -> tuple[float, float]:
        """Seconds of a collective over ``axes`` at 0 bytes, and per byte: every time the
        simulator predicts is a fixed latency plus loads proportional to the bytes."""
        key = (kind, mesh.shape, mesh.devices, tuple(axes))
        if key not in self._lines:
            groups = self.groups(mesh, axes)
            sim = self.pricer.sim
            if kind == "all_to_all":
                times = [sim.all_to_all_time(groups, float(b)) for b in (0, 1)]
            else:
                coll = P2_COLLECTIVES[kind]
                times = [sim.program_time([(coll, groups)], float(b)) for b in (0, 1)]
            self._lines[key] = (times[0], times[1] - times[0])
        return self._lines[key]

    def seconds(
        self, kind: str, mesh: LogicalDeviceMesh, nbytes: float, axes: Sequence[int]
    ) -> float:
        """Predicted seconds of collective ``kind`` (all_reduce, all_gather, reduce_scatter,
        all_to_all) over mesh ``axes``, ``nbytes`` per device as the protocol counts them
        (the all-gather's output), without tie-breakers."""
        n = mesh.axes_size(axes)
        if n == 1:
            return 0.0
        if kind == "all_reduce":
            matrix = self.matrix(mesh)
            if matrix is not None:
                used = tuple(sorted(a for a in axes if mesh.shape[a] > 1))
                return self.pricer.best(matrix, used, nbytes)[1]
        if kind == "all_gather":
            nbytes /= n  # the simulator takes the gathered pieces
        fixed, per_byte = self._line(kind, mesh, axes)
        return fixed + per_byte * nbytes

    def all_reduce(self, mesh: LogicalDeviceMesh, nbytes: float, axes: Sequence[int]) -> float:
        return self._priced("all_reduce", mesh, nbytes, axes, 0.01)

    def all_gather(self, mesh: LogicalDeviceMesh, nbytes: float, axes: Sequence[int]) -> float:
        return self._priced("all_gather", mesh, nbytes, axes, 0.1)

    def reduce_scatter(self, mesh: LogicalDeviceMesh, nbytes: float, axes: Sequence[int]) -> float:
        return self._priced("reduce_scatter", mesh, nbytes, axes, 0.001)

    def all_to_all(self, mesh: LogicalDeviceMesh, nbytes: float, axes: Sequence[int]) -> float:
        return self._priced("all_to_all", mesh, nbytes, axes, 0.001)

    def _priced(
        self, kind: str, mesh: LogicalDeviceMesh, nbytes: float, axes: Sequence[int], tie: float
    ) -> float:
        if mesh.axes_size(axes) == 1:
            return 0.0
        return self.seconds(kind, mesh, nbytes, axes) * MICROSECONDS + tie
