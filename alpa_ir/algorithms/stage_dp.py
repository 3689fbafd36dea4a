"""Alpa's stage-construction dynamic program (OSDI'22 §5.2, Eq. 2–5), exact and fast.

The problem: slice layers ``0..L-1`` into consecutive stages, give every stage
one submesh choice ``m`` (of ``submesh_sizes[m]`` devices) so that the sizes
sum to the cluster's device count exactly, and minimise the pipeline latency

    T = Σ_i t_i + (B − 1) · max_j t_j                                   (Eq. 2)

where ``t_i = costs[first, last, m]`` and ``B`` is the number of micro-batches.
A stage followed by ``s`` later stages is feasible only if
``s <= max_stages_after[first, last, m]`` (the 1F1B memory check of Eq. 5).

Generalisation (``bottleneck``): the pace term may take another per-stage
value ``u_i = bottleneck[first, last, m]``,
``T = Σ_i t_i + (B − 1) · max_j u_j``. With cross-stage transfers,
``t_i`` is a stage's compute plus the transfers into it (one micro-batch's
trip through the pipeline crosses every link once each way) and ``u_i`` the
slowest of its compute and its incoming links (a link carries one
micro-batch at a time, so a slow link paces the pipeline like a slow stage).
Zero-bubble schedules sum less than a stage's
time (``t_i − 2·W_i``, the part of it the bubble cannot hide) and keep the
whole time in the max: there ``u_i > t_i``. Everything below holds with ``u``
in the role of the stage cost in the max and ``t`` in the sum, the bound of
step 3 divided by ``κ = max u_i / t_i`` where ``κ > 1``;
``bottleneck=None`` is Eq. 2.

The paper's algorithm fixes ``t_max``, solves the DP

    F(s, k, d | t_max) = min over stages (k..i, m) with t <= t_max of
                         t + F(s − 1, i + 1, d − size_m | t_max)         (Eq. 3)

and takes ``T*(t_max) = min_s F(s, 0, D | t_max) + (B − 1)·t_max`` (Eq. 4)
over all distinct stage costs ``t_max``, in increasing order, stopping when
``B·t_max >= best T*``. This module computes the same optimum with three
changes that make it much faster without losing exactness:

1. **The stage-count dimension is dropped unless a memory limit binds.**
   ``s`` only matters for the memory check. A limit ``λ`` on a stage that can
   never have more than ``λ`` stages after it (there are not enough layers or
   devices left) is not binding. The remaining limits need the number of later
   stages only up to ``Λ + 1`` (``Λ`` = largest binding limit), so the DP
   carries a *saturating* stage counter with ``Λ + 2`` states instead of
   ``L``; with no binding limit that is one state, i.e. no ``s`` at all.
   The counter is also relaxed first: capped at ``c < Λ + 1`` (``c``
   meaning "``c`` or more after", every limit capped at ``c``) the DP
   admits more plans, so its minimum is a lower bound; when its plan meets
   the real limits it is optimal, else ``c`` grows (to at least that
   plan's stage count) up to the exact ``Λ + 1``. Good pipelines have few
   stages, so most solves need a small ``c`` (GPT 76B on 512 devices: 55
   states exact, a few needed; 20 s of CPU to 0.2 s).
2. **Vectorisation.** For each start layer ``k`` the DP row over all device
   counts ``d`` is one numpy reduction per submesh choice over the end
   layers whose stage may be chosen (below ``t_max``: GPT 1T's 129 layers
   on 512 devices, 5 times faster than over every end layer).
3. **Branch and bound over t_max instead of a linear sweep.** Let ``G(t)`` be
   the minimal stage-latency sum with every stage ``<= t``; ``G`` is a
   non-increasing step function and ``T* = min_t G(t) + (B − 1)·t``.
   Solving the DP at one ``t`` returns a plan whose slowest stage is
   ``m <= t``, which proves ``G`` constant on ``[m, t]``: one evaluation
   settles a whole range of candidates. Unsettled ranges of candidates are
   kept in a priority queue with the lower bound
   ``max(G(right end), t_below / κ) + (B − 1)·t_lo`` (``t_lo`` the range's
   smallest candidate, ``t_below`` the one before it). This generalises the
   paper's early-pruning rule ``B·t_max >= T*`` (a plan whose slowest stage
   is ``t`` costs at least ``t + (B − 1)·t``) with ``G``'s monotonicity:
   every ``t`` in the range has ``G(t) >= G(right end)``. Ranges are split
   in the middle (bisection) until each is settled or pruned. Infeasible
   ``t`` (``G = ∞``) are handled by the same bisection, which turns the long
   infeasible prefix of the paper's sweep into a binary search. The optimum
   is exactly that of exhaustive enumeration; the number of DP solves is
   roughly logarithmic per Pareto point near the optimum instead of one per
   candidate.

The ε gap (``epsilon``, absolute, in the unit of ``costs``): the paper skips
any ``t_max`` less than ε above the last one tried. Here the sorted distinct
stage costs are grouped into windows ``[c, c + ε)`` and each window is
represented by its *largest* member, which gives a proven bound: the returned
latency is at most ``optimum + (B − 1)·ε`` (the paper's skip rule has no such
bound when candidates are sparse). ``epsilon=0`` (the default) keeps every
distinct cost and the result is exact; pass ``epsilon=1e-6`` (seconds) for the
paper's setting.
"""

