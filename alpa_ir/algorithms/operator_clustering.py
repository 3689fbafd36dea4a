"""Alpa's operator-clustering dynamic program (OSDI'22 §5.2, Eq. 6), exact and vectorised.

Operators ``o_0..o_{K-1}`` (topological order) are grouped into ``L``
consecutive layers. A layer ``o_i..o_k`` is allowed only if its FLOPs stay
within ``(1 + δ)·FLOP_total / L``; among the allowed clusterings we minimise
the largest number of bytes any layer receives from operators before it:

    G(k, r) = min over i <= k of max{ G(i − 1, r − 1), C(i, k) }        (Eq. 6)

with ties broken by the lower variance of the per-layer FLOPs. With ``L`` and
the FLOP total fixed, that variance is ``Σ f_l² / L − (FLOP_total / L)²``, so
the tie-break minimises ``Σ f_l²``, which is additive over layers. A single
DP on the pair (max bytes, Σ f²) would *not* be exact (a prefix with larger
bytes but smaller Σ f² can win once a later layer dominates the max), so the
tie-break is a second pass: first the min–max DP gives the optimum ``G*``,
then a min-sum DP over the layers with ``C(i, k) <= G*`` minimises ``Σ f²``.
Remaining ties are broken deterministically (the DP keeps the first
minimiser, i.e. the shortest last layer).

``C(i, k)``: a tensor produced by operator ``p`` and consumed by operators
``u_1 < … < u_n`` is received by layer ``o_i..o_k`` iff ``p < i`` and some
``u_j`` lies in ``[i, k]``; it counts once per layer however many of its
consumers the layer holds. That equals the sum over the *chain* edges
``(p, u_1), (u_1, u_2), …`` of ``[a < i <= b <= k]``, which is what this
module tabulates. For each end ``k`` only starts ``i`` with an allowed FLOP
count matter, a contiguous band ``k − W < i <= k``, so ``C`` is stored as a
``[K, W]`` band built with prefix sums in ``O(K·W + E)``, and the DP costs
``O(L·K·W)`` numpy work (``W <= K``). ``allowed_boundaries`` shrinks ``K``
first: only operators where it is true may start a layer, and the problem is
solved exactly on the resulting segments.

When no clustering meets the FLOP bound (for instance one operator alone
exceeds it) the paper says nothing; this function raises
:class:`~alpa_ir.errors.PlanError` naming the smallest δ that would work, or,
with ``relax_delta=True``, uses that smallest δ and reports it in the result.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from alpa_ir.errors import AlpaError, PlanError

DEFAULT_DELTA = 0.5
"""Alpa's default imbalance tolerance (``AutoLayerOption(eps=0.5)``)."""

Edge = tuple[int, int | Sequence[int], float]
"""(producer, consumer or consumers of one tensor, bytes)."""


@dataclass(frozen=True)
class ClusteringResult:
    """Layers of an optimal clustering; unpacks as ``layers, objective``.

    ``layers[l] = (first op, last op)``, inclusive, covering all operators.
    ``objective`` is ``max_l bytes_received[l]`` (Eq. 6's ``G``).
    ``delta`` is the δ actually used (larger than requested only when
    ``delta_relaxed``), ``flop_bound`` the per-layer FLOP cap it implies.
    """

    layers: tuple[tuple[int, int], ...]
    objective: float
    layer_flops: tuple[float, ...]
    bytes_received: tuple[float, ...]
    delta: float
    delta_relaxed: bool
    flop_bound: float

    @property
    def flops_variance(self) -> float:
        """Population variance of the per-layer FLOPs (the tie-break criterion)."""
        return float(np.var(np.asarray(self.layer_flops)))

    def __iter__(self) -> Iterator[object]:
        return iter((self.layers, self.objective))


