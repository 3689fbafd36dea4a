"""Benchmark of the stage-construction DP on the paper's largest setting.

Alpa's numba-compiled DP takes 12.4 s (32 layers) and 93 s (48 layers) on this
machine for 64 devices, submesh sizes 1, 2, 4, ..., 64, and B = 64 or 128
micro-batches. This tool builds seeded random instances of that shape
(``cost = work(layers) / size^0.9 · noise``, all feasible, no memory limit),
times :func:`alpa_ir.algorithms.stage_dp` on them, and checks each optimum
against a straightforward reference: the paper's linear sweep over every
distinct ``t_max`` in increasing order with its ``B·t_max >= T*`` stop rule,
solving Eq. 3 at each ``t_max`` with plain loops over layers (numpy only over
submesh choices and device counts).

Run: ``python -m alpa_ir.tools.bench_stage_dp`` (``--help`` for options).
"""

from __future__ import annotations

import argparse
import math
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from alpa_ir.algorithms import stage_dp
from alpa_ir.errors import AlpaError

NUM_DEVICES = 64
SUBMESH_SIZES = np.array([1, 2, 4, 8, 16, 32, 64])
ALPA_NUMBA_SECONDS = {32: 12.4, 48: 93.0}


def build_costs(num_layers: int, seed: int) -> np.ndarray:
    """``costs[i, j, m]``: work of layers i..j over size_m^0.9, times ±10% noise."""
    rng = np.random.default_rng(seed)
    work = rng.uniform(0.5, 1.5, size=num_layers)
    prefix = np.concatenate([[0.0], np.cumsum(work)])
    span_work = prefix[None, 1:] - prefix[:-1, None]
    costs = span_work[:, :, None] / SUBMESH_SIZES[None, None, :] ** 0.9
    costs = costs * rng.uniform(0.9, 1.1, size=costs.shape)
    costs[np.tril_indices(num_layers, -1)] = np.inf
    return costs


@dataclass(frozen=True)
class ReferenceResult:
    """The reference optimum and how many t_max values the paper's sweep solved."""

    total_latency: float
    t_max_solved: int
    seconds: float


def reference_stage_dp(
    costs: np.ndarray, sizes: np.ndarray, num_devices: int, micro_batches: int
) -> ReferenceResult:
    """Eq. 2–4 the paper's way (no memory limit, so the stage count is not tracked)."""
    start = time.perf_counter()
    num_layers = costs.shape[0]
    finite = costs[np.isfinite(costs)]
    best = np.inf
    solved = 0
    for t_max in np.unique(finite):
        if micro_batches * t_max >= best:
            break
        solved += 1
        allowed = np.where(costs <= t_max, costs, np.inf)
        # f[k, d]: least latency sum of layers k..L-1 on exactly d devices.
        f = np.full((num_layers + 1, num_devices + 1), np.inf)
        f[num_layers, 0] = 0.0
        for k in range(num_layers - 1, -1, -1):
            for i in range(k, num_layers):
                for m, size in enumerate(sizes):
                    t = allowed[k, i, m]
                    if t == np.inf or size > num_devices:
                        continue
                    np.minimum(f[k, size:], t + f[i + 1, : num_devices + 1 - size], out=f[k, size:])
        best = min(best, f[0, num_devices] + (micro_batches - 1) * t_max)
    return ReferenceResult(float(best), solved, time.perf_counter() - start)


def _same_optimum(reference: float, ours: float) -> bool:
    """Equal up to the rounding of summing the same stage latencies in another order."""
    return math.isclose(reference, ours, rel_tol=1e-12, abs_tol=0.0)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--layers", type=int, nargs="+", default=[32, 48])
    parser.add_argument("--micro-batches", type=int, nargs="+", default=[64, 128])
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--repeat", type=int, default=5, help="timing runs (best is reported)")
    parser.add_argument(
        "--reference-max-layers",
        type=int,
        default=48,
        help="run the slow reference only for instances with at most this many layers",
    )
    args = parser.parse_args(argv)
    try:
        rows = []
        for num_layers in args.layers:
            costs = build_costs(num_layers, args.seed)
            for micro_batches in args.micro_batches:
                seconds = []
                for _ in range(max(1, args.repeat)):
                    start = time.perf_counter()
                    result = stage_dp(costs, SUBMESH_SIZES, NUM_DEVICES, micro_batches)
                    seconds.append(time.perf_counter() - start)
                reference = None
                if num_layers <= args.reference_max_layers:
                    reference = reference_stage_dp(costs, SUBMESH_SIZES, NUM_DEVICES, micro_batches)
                rows.append((num_layers, micro_batches, min(seconds), result, reference))
    except AlpaError as err:
        print(f"bench-stage-dp: {err}", file=sys.stderr)
        return 1

    print(
        f"stage DP: {NUM_DEVICES} devices, submesh sizes {SUBMESH_SIZES.tolist()}, seed {args.seed}"
    )
    print(
        "| L | B | stage_dp s | Alpa numba s | speed-up | DP solves | t_max candidates"
        " | optimum T* | stages | reference T* | paper sweep solves | reference s | equal |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    for num_layers, micro_batches, best_seconds, result, reference in rows:
        alpa = ALPA_NUMBA_SECONDS.get(num_layers)
        speedup = f"{alpa / best_seconds:.0f}x" if alpa else "-"
        ref_cells = "- | - | - | not run"
        if reference is not None:
            equal = _same_optimum(reference.total_latency, result.total_latency)
            ref_cells = (
                f"{reference.total_latency:.12g} | {reference.t_max_solved} | "
                f"{reference.seconds:.1f} | {'yes' if equal else 'NO'}"
            )
        print(
            f"| {num_layers} | {micro_batches} | {best_seconds:.4f} | {alpa or '-'} | {speedup} | "
            f"{result.dp_solves} | {result.num_candidates} | {result.total_latency:.12g} | "
            f"{len(result.stages)} | {ref_cells} |"
        )
    mismatches = [
        r
        for r in rows
        if r[4] is not None and not _same_optimum(r[4].total_latency, r[3].total_latency)
    ]
    return 1 if mismatches else 0


if __name__ == "__main__":
    sys.exit(main())