from __future__ import annotations

import heapq
from collections.abc import Iterator
from dataclasses import dataclass, field

import numpy as np
import numpy.typing as npt

from alpa_ir.errors import AlpaError, PlanError

Stage = tuple[int, int, int]
"""One pipeline stage: (first layer, last layer, submesh choice), layers inclusive."""

_UNLIMITED = np.iinfo(np.int64).max // 4
"""A memory limit that no plan reaches."""


@dataclass(frozen=True)
class StageDPResult:
    """The optimal pipeline plan.

    ``total_latency`` is Eq. 2 for ``stages``: ``Σ t_i + (B − 1)·max t_i``
    (``max u_i`` with a bottleneck; ``max_stage_latency`` is that max).
    ``stages`` covers layers ``0..L-1`` in order, each as
    ``(first layer, last layer, submesh index)``. The result unpacks as
    ``total_latency, stages = stage_dp(...)``. ``dp_solves`` and
    ``num_candidates`` are statistics (DP solves done; distinct ``t_max``
    values after ε-grouping) and take no part in equality.
    """

    total_latency: float
    stages: tuple[Stage, ...]
    max_stage_latency: float
    dp_solves: int = field(default=0, compare=False)
    num_candidates: int = field(default=0, compare=False)

    def __iter__(self) -> Iterator[object]:
        return iter((self.total_latency, self.stages))


@dataclass(frozen=True)
class _Problem:
    """Validated, preprocessed inputs shared by all DP solves of one call."""

    num_layers: int
    num_devices: int
    num_micro_batches: int
    sizes: npt.NDArray[np.int64]  # [M]
    costs_kmi: npt.NDArray[np.float64]  # [L, M, L]: (first, choice, last); inf = invalid
    pace_kmi: npt.NDArray[np.float64]  # [L, M, L]: the bottleneck values (the costs by default)
    pace_ratio: float  # κ: the largest bottleneck / cost (1 when the pace never exceeds the cost)
    limit_kmi: npt.NDArray[np.int64]  # [L, M, L]: binding limits; a non-binding one: the cap
    num_states: int  # states of the exact saturating "stages after" counter (Λ + 2)
    shift_index: npt.NDArray[np.int64]  # [M, D+1]: d - size_m, or D+1 (the inf slot)