def cluster_operators(
    flops: npt.ArrayLike,
    edges: Iterable[Edge],
    num_layers: int,
    delta: float = DEFAULT_DELTA,
    *,
    allowed_boundaries: npt.ArrayLike | None = None,
    relax_delta: bool = False,
) -> ClusteringResult:
    """Cluster operators into ``num_layers`` layers by Eq. 6; see the module docstring.

    Args:
        flops: ``[K]`` FLOPs of each operator, in topological order, ``>= 0``.
        edges: ``(src, dst, bytes)``: operator ``src`` produces a tensor of
            ``bytes`` that operator ``dst`` consumes (``src < dst``). ``dst``
            may be a sequence of all consumers of the tensor, which then counts
            once per receiving layer; separate triples count separately.
        num_layers: ``L``, the number of layers, ``1 <= L <= K``.
        delta: FLOP imbalance tolerance δ: a layer may hold at most
            ``(1 + δ)·FLOP_total / L`` FLOPs.
        allowed_boundaries: optional ``[K]`` bool mask: a layer may start only
            at operators where it is true (operator 0 always starts one).
        relax_delta: if the FLOP bound admits no clustering, use the smallest
            δ that does instead of raising.

    Raises:
        AlpaError: malformed inputs, or more layers than operators (or than
            allowed boundaries).
        PlanError: no clustering meets the FLOP bound and ``relax_delta`` is false.
    """
    problem = _Problem.build(flops, edges, num_layers, delta, allowed_boundaries, relax_delta)
    band, received, starts, op_flops = problem.band, problem.received, problem.starts, problem.flops
    num_ops = op_flops.size
    best_max = _min_max_dp(band, received, num_layers)
    ends = _min_square_sum_dp(band, received, num_layers, best_max)

    layers: list[tuple[int, int]] = []
    layer_flops: list[float] = []
    layer_bytes: list[float] = []
    first_seg = 0
    for end_seg in ends:
        first_op = int(starts[first_seg])
        last_op = int(starts[end_seg + 1] - 1) if end_seg + 1 < starts.size else num_ops - 1
        layers.append((first_op, last_op))
        layer_flops.append(float(op_flops[first_op : last_op + 1].sum()))
        layer_bytes.append(float(received[end_seg, end_seg - first_seg]))
        first_seg = end_seg + 1
    return ClusteringResult(
        layers=tuple(layers),
        objective=float(best_max),
        layer_flops=tuple(layer_flops),
        bytes_received=tuple(layer_bytes),
        delta=problem.delta,
        delta_relaxed=problem.delta_relaxed,
        flop_bound=float(band.cap),
    )


def clustering_objective(
    flops: npt.ArrayLike,
    edges: Iterable[Edge],
    num_layers: int,
    delta: float = DEFAULT_DELTA,
    *,
    allowed_boundaries: npt.ArrayLike | None = None,
    relax_delta: bool = False,
) -> float:
    """The ``objective`` of :func:`cluster_operators` (Eq. 6's ``G*``, the largest
    bytes a layer receives) alone, without the tie-break pass that picks the
    layers. Same arguments and errors."""
    problem = _Problem.build(flops, edges, num_layers, delta, allowed_boundaries, relax_delta)
    return _min_max_dp(problem.band, problem.received, num_layers)


@dataclass(frozen=True)
class _Problem:
    """The inputs checked and tabulated: the operators' FLOPs, the segments'
    starts, the band of allowed layers and the bytes each receives, and the δ used."""

    flops: np.ndarray
    starts: np.ndarray
    band: _Band
    received: np.ndarray
    delta: float
    delta_relaxed: bool

    @staticmethod
    def build(
        flops: npt.ArrayLike,
        edges: Iterable[Edge],
        num_layers: int,
        delta: float,
        allowed_boundaries: npt.ArrayLike | None,
        relax_delta: bool,
    ) -> _Problem:
        op_flops = _check_flops(flops)
        num_ops = op_flops.size
        if isinstance(num_layers, bool) or not isinstance(num_layers, int | np.integer):
            raise AlpaError(f"cluster_operators: num_layers must be an int, got {num_layers!r}")
        if num_layers < 1:
            raise AlpaError(f"cluster_operators: num_layers must be >= 1, got {num_layers}")
        if num_layers > num_ops:
            raise AlpaError(
                f"cluster_operators: {num_layers} layers requested but there are only "
                f"{num_ops} operators"
            )
        if not (_is_real(delta) and math.isfinite(delta) and delta >= 0.0):
            raise AlpaError(f"cluster_operators: delta must be a finite number >= 0, got {delta!r}")
        starts = _segment_starts(allowed_boundaries, num_ops)
        if num_layers > starts.size:
            raise AlpaError(
                f"cluster_operators: {num_layers} layers requested but allowed_boundaries "
                f"allows only {starts.size} layer starts"
            )
        segment_of_op = np.cumsum(_start_mask(starts, num_ops)) - 1
        src, dst, weight = _chain_edges(edges, num_ops)
        seg_src, seg_dst = segment_of_op[src], segment_of_op[dst]
        crossing = seg_src < seg_dst
        seg_flops = np.add.reduceat(op_flops, starts)

        prefix = np.concatenate([[0.0], np.cumsum(seg_flops)])
        total = float(prefix[-1])
        cap = (1.0 + float(delta)) * total / num_layers
        used_delta, relaxed = float(delta), False
        if _min_layers(prefix, cap, num_layers) > num_layers:
            smallest_cap = _smallest_feasible_cap(prefix, num_layers)
            smallest_delta = smallest_cap * num_layers / total - 1.0
            if not relax_delta:
                heaviest = int(np.argmax(seg_flops))
                what = (
                    f"heaviest operator {starts[heaviest]}"
                    if allowed_boundaries is None
                    else f"heaviest unsplittable run, from operator {starts[heaviest]},"
                )
                raise PlanError(
                    f"cluster_operators: no clustering of {num_ops} operators into {num_layers} "
                    f"layers keeps every layer within (1 + δ)·FLOP_total/L = {cap:.6g} FLOPs "
                    f"(δ = {delta:g}; the {what} has {seg_flops[heaviest]:.6g}); the smallest "
                    f"δ that works is {smallest_delta:.6g} (or pass relax_delta=True)"
                )
            cap, used_delta, relaxed = smallest_cap, smallest_delta, True

        band = _Band.build(prefix, cap)
        received = band.bytes_received(seg_src[crossing], seg_dst[crossing], weight[crossing])
        return _Problem(op_flops, starts, band, received, used_delta, relaxed)


