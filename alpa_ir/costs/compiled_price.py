"""The communication cost model's price of what a compiled program runs.

The ILP's objective is the price, under the communication cost model, of the
collectives the plan predicts. :func:`price_compiled_collectives` prices the
collectives XLA really compiled (``hlo_collectives``) with the same model:
each collective's replica groups are mapped to the mesh axes they span (the
devices of a group differ in those axes' coordinates of the logical mesh,
devices numbered row-major), and the model's formula for its kind is applied
to its bytes over those axes. Comparing the two checks the prices, and that
nothing the program runs (a gradient synchronisation added after the solve,
a resharding XLA inserted) is left out of the objective.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from alpa_ir.autosharding.cost_model import CommCostModel
from alpa_ir.costs.collective_accounting import CollectiveRecord
from alpa_ir.dialects.sharding import CollectiveKind
from alpa_ir.errors import AlpaError
from alpa_ir.hardware.device_mesh import LogicalDeviceMesh


@dataclass(frozen=True)
class PricedCollective:
    """One compiled collective and its price (``axes``: the mesh axes its groups span)."""

    record: CollectiveRecord
    axes: tuple[int, ...]
    price: float


def group_axes(groups: Sequence[Sequence[int]], mesh_shape: Sequence[int]) -> tuple[int, ...]:
    """The mesh axes along which the devices of each group differ (all axes
    for ``()``, XLA's one group of every device)."""
    if not groups:
        return tuple(a for a, n in enumerate(mesh_shape) if n > 1)
    axes: set[int] = set()
    for group in groups:
        coords = np.array(np.unravel_index(np.asarray(group), tuple(mesh_shape)))
        axes.update(int(a) for a in np.flatnonzero((coords != coords[:, :1]).any(axis=1)))
    return tuple(sorted(axes))


def price_compiled_collectives(
    records: Sequence[CollectiveRecord], mesh: LogicalDeviceMesh, model: CommCostModel
) -> list[PricedCollective]:
    """Each record priced by ``model`` on ``mesh``; a kind the model has no
    formula for (a collective-permute) is an error naming it."""
    out = []
    for record in records:
        kind = CollectiveKind.from_hlo(record.kind)
        if kind is None:
            raise AlpaError(
                f"HLO collective '{record.name}': the cost model has no price for {record.kind}"
            )
        axes = group_axes(record.replica_groups, mesh.shape)
        price = getattr(model, kind.value)(mesh, float(record.bytes), axes) if axes else 0.0
        out.append(PricedCollective(record, axes, price))
    return out