def stage_dp(
    costs: npt.ArrayLike,
    submesh_sizes: npt.ArrayLike,
    num_devices: int,
    num_micro_batches: int,
    max_stages_after: npt.ArrayLike | None = None,
    *,
    epsilon: float = 0.0,
    bottleneck: npt.ArrayLike | None = None,
    sum_scale: float = 1.0,
    solves: dict[float, object] | None = None,
) -> StageDPResult:
    """Solve Alpa's stage construction (Eq. 2–5) exactly; see the module docstring.

    Args:
        costs: ``[L, L, M]`` float array, ``costs[i, j, m]`` = latency of the
            stage of layers ``i..j`` on submesh choice ``m``; ``inf`` where it
            does not fit. Entries with ``j < i`` are ignored.
        submesh_sizes: ``[M]`` positive ints, the device count of each choice.
        num_devices: total device count; the chosen submeshes use exactly all.
        num_micro_batches: ``B >= 1``.
        max_stages_after: optional ``[L, L, M]`` array: a stage with ``s``
            stages after it is feasible only if ``s <= max_stages_after``.
            ``None`` = unlimited; a negative entry (or ``-inf``) marks the stage
            infeasible; ``+inf`` = unlimited.
        epsilon: ε gap (absolute, unit of ``costs``); ``0`` = exact.
        bottleneck: optional ``[L, L, M]`` array, the value of each stage in
            the ``(B − 1)·max`` term (default: ``costs``); must be ``>= 0``
            where the cost is finite.
        sum_scale: the weight of the latency sum,
            ``T = sum_scale·Σ_i t_i + (B − 1)·max_j u_j`` (virtual stages: ``1 / v``,
            the bubble a mesh's ``v`` chunks share); ``> 0``.
        solves: a dict the caller keeps across calls on the same ``costs``,
            ``bottleneck``, limits, sizes and devices (any ``B``, ``epsilon``
            or ``sum_scale``): each ``t_max``'s DP solve (``G(t_max)`` and its
            plan, which depend on nothing else) is done once and read again
            (1F1B and interleaved 1F1B share them; ZB-H1 and ZB-V).

    Raises:
        AlpaError: malformed inputs.
        PlanError: no plan uses all devices within the memory limits.
    """
    problem = _prepare(
        costs, submesh_sizes, num_devices, num_micro_batches, max_stages_after, bottleneck
    )
    if not (
        isinstance(epsilon, int | float | np.integer | np.floating)
        and np.isfinite(epsilon)
        and epsilon >= 0.0
    ):
        raise AlpaError(f"stage_dp: epsilon must be a finite number >= 0, got {epsilon!r}")
    valid = problem.pace_kmi[np.isfinite(problem.costs_kmi)]
    if valid.size == 0:
        raise PlanError(
            "stage_dp: no stage fits any submesh (every cost is inf or its submesh "
            f"is larger than the {problem.num_devices} devices)"
        )
    if not (np.isfinite(sum_scale) and sum_scale > 0):
        raise AlpaError(f"stage_dp: sum_scale must be a finite number > 0, got {sum_scale!r}")
    reps = _candidate_thresholds(np.unique(valid), float(epsilon))
    return _branch_and_bound(problem, reps, float(sum_scale), {} if solves is None else solves)