def _is_real(value: object) -> bool:
    return isinstance(value, int | float | np.integer | np.floating) and not isinstance(value, bool)


def _check_flops(flops: npt.ArrayLike) -> np.ndarray:
    try:
        values = np.asarray(flops, dtype=np.float64)
    except (TypeError, ValueError):
        raise AlpaError("cluster_operators: flops must be an array of numbers") from None
    if values.ndim != 1 or values.size == 0:
        raise AlpaError(
            f"cluster_operators: flops must be a non-empty 1-D array, got shape {values.shape}"
        )
    bad = np.flatnonzero(~np.isfinite(values) | (values < 0))
    if bad.size:
        raise AlpaError(
            f"cluster_operators: flops must be finite and >= 0, flops[{bad[0]}] = {values[bad[0]]}"
        )
    return values


def _start_mask(starts: np.ndarray, num_ops: int) -> np.ndarray:
    mask = np.zeros(num_ops, dtype=np.int64)
    mask[starts] = 1
    return mask


def _segment_starts(allowed_boundaries: npt.ArrayLike | None, num_ops: int) -> np.ndarray:
    """Operators where a layer may start; operator 0 always."""
    if allowed_boundaries is None:
        return np.arange(num_ops)
    mask = np.asarray(allowed_boundaries)
    if mask.shape != (num_ops,) or mask.dtype != np.bool_:
        raise AlpaError(
            f"cluster_operators: allowed_boundaries must be a bool array of shape ({num_ops},), "
            f"got {mask.dtype} {mask.shape}"
        )
    mask = mask.copy()
    mask[0] = True
    return np.flatnonzero(mask)


def _chain_edges(edges: Iterable[Edge], num_ops: int) -> tuple[np.ndarray, ...]:
    """Each tensor as the chain producer → 1st consumer → 2nd consumer …, one weight each."""
    src: list[int] = []
    dst: list[int] = []
    weight: list[float] = []
    for index, edge in enumerate(edges):
        try:
            producer, consumers, size = edge
        except (TypeError, ValueError):
            raise AlpaError(
                f"cluster_operators: edge {index} must be (src, dst, bytes), got {edge!r}"
            ) from None
        targets = [consumers] if isinstance(consumers, int | np.integer) else list(consumers)
        if not (isinstance(producer, int | np.integer) and 0 <= producer < num_ops):
            raise AlpaError(
                f"cluster_operators: edge {index} has source {producer!r}, not an operator "
                f"index in [0, {num_ops})"
            )
        if not targets or not all(
            isinstance(t, int | np.integer) and producer < t < num_ops for t in targets
        ):
            raise AlpaError(
                f"cluster_operators: edge {index} ({producer} -> {consumers!r}) needs consumers "
                f"after its source and below {num_ops} (operators must be in topological order)"
            )
        try:
            num_bytes = float(size)
        except (TypeError, ValueError):
            num_bytes = math.nan
        if not (math.isfinite(num_bytes) and num_bytes >= 0):
            raise AlpaError(f"cluster_operators: edge {index} has bytes {size!r}, need >= 0")
        chain = [int(producer), *sorted({int(t) for t in targets})]
        src.extend(chain[:-1])
        dst.extend(chain[1:])
        weight.extend([num_bytes] * (len(chain) - 1))
    return (
        np.asarray(src, dtype=np.int64),
        np.asarray(dst, dtype=np.int64),
        np.asarray(weight, dtype=np.float64),
    )


