"""Collective accounting of compiled HLO text (``compiled.as_text()``).

``hlo_collectives(text)`` lists every collective instruction of an HLO module
as a :class:`CollectiveRecord`: its kind (``all-reduce``, ``all-gather``,
``reduce-scatter``, ``all-to-all``, ``collective-permute``, ``collective-broadcast``),
``bytes`` (per device, the full tensor: the all-reduce's operand, the
all-gather's result, the reduce-scatter's operand, the all-to-all's operand)
and its replica groups, whatever spelling XLA printed:

- explicit lists ``replica_groups={{0,1},{2,3}}`` (``{}``: one group of all devices),
- iota lists ``replica_groups=[2,4]<=[8]`` and ``[4,2]<=[2,4]T(1,0)``,
- ``source_target_pairs={{0,1},{1,2}}`` for permutes (each pair is a group).

Asynchronous pairs count once, at their ``-start``; the ``-done`` carries no data.
``wire_bytes`` is what one device sends in a ring algorithm, the measure the
auto-sharding benchmark compares with the ILP's prediction.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

import numpy as np

from alpa_ir.errors import AlpaError

KINDS = (
    "all-reduce",
    "all-gather",
    "reduce-scatter",
    "all-to-all",
    "collective-permute",
    "collective-broadcast",
)

_DTYPE_BYTES = {
    "pred": 1, "s4": 0.5, "u4": 0.5, "s8": 1, "u8": 1, "f8e4m3fn": 1, "f8e5m2": 1,
    "s16": 2, "u16": 2, "f16": 2, "bf16": 2, "s32": 4, "u32": 4, "f32": 4,
    "s64": 8, "u64": 8, "f64": 8, "c64": 8, "c128": 16,
}  # fmt: skip

_ARRAY = re.compile(r"\b([a-z][a-z0-9]*)\[([0-9,]*)\]")
_INSTRUCTION = re.compile(
    r"^\s*(?:ROOT\s+)?%?(?P<name>[\w.\-]+)\s*=\s*(?P<shape>.+?)\s+"
    r"(?P<kind>" + "|".join(KINDS) + r")(?P<start>-start)?\((?P<operands>[^)]*)\)(?P<rest>.*)$"
)
_EXPLICIT_GROUPS = re.compile(r"replica_groups=\{((?:\{[0-9,\s]*\},?\s*)*)\}")
_IOTA_GROUPS = re.compile(r"replica_groups=\[([0-9,]+)\]<=\[([0-9,]+)\](?:T\(([0-9,]+)\))?")
_PAIRS = re.compile(r"source_target_pairs=\{((?:\{[0-9,\s]*\},?\s*)*)\}")
_GROUP = re.compile(r"\{([0-9,\s]*)\}")
_DEFINITION = re.compile(r"^\s*(?:ROOT\s+)?%?([\w.\-]+)\s*=\s*(.+?)\s+[a-z][\w\-]*\(")
_OPERAND_NAME = re.compile(r"%([\w.\-]+)")


@dataclass(frozen=True)
class CollectiveRecord:
    """One collective of an HLO module."""

    name: str
    kind: str
    bytes: int
    """Per device, the full (gathered / unreduced) tensor."""
    replica_groups: tuple[tuple[int, ...], ...]
    """Device groups; empty when XLA printed ``{}`` (all devices in one group)."""

    @property
    def group_size(self) -> int | None:
        """Devices per group (None: all devices, unknown here)."""
        return len(self.replica_groups[0]) if self.replica_groups else None

    def wire_bytes(self, num_devices: int | None = None) -> float:
        """Bytes one device sends in a ring: all-reduce 2(n−1)/n·B, all-gather,
        reduce-scatter and all-to-all (n−1)/n·B, a permute B."""
        if self.kind == "collective-permute":
            return float(self.bytes)
        n = self.group_size or num_devices
        if n is None:
            raise AlpaError(f"HLO collective '{self.name}': group size unknown; give num_devices")
        if n <= 1:
            return 0.0
        factor = 2.0 if self.kind == "all-reduce" else 1.0
        return factor * (n - 1) / n * self.bytes


def _array_bytes(text: str) -> list[float]:
    sizes = []
    for dtype, dims in _ARRAY.findall(text):
        if dtype not in _DTYPE_BYTES:
            continue
        count = math.prod(int(d) for d in dims.split(",") if d) if dims else 1
        sizes.append(count * _DTYPE_BYTES[dtype])
    return sizes


def _groups_of(rest: str, where: str) -> tuple[tuple[int, ...], ...]:
    if m := _IOTA_GROUPS.search(rest):
        shape = [int(x) for x in m.group(1).split(",")]
        reshape = [int(x) for x in m.group(2).split(",")]
        ids = np.arange(math.prod(reshape)).reshape(reshape)
        if m.group(3):
            ids = ids.transpose([int(x) for x in m.group(3).split(",")])
        if math.prod(shape) != ids.size:
            raise AlpaError(f"HLO collective '{where}': iota groups {m.group(0)} are inconsistent")
        return tuple(tuple(int(x) for x in row) for row in ids.reshape(shape[0], -1))
    for pattern in (_EXPLICIT_GROUPS, _PAIRS):
        if m := pattern.search(rest):
            return tuple(
                tuple(int(x) for x in g.split(",") if x.strip())
                for g in _GROUP.findall(m.group(1))
                if g.strip()
            )
    return ()


def hlo_collectives(text: str) -> list[CollectiveRecord]:
    """Every collective in ``text`` (an HLO module as XLA prints it), in order."""
    lines = text.splitlines()
    defined: dict[str, list[float]] = {}
    for line in lines:
        if d := _DEFINITION.match(line):
            defined[d.group(1)] = _array_bytes(d.group(2))
    records = []
    for line in lines:
        m = _INSTRUCTION.match(line)
        if m is None:
            continue
        kind, name = m.group("kind"), m.group("name")
        results = _array_bytes(m.group("shape"))
        operands = _array_bytes(m.group("operands"))
        if not operands:  # operands printed without their types: look them up
            for ref in _OPERAND_NAME.findall(m.group("operands")):
                operands += defined.get(ref, [])
        if m.group("start") and kind in ("all-gather", "collective-permute") and len(results) > 1:
            results = results[len(results) // 2 :]  # (operands..., results...) tuple
        elif m.group("start") and len(results) > len(operands) and operands:
            results = results[: len(operands)]
        result_bytes, operand_bytes = sum(results), sum(operands)
        full = result_bytes if kind == "all-gather" else (operand_bytes or result_bytes)
        records.append(
            CollectiveRecord(
                name=name,
                kind=kind,
                bytes=int(full),
                replica_groups=_groups_of(m.group("rest"), name),
            )
        )
    return records


def total_wire_bytes(records: list[CollectiveRecord], num_devices: int) -> float:
    """Bytes one device sends over all ``records`` (ring algorithms)."""
    return math.fsum(r.wire_bytes(num_devices) for r in records)