def _prepare(
    costs: npt.ArrayLike,
    submesh_sizes: npt.ArrayLike,
    num_devices: int,
    num_micro_batches: int,
    max_stages_after: npt.ArrayLike | None,
    bottleneck: npt.ArrayLike | None = None,
) -> _Problem:
    """Check the inputs and bring them into the layout the DP wants."""
    try:
        cost = np.asarray(costs, dtype=np.float64)
    except (TypeError, ValueError):
        raise AlpaError("stage_dp: costs must be an array of numbers") from None
    if cost.ndim != 3 or cost.shape[0] != cost.shape[1] or cost.shape[0] == 0:
        raise AlpaError(f"stage_dp: costs must have shape [L, L, M] with L >= 1, got {cost.shape}")
    num_layers, _, num_choices = cost.shape
    sizes = np.asarray(submesh_sizes)
    if sizes.shape != (num_choices,) or num_choices == 0:
        raise AlpaError(
            f"stage_dp: submesh_sizes must have shape [{num_choices}] to match costs, "
            f"got {sizes.shape}"
        )
    if not np.issubdtype(sizes.dtype, np.integer) or np.any(sizes < 1):
        raise AlpaError(f"stage_dp: submesh_sizes must be positive integers, got {sizes.tolist()}")
    sizes = sizes.astype(np.int64)
    if isinstance(num_devices, bool) or not isinstance(num_devices, int | np.integer):
        raise AlpaError(f"stage_dp: num_devices must be an int, got {num_devices!r}")
    if num_devices < 1:
        raise AlpaError(f"stage_dp: num_devices must be >= 1, got {num_devices}")
    if isinstance(num_micro_batches, bool) or not isinstance(num_micro_batches, int | np.integer):
        raise AlpaError(f"stage_dp: num_micro_batches must be an int, got {num_micro_batches!r}")
    if num_micro_batches < 1:
        raise AlpaError(f"stage_dp: num_micro_batches must be >= 1, got {num_micro_batches}")
    upper = np.triu(np.ones((num_layers, num_layers), dtype=bool))[:, :, None]
    relevant = np.broadcast_to(upper, cost.shape)
    if np.any(np.isnan(cost[relevant])):
        raise AlpaError("stage_dp: costs contain NaN")
    if np.any(cost[relevant] < 0):
        i, j, m = np.argwhere(relevant & (cost < 0))[0]
        raise AlpaError(
            f"stage_dp: costs must be >= 0 (latencies), costs[{i}, {j}, {m}] = {cost[i, j, m]}"
        )
    cost = np.where(relevant & (sizes <= num_devices)[None, None, :], cost, np.inf)

    num_devices = int(num_devices)
    # Most stages a stage (·, j, m) can have after it: one layer and the
    # smallest submesh each, within the layers and devices left.
    stages_left = np.minimum(
        (num_layers - 1 - np.arange(num_layers))[:, None],
        (num_devices - sizes)[None, :] // int(sizes.min()),
    )  # [L(last layer), M]
    most_after = np.broadcast_to(stages_left[None, :, :], cost.shape)
    if max_stages_after is None:
        binding = np.zeros(cost.shape, dtype=bool)
        limit = np.zeros(cost.shape, dtype=np.int64)
    else:
        limit = _integer_limits(max_stages_after, cost.shape)
        cost = np.where(limit < 0, np.inf, cost)
        binding = np.isfinite(cost) & (limit < most_after)
    # Counter states 0..Λ are exact counts, Λ+1 means "more than any binding
    # limit"; a limit that never binds is unlimited.
    num_states = int(limit[binding].max()) + 2 if np.any(binding) else 1
    lam = np.where(binding, np.clip(limit, 0, None), _UNLIMITED)

    pace = cost if bottleneck is None else _bottleneck(bottleneck, cost, relevant)
    finite = np.isfinite(cost) & relevant
    above = finite & (pace > cost)
    ratio = 1.0
    if above.any():
        ratio = float(
            np.max(
                np.where(
                    cost[above] > 0,
                    pace[above] / np.where(cost[above] > 0, cost[above], 1.0),
                    np.inf,
                )
            )
        )
    d = np.arange(num_devices + 1)[None, :] - sizes[:, None]
    shift_index = np.where(d >= 0, d, num_devices + 1)
    return _Problem(
        num_layers=num_layers,
        num_devices=num_devices,
        num_micro_batches=int(num_micro_batches),
        sizes=sizes,
        costs_kmi=np.ascontiguousarray(cost.transpose(0, 2, 1)),
        pace_kmi=np.ascontiguousarray(pace.transpose(0, 2, 1)),
        pace_ratio=ratio,
        limit_kmi=np.ascontiguousarray(lam.astype(np.int64).transpose(0, 2, 1)),
        num_states=num_states,
        shift_index=shift_index,
    )


def _bottleneck(bottleneck: npt.ArrayLike, cost: np.ndarray, relevant: np.ndarray) -> np.ndarray:
    """The checked bottleneck values, ``inf`` wherever the cost is."""
    try:
        pace = np.asarray(bottleneck, dtype=np.float64)
    except (TypeError, ValueError):
        raise AlpaError("stage_dp: bottleneck must be an array of numbers") from None
    if pace.shape != cost.shape:
        raise AlpaError(
            f"stage_dp: bottleneck must have the shape of costs {cost.shape}, got {pace.shape}"
        )
    finite = np.isfinite(cost)
    if np.any(np.isnan(pace[relevant])) or np.any(pace[finite] < 0):
        raise AlpaError("stage_dp: bottleneck values must be numbers >= 0")
    return np.where(finite, pace, np.inf)


def _integer_limits(max_stages_after: npt.ArrayLike, shape: tuple[int, ...]) -> np.ndarray:
    """``max_stages_after`` as int64, with ±inf mapped to "unlimited"/"infeasible"."""
    raw = np.asarray(max_stages_after)
    if raw.shape != shape:
        raise AlpaError(
            f"stage_dp: max_stages_after must have the shape of costs {shape}, got {raw.shape}"
        )
    if np.issubdtype(raw.dtype, np.integer) or raw.dtype == np.bool_:
        return raw.astype(np.int64)
    if not np.issubdtype(raw.dtype, np.floating):
        raise AlpaError(f"stage_dp: max_stages_after must be numeric, got dtype {raw.dtype}")
    finite = np.isfinite(raw)
    if np.any(np.isnan(raw)) or np.any(raw[finite] != np.round(raw[finite])):
        raise AlpaError("stage_dp: max_stages_after must hold integers (or ±inf)")
    big = _UNLIMITED
    return np.where(finite, raw, np.where(raw > 0, big, -1)).astype(np.int64)