def _window_end(prefix: np.ndarray, start: int, cap: float) -> int:
    """Largest ``e`` with ``prefix[e] − prefix[start] <= cap`` (the same test the DP uses)."""
    end = int(np.searchsorted(prefix, prefix[start] + cap, side="right")) - 1
    while end + 1 < prefix.size and prefix[end + 1] - prefix[start] <= cap:
        end += 1
    while end > start and prefix[end] - prefix[start] > cap:
        end -= 1
    return end


def _min_layers(prefix: np.ndarray, cap: float, limit: int) -> int:
    """Fewest layers within ``cap`` (greedy is optimal); ``limit + 1`` if more are needed."""
    position, count, last = 0, 0, prefix.size - 1
    while position < last:
        end = _window_end(prefix, position, cap)
        if end == position or count >= limit:
            return limit + 1
        position, count = end, count + 1
    return count


def _smallest_feasible_cap(prefix: np.ndarray, num_layers: int) -> float:
    """The least per-layer FLOP cap admitting ``num_layers`` layers (bisection to the ulp)."""
    low = float(np.max(np.diff(prefix)))  # no cap below the heaviest segment works
    if _min_layers(prefix, low, num_layers) <= num_layers:
        return low
    high = float(prefix[-1])
    while True:
        middle = 0.5 * (low + high)
        if not low < middle < high:
            return high
        if _min_layers(prefix, middle, num_layers) <= num_layers:
            high = middle
        else:
            low = middle


@dataclass(frozen=True)
class _Band:
    """The allowed layers as a band: row ``k`` (last segment), column ``w = k − first``.

    ``valid[k, w]`` says whether segments ``k − w .. k`` fit the FLOP cap;
    the layer before ends at segment ``k − w − 1`` (DP row ``k − w``, :func:`_before`).
    """

    valid: np.ndarray  # [n, W] bool
    square: np.ndarray  # [n, W] float: FLOPs of the layer, squared
    prefix: np.ndarray  # [n + 1]
    cap: float

    @property
    def num_segments(self) -> int:
        return self.valid.shape[0]

    @staticmethod
    def build(prefix: np.ndarray, cap: float) -> _Band:
        num_segments = prefix.size - 1
        ends = np.arange(num_segments)
        # Smallest first segment allowed for each end: FLOPs only fall as the start
        # moves right, so bisect on exactly the test the DP uses (no rounding drift).
        low, high = np.zeros(num_segments, dtype=np.int64), ends.copy()
        while np.any(low < high):
            middle = (low + high) // 2
            fits = prefix[ends + 1] - prefix[middle] <= cap
            high = np.where(fits, middle, high)
            low = np.where(fits, low, middle + 1)
        first = low
        width = int((ends - first).max()) + 1
        offsets = np.arange(width)
        starts = ends[:, None] - offsets[None, :]
        valid = (offsets[None, :] <= (ends - first)[:, None]) & (
            prefix[ends + 1][:, None] - prefix[np.maximum(starts, 0)] <= cap
        )
        layer_flops = prefix[ends + 1][:, None] - prefix[np.maximum(starts, 0)]
        return _Band(
            valid=valid,
            square=np.where(valid, layer_flops * layer_flops, np.inf),
            prefix=prefix,
            cap=cap,
        )

    def bytes_received(self, src: np.ndarray, dst: np.ndarray, weight: np.ndarray) -> np.ndarray:
        """``C(k − w, k)`` on the band (``inf`` outside it).

        ``R(i, b)``: bytes into ``b`` from sources before ``i``; on the band
        ``R[k, w] = R(k − w, k)`` is a row-prefix over ``w < k − a`` of the
        edges ``(a, k)``. ``C(i, k) = Σ_{b=i..k} R(i, b)`` is then a cumulative
        sum along the diagonals of ``R``, done as a cumsum after skewing.
        """
        num_segments, width = self.valid.shape
        diff = np.zeros((num_segments, width + 1))
        np.add.at(diff, (dst, 0), weight)
        np.add.at(diff, (dst, np.minimum(dst - src, width)), -weight)
        # into[k, w] = R(k - w, k), with ``width`` rows of zeros below
        into = np.zeros((num_segments + width, width))
        np.cumsum(diff[:, :width], axis=1, out=into[:num_segments])
        # skewed[i, w] = into[i + w, w]: the diagonal through first segment i
        # (zero past the last segment), read in place: a step of one row and
        # one column is width + 1 elements
        item = into.itemsize
        skewed = np.lib.stride_tricks.as_strided(
            into, shape=(num_segments, width), strides=(width * item, (width + 1) * item)
        )
        # per_first[i, w] = C(i, i + w), below ``width`` rows of zeros
        per_first = np.zeros((width + num_segments, width))
        np.cumsum(skewed, axis=1, out=per_first[width:])
        # received[k, w] = per_first[k - w, w]: a step of one row back and one
        # column on is -(width - 1) elements (rows k - w < 0 read the zeros)
        received = np.lib.stride_tricks.as_strided(
            per_first[width:],
            shape=(num_segments, width),
            strides=(width * item, -(width - 1) * item),
        )
        return np.where(self.valid, received, np.inf)

    def row_range(self, layers_so_far: int, num_layers: int) -> tuple[int, int]:
        """Ends ``k`` that ``layers_so_far`` layers can reach and ``num_layers`` can finish from."""
        num_segments = self.num_segments
        done = self.prefix[1:]  # FLOPs of segments 0..k
        rest = self.prefix[-1] - done
        # Each layer's FLOPs is a rounded prefix difference; allow for that rounding.
        slack = 4.0 * (num_segments + num_layers) * np.finfo(np.float64).eps * self.prefix[-1]
        ends = np.arange(num_segments)
        ok = (
            (ends >= layers_so_far - 1)
            & (num_segments - 1 - ends >= num_layers - layers_so_far)
            & (done <= layers_so_far * self.cap + slack)
            & (rest <= (num_layers - layers_so_far) * self.cap + slack)
        )
        hits = np.flatnonzero(ok)
        if hits.size == 0:
            return 0, 0
        return int(hits[0]), int(hits[-1]) + 1


