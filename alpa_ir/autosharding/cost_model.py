"""Communication cost models for collectives on a logical device mesh.

The default, ``alpha-beta``, is the model of Alpa's implementation: for mesh
axes ``axes`` with n devices in all, latency α and inverse bandwidth β, and B
bytes (the per-device tensor the collective produces or consumes, see below)::

    all-gather(B)     = α + β·(n−1)/n·B + 0.1
    all-reduce(B)     = α + β·2(n−1)/n·B + 0.01
    reduce-scatter(B) = α + β·(n−1)/n·B + 0.001
    all-to-all(B)     = α + β·(n−1)/n²·B·(n/2) + 0.001

The small constants break ties in favour of reduce-scatter over all-reduce
over all-gather (NOTES.md). A collective over several mesh axes runs as one
ring over all their devices, bottlenecked by the slowest axis: α and β are the
largest of those axes'. B is the per-device size of the full (gathered,
reduced) tensor: the all-gather's output, the all-reduce's operand, the
reduce-scatter's input, the all-to-all's operand.

Cost models are plugins (hook ``alpa_ir_cost_models``): a factory called with no
arguments. A model that needs the module's hardware also has a method
``for_module(module, mesh_op, system)`` (:class:`ModuleBoundCostModel`) that returns the
model to use for that module's logical mesh; ``auto-sharding`` calls it with its ``system``
option. P²'s placement-aware pricing (``p2``, ``alpa_ir.p2.cost_model``) is such a model.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

from xdsl.dialects.builtin import ModuleOp

from alpa_ir.dialects.mesh import LogicalMeshOp
from alpa_ir.hardware.device_mesh import LogicalDeviceMesh


class CommCostModel(Protocol):
    """Prices the collectives of a plan on a mesh."""

    name: str

    def all_gather(self, mesh: LogicalDeviceMesh, nbytes: float, axes: Sequence[int]) -> float: ...
    def all_reduce(self, mesh: LogicalDeviceMesh, nbytes: float, axes: Sequence[int]) -> float: ...
    def reduce_scatter(
        self, mesh: LogicalDeviceMesh, nbytes: float, axes: Sequence[int]
    ) -> float: ...
    def all_to_all(self, mesh: LogicalDeviceMesh, nbytes: float, axes: Sequence[int]) -> float: ...


class ModuleBoundCostModel(CommCostModel, Protocol):
    """A cost model that is bound to a module's hardware before use."""

    def for_module(self, module: ModuleOp, mesh: LogicalMeshOp, system: str) -> CommCostModel: ...


@dataclass(frozen=True)
class AlphaBetaCostModel:
    """Alpa's α-β model (see the module docstring)."""

    name: str = "alpha-beta"

    @staticmethod
    def _params(mesh: LogicalDeviceMesh, axes: Sequence[int]) -> tuple[int, float, float]:
        assert mesh.alpha is not None and mesh.beta is not None
        n = mesh.axes_size(axes)
        alpha = max(mesh.alpha[a] for a in axes)
        beta = max(mesh.beta[a] for a in axes)
        return n, alpha, beta

    def all_gather(self, mesh: LogicalDeviceMesh, nbytes: float, axes: Sequence[int]) -> float:
        n, alpha, beta = self._params(mesh, axes)
        return 0.0 if n == 1 else alpha + beta * (n - 1) / n * nbytes + 0.1

    def all_reduce(self, mesh: LogicalDeviceMesh, nbytes: float, axes: Sequence[int]) -> float:
        n, alpha, beta = self._params(mesh, axes)
        return 0.0 if n == 1 else alpha + beta * 2 * (n - 1) / n * nbytes + 0.01

    def reduce_scatter(self, mesh: LogicalDeviceMesh, nbytes: float, axes: Sequence[int]) -> float:
        n, alpha, beta = self._params(mesh, axes)
        return 0.0 if n == 1 else alpha + beta * (n - 1) / n * nbytes + 0.001

    def all_to_all(self, mesh: LogicalDeviceMesh, nbytes: float, axes: Sequence[int]) -> float:
        n, alpha, beta = self._params(mesh, axes)
        return 0.0 if n == 1 else alpha + beta * (n - 1) / (n * n) * nbytes * (n / 2) + 0.001


def bound_to_cluster(model: CommCostModel, cluster: object | None) -> CommCostModel:
    """``model`` bound to ``cluster`` (or to none) if it binds to clusters (a
    ``for_cluster`` method: ``auto``, ``calibrated``), else ``model`` itself."""
    bind = getattr(model, "for_cluster", None)
    return bind(cluster) if bind is not None else model  # type: ignore[no-any-return]


def prices_by_devices(model: CommCostModel) -> bool:
    """Whether ``model``'s prices depend on which devices form the mesh, not only on
    its shape and α/β: every model but Alpa's α-β (a strategy cache is then kept per
    device set)."""
    return not isinstance(model, AlphaBetaCostModel)


def collective_bytes_on_wire(kind: str, nbytes: float, n: int) -> float:
    """Bytes one device sends for a collective in a ring (what HLO accounting
    and the 'predicted bytes' figure use): all-gather and reduce-scatter
    (n−1)/n·B, all-reduce 2(n−1)/n·B, all-to-all (n−1)/n·B."""
    if n <= 1:
        return 0.0
    factor = {"all-gather": 1.0, "reduce-scatter": 1.0, "all-reduce": 2.0, "all-to-all": 1.0}[kind]
    return factor * (n - 1) / n * nbytes
