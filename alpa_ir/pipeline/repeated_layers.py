"""The cost table of a step whose middle layers repeat (a transformer's
blocks), built from a shortened trace of the same model (issue #42).

A GPT of ``L`` blocks traced with ``L + 1`` automatic layers has three
kinds of layer: the first (the embedding), ``L - 1`` identical blocks, the
last (a block and the head). Tracing and importing every block (47,000 ops
for Megatron 145B, 21 s of the 1T row's planning) tells the ``layer-sum``
cost table nothing that a few blocks do not: each layer is priced alone.
So the model is traced with :data:`SHORT_BLOCKS` blocks, its table is costed,
and the table is expanded to the full depth.

Each layer has a *role* by its position: first, second, interior,
penultimate, last (the second and penultimate layers border the first and
the last, and may receive or send other bytes than an interior one). A
layer of the full model takes the costs and FLOPs of the short model's layer
of its role, and the bytes layer ``r`` receives from layer ``s`` are those of
the short model's pair of the same roles and the same offset ``r - s``
(clipped to ±2: adjacent, or farther). The expansion is refused (None) unless
the short model shows that pattern: every interior layer has the structure,
costs and FLOPs of the others, and every short pair of one class (roles and
clipped offset) passes the same bytes. With :data:`SHORT_BLOCKS` = 7 the short
model has four interior layers, so every class of a deeper model is seen in
it at least once.

The expanded table equals the full trace's table entry for entry where the
model repeats (tests compare them); it is a speed-up only, never a
different plan.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from alpa_ir.costs.stage_table import StageCostTable
from alpa_ir.pipeline.layer_ranges import LayerRanges, internal_bytes_of

SHORT_BLOCKS = 7
"""Blocks of the shortened trace: ``SHORT_BLOCKS + 1`` layers, four of them interior."""

FIRST, SECOND, INTERIOR, PENULTIMATE, LAST = range(5)
MAX_OFFSET = 2
"""Offsets ``r - s`` beyond ±1 are one class per sign."""


def short_blocks(config: Any, layers: int) -> int | None:
    """The blocks to trace ``config``'s model with in place of its own, where
    it has a layer per block (``layers``: its blocks and one) and more blocks
    than that; else None (trace the whole model)."""
    blocks = getattr(config, "num_layers", None)
    if getattr(config, "stage_sizes", None) or not isinstance(blocks, int):
        return None
    if layers != blocks + 1 or blocks <= SHORT_BLOCKS + 1:
        return None
    return SHORT_BLOCKS


def layer_role(layer: int, num_layers: int) -> int:
    """The role of ``layer`` of ``num_layers`` (module docstring)."""
    if layer == 0:
        return FIRST
    if layer == num_layers - 1:
        return LAST
    if layer == 1:
        return SECOND
    if layer == num_layers - 2:
        return PENULTIMATE
    return INTERIOR


def _pair_class(r: int, s: int, num_layers: int) -> tuple[int, int, int]:
    offset = max(-MAX_OFFSET, min(MAX_OFFSET, r - s))
    return layer_role(r, num_layers), layer_role(s, num_layers), offset


@dataclass(frozen=True)
class RepeatedLayers:
    """How the ``short`` layers of a shortened trace stand for the
    ``num_layers`` layers of the full model (:meth:`of` checks the pattern)."""

    short: int
    num_layers: int
    edges: np.ndarray
    """``[receiver, sender]`` bytes of the full model's layers, expanded."""

    def source(self, layer: int) -> int:
        """The short model's layer whose costs ``layer`` of the full model takes."""
        role = layer_role(layer, self.num_layers)
        return {
            FIRST: 0,
            SECOND: 1,
            INTERIOR: 2,
            PENULTIMATE: self.short - 2,
            LAST: self.short - 1,
        }[role]

    @classmethod
    def of(cls, ranges: LayerRanges, num_layers: int) -> RepeatedLayers | None:
        """The expansion of ``ranges`` (the short trace's layers) to
        ``num_layers`` layers, or None where the short model does not show the
        repeated pattern (module docstring) or is not shorter."""
        short = ranges.num_layers
        if short < SHORT_BLOCKS + 1 or num_layers <= short:
            return None
        interior = [k for k in range(short) if layer_role(k, short) == INTERIOR]
        if len({ranges.fingerprint(k, k) for k in interior}) != 1:
            return None
        known: dict[tuple[int, int, int], float] = {}
        short_edges = ranges.edge_bytes()
        for r in range(short):
            for s in range(short):
                if r == s:
                    continue
                key = _pair_class(r, s, short)
                value = float(short_edges[r, s])
                if known.setdefault(key, value) != value:
                    return None  # not the same bytes at every offset of one class
        edges = np.zeros((num_layers, num_layers))
        for r in range(num_layers):
            for s in range(num_layers):
                if r == s:
                    continue
                value = known.get(_pair_class(r, s, num_layers))
                if value is None:
                    return None  # a class the short model cannot show
                edges[r, s] = value
        found = cls(short, num_layers, edges)
        # what each layer receives (its cross bytes) must be its source's:
        # no class that a deeper model has more of (bytes from every block)
        for backward in (False, True):
            full = np.triu(edges, 1) if backward else edges
            part = np.triu(short_edges, 1) if backward else short_edges
            sources = [found.source(k) for k in range(num_layers)]
            if not np.array_equal(full.sum(axis=1), part.sum(axis=1)[sources]):
                return None
        return found

    def expand_rows(self, rows: np.ndarray) -> np.ndarray:
        """``rows`` per short layer (``[layer, ...]``), per full layer; None
        where the interior rows differ."""
        return np.stack([rows[self.source(k)] for k in range(self.num_layers)])

    def interior_agrees(self, rows: Sequence[object]) -> bool:
        """Whether the short model's interior layers have equal ``rows``."""
        interior = [rows[k] for k in range(self.short) if layer_role(k, self.short) == INTERIOR]
        return all(_equal(interior[0], row) for row in interior[1:])

    def expand_table(self, table: StageCostTable) -> StageCostTable | None:
        """The ``layer-sum`` cost table of the full model from the short
        model's (``table``), or None where its interior layers were priced
        differently (then the short model is no repetition of one block)."""
        if table.internal is None or table.num_layers != self.short:
            return None
        shapes = [v.shape for views in table.views.values() for v in views]
        per_layer = [[table.costs[(k, k, shape)] for shape in shapes] for k in range(self.short)]
        if not self.interior_agrees(per_layer):
            return None
        phase_flops = table.phase_flops
        if phase_flops is not None and not self.interior_agrees(list(phase_flops)):
            return None
        out = StageCostTable(table.cluster, table.submeshes, table.views, self.num_layers)
        for k in range(self.num_layers):
            source = self.source(k)
            for shape in shapes:
                out.costs[(k, k, shape)] = table.costs[(source, source, shape)]
        out.pairs_costed = table.pairs_costed
        out.internal = (internal_bytes_of(self.edges), internal_bytes_of(self.edges, backward=True))
        out.phase_flops = None if phase_flops is None else self.expand_rows(phase_flops)
        return out


def _equal(a: object, b: object) -> bool:
    if isinstance(a, np.ndarray):
        return bool(np.array_equal(a, b))  # type: ignore[arg-type]
    return a == b


__all__ = ["SHORT_BLOCKS", "RepeatedLayers", "layer_role", "short_blocks"]