def _before(previous: np.ndarray, lo: int, hi: int, band: _Band) -> np.ndarray:
    """The DP row of the layer before, for ends ``lo..hi - 1``: row ``k``,
    column ``w`` is ``previous[k - w]`` (``previous[0]`` where ``k - w < 0``, a
    cell outside the band), read in place (a step of one row on and one
    column on is zero elements)."""
    width = band.valid.shape[1]
    padded = np.empty(width + previous.size)
    padded[:width] = previous[0]
    padded[width:] = previous
    item = padded.itemsize
    start = padded[width + lo :]
    return np.lib.stride_tricks.as_strided(
        start, shape=(hi - lo, width), strides=(item, -item), writeable=False
    )


def _min_max_dp(band: _Band, received: np.ndarray, num_layers: int) -> float:
    """Eq. 6: ``G[r][k + 1] = min_w max(G[r − 1][k − w], C(k − w, k))``; returns ``G*``."""
    num_segments = band.num_segments
    previous = np.full(num_segments + 1, np.inf)
    previous[0] = 0.0
    for layers_so_far in range(1, num_layers + 1):
        current = np.full(num_segments + 1, np.inf)
        lo, hi = band.row_range(layers_so_far, num_layers)
        if hi > lo:
            values = np.maximum(_before(previous, lo, hi, band), received[lo:hi])
            current[lo + 1 : hi + 1] = values.min(axis=1)
        previous = current
    best = float(previous[num_segments])
    if not np.isfinite(best):
        raise PlanError(
            f"cluster_operators: no clustering into {num_layers} layers meets the FLOP bound "
            f"{band.cap:.6g}"
        )
    return best


def _min_square_sum_dp(
    band: _Band, received: np.ndarray, num_layers: int, best_max: float
) -> list[int]:
    """Among clusterings with every ``C <= G*``, the one with least ``Σ f²``; its layer ends."""
    num_segments = band.num_segments
    allowed_square = np.where(received <= best_max, band.square, np.inf)
    previous = np.full(num_segments + 1, np.inf)
    previous[0] = 0.0
    choices = np.zeros((num_layers + 1, num_segments), dtype=np.int64)
    for layers_so_far in range(1, num_layers + 1):
        current = np.full(num_segments + 1, np.inf)
        lo, hi = band.row_range(layers_so_far, num_layers)
        if hi > lo:
            values = _before(previous, lo, hi, band) + allowed_square[lo:hi]
            arg = values.argmin(axis=1)
            current[lo + 1 : hi + 1] = values[np.arange(hi - lo), arg]
            choices[layers_so_far, lo:hi] = arg
        previous = current
    assert np.isfinite(previous[num_segments]), "min-max optimum must admit a clustering"
    ends: list[int] = []
    end = num_segments - 1
    for layers_so_far in range(num_layers, 0, -1):
        ends.append(end)
        end = end - int(choices[layers_so_far, end]) - 1
    assert end == -1, "cluster_operators: inconsistent DP back-pointers"
    return ends[::-1]