def _candidate_thresholds(distinct: np.ndarray, epsilon: float) -> np.ndarray:
    """The t_max values to consider: the largest cost of each ε-window (all if ε = 0)."""
    if epsilon == 0.0 or distinct.size <= 1:
        return distinct
    reps = []
    start = 0
    while start < distinct.size:
        end = int(np.searchsorted(distinct, distinct[start] + epsilon, side="left"))
        end = max(end, start + 1)
        reps.append(distinct[end - 1])
        start = end
    return np.asarray(reps, dtype=np.float64)


@dataclass(frozen=True)
class _Solve:
    """One DP solve at a fixed t_max: G(t_max) and a plan achieving it."""

    latency_sum: float
    stages: tuple[Stage, ...]
    stage_latencies: tuple[float, ...]
    stage_paces: tuple[float, ...]

    @property
    def max_stage(self) -> float:
        return max(self.stage_paces)

    def plan_latency(self, micro_batches: int, sum_scale: float = 1.0) -> float:
        """Eq. 2 for this plan, summed in stage order (independent of the DP's order)."""
        return sum_scale * sum(self.stage_latencies) + (micro_batches - 1) * self.max_stage


def _branch_and_bound(
    problem: _Problem, reps: np.ndarray, scale: float, solved: dict[float, object]
) -> StageDPResult:
    """Minimise ``scale·G(t) + (B − 1)·t`` over the candidate thresholds ``reps``
    (``solved``: the solves of ``G`` known so far, by ``t``; new ones are added).

    Invariant of a queued range ``(lo, hi, g_right)``: the candidates with
    index ``lo+1 .. hi-1`` are unsettled and each has ``G >= g_right``. Only
    candidates where ``G`` jumps can be optimal, and there the plan's slowest
    stage exceeds ``reps[lo]``, hence ``G >= reps[lo] / κ`` too.
    """
    slope = float(problem.num_micro_batches - 1)
    best_bound = np.inf  # min over settled candidates r of G(r) + (B − 1)·r
    best: _Solve | None = None
    best_total = np.inf
    solves = 0
    cap = [0]  # the memory counter's cap the last solve needed (_solve_at)

    def solve_at(t_max: float) -> _Solve | None:
        nonlocal solves
        if t_max not in solved:
            solved[t_max] = _solve_at(problem, t_max, cap)
            solves += 1
        found = solved[t_max]
        assert found is None or isinstance(found, _Solve)
        return found

    def settle(index: int, solve: _Solve) -> int:
        """Record a solved candidate; return the index where its constant range starts."""
        nonlocal best_bound, best, best_total
        first = int(np.searchsorted(reps, solve.max_stage, side="left"))
        best_bound = min(best_bound, scale * solve.latency_sum + slope * float(reps[first]))
        total = solve.plan_latency(problem.num_micro_batches, scale)
        if total < best_total:
            best_total, best = total, solve
        return min(first, index)

    queue: list[tuple[float, int, int, float]] = []

    def push(lo: int, hi: int, g_right: float) -> None:
        if lo + 1 <= hi - 1:
            below = float(reps[lo]) / problem.pace_ratio if lo >= 0 else 0.0
            floor = max(g_right, below)
            bound = scale * floor + slope * float(reps[lo + 1])
            if bound < best_bound:
                heapq.heappush(queue, (bound, lo, hi, g_right))

    top = reps.size - 1
    solve = solve_at(float(reps[top]))
    if solve is None:
        raise PlanError(
            f"stage_dp: no slicing of the {problem.num_layers} layers onto submeshes of sizes "
            f"{problem.sizes.tolist()} uses exactly {problem.num_devices} devices within "
            "the memory limits"
        )
    push(-1, settle(top, solve), solve.latency_sum)
    while queue:
        bound, lo, hi, g_right = heapq.heappop(queue)
        if bound >= best_bound:
            break
        mid = (lo + hi) // 2
        solve = solve_at(float(reps[mid]))
        if solve is None:
            push(mid, hi, g_right)
            continue
        push(lo, settle(mid, solve), solve.latency_sum)
        push(mid, hi, g_right)
    assert best is not None
    return StageDPResult(
        total_latency=float(best_total),
        stages=best.stages,
        max_stage_latency=best.max_stage,
        dp_solves=solves,
        num_candidates=int(reps.size),
    )


