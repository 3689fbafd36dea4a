"""State-matrix semantics of collectives (P² §3.2, Figure 8), as Hoare triples.

With ``k`` devices the data is ``k`` chunks; a device's state is a ``k x k`` boolean matrix
whose row ``r`` is chunk ``r`` and ``s[r][j] = 1`` when device ``j``'s original chunk ``r`` has
been reduced into it. States are stored compactly: the whole system is one ``uint64`` array of
shape ``(devices, k rows, words)`` where each row is a bitset over the ``k`` columns.

Rules (Figure 8, applied as written), for every group ``{d_i : s_i}`` of a step:

* AllReduce, ReduceScatter, Reduce: all members have the same non-empty rows, and every row's
  column sets are pairwise disjoint; the result ``s = ⊎ s_i`` goes to every member (AllReduce),
  its non-empty rows are split in ``m`` contiguous parts, part ``i`` to member ``i``
  (ReduceScatter; the count must divide by ``m``), or to member 0 with the others emptied
  (Reduce; the root is the first device of the group).
* AllGather: the members' non-empty row sets are pairwise disjoint and equally large; all get
  ``⊎ s_i``.
* Broadcast: every ``s_i <= s_0`` and some ``s_i < s_0``; all get ``s_0``.

Devices in no group keep their state.
"""

from __future__ import annotations

import enum

import numpy as np


class Collective(enum.Enum):
    ALL_REDUCE = "AllReduce"
    REDUCE_SCATTER = "ReduceScatter"
    ALL_GATHER = "AllGather"
    REDUCE = "Reduce"
    BROADCAST = "Broadcast"

    def __str__(self) -> str:
        return self.value


COLLECTIVES = tuple(Collective)

P2_COLLECTIVES: dict[str, Collective] = {
    "all_reduce": Collective.ALL_REDUCE,
    "reduce_scatter": Collective.REDUCE_SCATTER,
    "all_gather": Collective.ALL_GATHER,
}
"""P²'s collective for a collective kind (``alpa_ir.dialects.sharding.CollectiveKind``,
or a cost model's name of it); an all-to-all has none: it is no reduction P² places."""


def _words(k: int) -> int:
    return (k + 63) // 64


def _column_bits(columns: np.ndarray, k: int) -> np.ndarray:
    """Bitset words (shape ``(len(columns), words)``) with one bit set per given column...
    or, for a 2-d ``columns`` (groups), the union of each row's columns."""
    cols = np.atleast_2d(columns)
    out = np.zeros((cols.shape[0], _words(k)), dtype=np.uint64)
    for c in range(cols.shape[1]):
        np.bitwise_or.at(
            out,
            (np.arange(cols.shape[0]), cols[:, c] // 64),
            np.uint64(1) << (cols[:, c] % 64).astype(np.uint64),
        )
    return out


def initial_state(num_devices: int) -> np.ndarray:
    """Every device holds only its own data: device ``d`` has column ``d`` set in every row."""
    bits = _column_bits(np.arange(num_devices)[:, None], num_devices)
    return np.repeat(bits[:, None, :], num_devices, axis=1)


def desired_state(groups: np.ndarray | list[list[int]], num_devices: int) -> np.ndarray:
    """Every device holds, in every row, the columns of all devices of its reduction group."""
    groups = np.asarray(groups)
    state = initial_state(num_devices)
    bits = _column_bits(groups, num_devices)
    for g, members in enumerate(groups):
        state[members] = bits[g]
    return state


def _popcount(x: np.ndarray) -> np.ndarray:
    return np.bitwise_count(x).sum(axis=-1, dtype=np.int64)


def apply(state: np.ndarray, groups: np.ndarray, collective: Collective) -> np.ndarray | None:
    """The post-state of running ``collective`` on every group (rows of ``groups``), or None
    when a rule of Figure 8 does not hold for some group."""
    result = explain(state, groups, collective)
    return result if isinstance(result, np.ndarray) else None


def explain(state: np.ndarray, groups: np.ndarray, collective: Collective) -> np.ndarray | str:
    """Like :func:`apply`, but says which precondition fails instead of returning None."""
    members = state[groups]  # (g, m, k, w)
    m = groups.shape[1]
    rows = (members != 0).any(axis=-1)  # (g, m, k): non-empty rows
    total = np.bitwise_or.reduce(members, axis=1)  # (g, k, w)
    if collective is Collective.BROADCAST:
        root = members[:, :1]
        if ((members & ~root) != 0).any():
            return "Broadcast: a device holds data its root lacks"
        if not (members != root).any(axis=(1, 2, 3)).all():
            return "Broadcast: a group gains no information"
        new = np.broadcast_to(root, members.shape)
    elif collective is Collective.ALL_GATHER:
        counts = rows.sum(axis=2)
        if (counts != counts[:, :1]).any():
            return "AllGather: devices hold different numbers of chunks"
        if (rows.sum(axis=1) > 1).any():
            return "AllGather: devices hold a common chunk"
        new = np.broadcast_to(total[:, None], members.shape)
    else:
        if (rows != rows[:, :1]).any():
            return f"{collective}: devices hold different chunks"
        if (_popcount(members).sum(axis=1) != _popcount(total)).any():
            return f"{collective}: the same data would be reduced twice"
        if collective is Collective.ALL_REDUCE:
            new = np.broadcast_to(total[:, None], members.shape)
        elif collective is Collective.REDUCE:
            new = np.zeros_like(members)
            new[:, 0] = total
        else:
            new = _scatter(rows[:, 0], total, m)
            if new is None:
                return "ReduceScatter: chunk count does not divide by the group size"
    out = state.copy()
    out[groups.reshape(-1)] = new.reshape(-1, *state.shape[1:])
    return out


def _scatter(rows: np.ndarray, total: np.ndarray, m: int) -> np.ndarray | None:
    """Split each group's non-empty rows (``rows``: (g, k)) in ``m`` contiguous parts."""
    counts = rows.sum(axis=1)
    if (counts % m).any():
        return None
    per_part = np.maximum(counts // m, 1)[:, None]
    part = (np.cumsum(rows, axis=1) - 1) // per_part  # (g, k): which member gets the row
    mask = rows[:, None, :] & (part[:, None, :] == np.arange(m)[None, :, None])  # (g, m, k)
    return np.where(mask[..., None], total[:, None], np.uint64(0))


def to_bool(state: np.ndarray) -> np.ndarray:
    """The state as ``(devices, k, k)`` booleans (for display and tests)."""
    k = state.shape[1]
    bits = np.unpackbits(state.view(np.uint8), axis=-1, bitorder="little")
    return bits[..., :k].astype(bool)