def _candidates(
    problem: _Problem,
    cost: np.ndarray,
    lam: np.ndarray | None,
    shifted: np.ndarray,
    k: int,
    d: int | None = None,
) -> np.ndarray:
    """``[S(after), M * span, width]``: the latency sum of a first stage of layers
    ``k..last`` on submesh ``m`` (at ``m * span + last - k``) followed by the
    best slicing of the rest on the devices left, per counter state after the
    stage (``inf`` where the stage does not fit its memory with that many after
    it; ``lam``: the capped limits, None with one state). With ``d``: only that
    device count's column, ``[S(after), M * span]``."""
    num_states, num_choices = shifted.shape[0], problem.sizes.size
    span = problem.num_layers - k
    stage_cost = cost[k, :, k:]  # [M, span]
    if lam is not None:
        after = np.arange(num_states)[:, None, None]
        fits = lam[k, :, k:][None] >= after
        stage_cost = np.where(fits, stage_cost[None], np.inf)  # [S, M, span]
    if d is not None:
        return (stage_cost + shifted[:, :, k + 1 :, d]).reshape(num_states, num_choices * span)
    cand = stage_cost[..., None] + shifted[:, :, k + 1 :, :]
    return cand.reshape(num_states, num_choices * span, -1)


def _row(
    problem: _Problem,
    cost: np.ndarray,
    lam: np.ndarray | None,
    shifted: np.ndarray,
    k: int,
    scratch: np.ndarray,
) -> np.ndarray:
    """``[S(after), width]``: the minimum of :func:`_candidates` over its
    middle axis, one submesh at a time and only over the stages that may be
    chosen (a finite cost): below ``t_max`` most stages are not. The sums are
    written into ``scratch`` (``[S, ≥ span, width]``, reused by every row: no
    fresh pages per row), and a run of consecutive end layers (the usual
    case: a stage fits up to some length) is read as a slice, not gathered."""
    num_states = shifted.shape[0]
    stage_cost = cost[k, :, k:]  # [M, span]
    finite = np.isfinite(stage_cost)
    if lam is not None:
        after = np.arange(num_states)[:, None, None]
        stage_cost = np.where(lam[k, :, k:][None] >= after, stage_cost[None], np.inf)
    else:
        stage_cost = stage_cost[None]  # [S, M, span]
    best = np.full((num_states, shifted.shape[-1]), np.inf)
    for m in np.nonzero(finite.any(axis=1))[0]:
        lasts = np.nonzero(finite[m])[0]
        first, last, count = int(lasts[0]), int(lasts[-1]), lasts.size
        sums = scratch[:, :count, :]
        if last - first + 1 == count:  # consecutive: slices, no copies
            rest = shifted[:, m, k + 1 + first : k + 2 + last, :]
            np.add(stage_cost[:, m, first : last + 1, None], rest, out=sums)
        else:
            np.add(stage_cost[:, m, lasts, None], shifted[:, m, k + 1 + lasts, :], out=sums)
        np.minimum(best, sums.min(axis=1), out=best)
    return best


def _solve_at(problem: _Problem, t_max: float, start: list[int]) -> _Solve | None:
    """Eq. 3 at one ``t_max``, exactly, through relaxations of the memory check.

    The saturating counter with ``cap + 1`` states (``cap`` meaning "``cap`` or
    more stages after") and every limit capped at ``cap`` admits every plan the
    exact counter (``cap = Λ + 1``) admits, and more: its minimum is a lower
    bound of the exact one. When the plan it returns meets the real limits,
    that plan is optimal for the exact problem too; otherwise the cap grows
    (at least to that plan's stage count, which the next relaxation then checks
    exactly) until it is exact. The DP's work is proportional to the states,
    and the best plans of real pipelines have few stages, so most solves need
    a small cap. ``start``: the cap to begin with, updated to the one that sufficed
    where a plan was found (a ``t_max`` with none may have grown the cap to the
    exact counter, chasing relaxed plans of many stages; the next ``t_max``
    starts low again).
    """
    exact = problem.num_states - 1
    cap = min(start[0], exact)
    while True:
        solve = _solve_capped(problem, t_max, cap)
        if solve is None or cap == exact or _meets_limits(problem, solve.stages):
            if solve is not None:
                start[0] = cap
            return solve
        cap = min(exact, max(2 * cap, len(solve.stages)))


def _meets_limits(problem: _Problem, stages: tuple[Stage, ...]) -> bool:
    """Whether every stage of ``stages`` has at most its limit of stages after it."""
    last = len(stages) - 1
    return all(
        problem.limit_kmi[first, m, j] >= last - position
        for position, (first, j, m) in enumerate(stages)
    )


def _solve_capped(problem: _Problem, t_max: float, cap: int) -> _Solve | None:
    """Eq. 3 at one ``t_max`` with the counter saturating at ``cap``
    (:func:`_solve_at`): the min latency sum and its plan, or None if infeasible.

    ``F[c, k, d]`` is the least latency sum of layers ``k..L-1`` on ``d``
    devices whose stage count, saturated at ``S − 1``, is ``c``. ``shifted``
    holds ``F[c, i, d − size_m]`` at ``[c, m, i, d]`` so that a row of ``F``
    is a broadcast add and a reduction per submesh (:func:`_row`). The rows
    keep only the minima; the plan's choices are found again along its path
    (:func:`_candidates` gives the same sums, and the first minimum is taken
    as ``argmin`` would have): a minimum reduction is several times faster
    than an ``argmin`` across the middle axis.
    """
    num_layers, num_devices = problem.num_layers, problem.num_devices
    num_states = cap + 1
    width = num_devices + 1
    cost = np.where(problem.pace_kmi <= t_max, problem.costs_kmi, np.inf)  # [L, M, L]
    lam = np.minimum(problem.limit_kmi, cap) if num_states > 1 else None

    shifted = np.full((num_states, problem.sizes.size, num_layers + 1, width), np.inf)
    last_row = np.full((num_states, width + 1), np.inf)
    last_row[0, 0] = 0.0
    shifted[:, :, num_layers, :] = last_row[:, problem.shift_index]
    row = np.empty((num_states, width + 1))
    scratch = np.empty((num_states, num_layers, width))  # _row's sums, every row's
    for k in range(num_layers - 1, -1, -1):
        best = _row(problem, cost, lam, shifted, k, scratch)  # [S(after), width]
        # Counter after this stage: min(after + 1, S − 1).
        if num_states == 1:
            row[0, :width] = best[0]
        else:
            row[0, :width] = np.inf
            row[1 : num_states - 1, :width] = best[: num_states - 2]
            row[num_states - 1, :width] = np.minimum(best[num_states - 1], best[num_states - 2])
        row[:, width] = np.inf
        shifted[:, :, k, :] = row[:, problem.shift_index]

    final = row[:, num_devices]
    state = int(np.argmin(final))
    latency_sum = float(final[state])
    if not np.isfinite(latency_sum):
        return None
    stages: list[Stage] = []
    k, d = 0, num_devices
    while k < num_layers:
        span = num_layers - k
        column = _candidates(problem, cost, lam, shifted, k, d)  # [S(after), M * span]
        if num_states > 1:  # the state after this stage (a saturated one: the lesser)
            if state == num_states - 1:
                after = num_states - 1
                if not column[num_states - 1].min() < column[num_states - 2].min():
                    after = num_states - 2
            else:
                after = state - 1
            state = after
        submesh, last = divmod(int(np.argmin(column[state])), span)
        last += k
        stages.append((k, last, submesh))
        d -= int(problem.sizes[submesh])
        k = last + 1
    assert d == 0 and state == 0, "stage_dp: inconsistent DP back-pointers"
    latencies = tuple(float(problem.costs_kmi[f, m, j]) for f, j, m in stages)
    paces = tuple(float(problem.pace_kmi[f, m, j]) for f, j, m in stages)
    return _Solve(
        latency_sum=latency_sum,
        stages=tuple(stages),
        stage_latencies=latencies,
        stage_paces=paces,
    )
