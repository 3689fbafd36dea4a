"""Fits of microbenchmark timings into the figures of a device profile
(:mod:`alpa_ir.hardware.device_profile`), with no measuring in them (that is
:mod:`alpa_ir.hardware.calibration_sweeps`): the median of repetitions, a
latency + bytes/bandwidth line through (bytes, seconds) points, NCCL's
bus-bandwidth factors of each collective.

The line is fitted by least squares on *relative* residuals (each row divided
by its measured time), so that the small messages, which fix the latency,
weigh as much as the large ones, which fix the bandwidth. A negative
intercept (timer noise on fast small messages) is clamped to 0 and the slope
refitted through the origin on absolute residuals (the large sizes, which
measure the bandwidth, lead).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from alpa_ir.errors import AlpaError
from alpa_ir.hardware.device_profile import COLLECTIVE_KINDS, CollectiveFit


def bus_factor(kind: str, group: int) -> float:
    """NCCL's bus-bandwidth factor (``nccl-tests``' PERFORMANCE.md): the
    ``busbw / algbw`` ratio of ``kind`` over ``group`` devices, so that the
    time of a collective of ``S`` bytes is ``α + factor · S / busbw``:
    ``2(n−1)/n`` for an all-reduce, ``(n−1)/n`` for an all-gather,
    reduce-scatter or all-to-all (``S`` the whole tensor), 1 for a send-recv."""
    if kind not in COLLECTIVE_KINDS:
        raise AlpaError(f"bus_factor: unknown collective kind '{kind}'")
    if group < 1:
        raise AlpaError(f"bus_factor: a group has at least one device, got {group}")
    if kind == "send-recv":
        return 1.0
    share = (group - 1) / group
    return 2.0 * share if kind == "all-reduce" else share


def median(times: Sequence[float]) -> float:
    """The median of ``times`` (one-line error when there are none)."""
    if not times:
        raise AlpaError("median: no timings")
    return float(np.median(np.asarray(times, dtype=np.float64)))


@dataclass(frozen=True)
class LineFit:
    """``seconds = intercept + slope · x`` (``slope`` in s per unit of ``x``)."""

    intercept: float
    slope: float

    def __call__(self, x: float) -> float:
        return self.intercept + self.slope * x


def fit_line(points: Sequence[tuple[float, float]], what: str = "fit") -> LineFit:
    """The least-squares line through ``(x, seconds)`` points on relative
    residuals (module docstring), with ``intercept >= 0`` and ``slope > 0``."""
    if len(points) < 2:
        raise AlpaError(f"{what}: needs at least two points, got {len(points)}")
    x = np.array([p[0] for p in points], dtype=np.float64)
    t = np.array([p[1] for p in points], dtype=np.float64)
    if not (np.all(np.isfinite(x)) and np.all(np.isfinite(t)) and np.all(t > 0)):
        raise AlpaError(f"{what}: points need finite sizes and positive times, got {points}")
    if np.ptp(x) == 0:
        raise AlpaError(f"{what}: points need at least two different sizes")
    weight = 1.0 / t
    design = np.stack([np.ones_like(x), x], axis=1) * weight[:, None]
    (intercept, slope), *_ = np.linalg.lstsq(design, t * weight, rcond=None)
    if intercept < 0 or slope <= 0:
        if slope > 0:  # a negative intercept: through the origin, the large sizes leading
            intercept = 0.0
            slope = float(np.sum(x * t) / np.sum(x * x))
        else:  # no time grows with size (noise): the latency alone, and the fastest rate seen
            intercept = float(np.min(t))
            slope = float(np.min(t / np.maximum(x, 1.0))) * 1e-3
    return LineFit(float(intercept), float(slope))


def fit_collective(
    kind: str, level: str, group: int, points: Sequence[tuple[float, float]]
) -> CollectiveFit:
    """A collective's latency and bus bandwidth from ``(bytes S, seconds)``
    points (``S`` in NCCL's convention: the whole tensor; see :func:`bus_factor`)."""
    factor = bus_factor(kind, group)
    line = fit_line(
        [(factor * s, t) for s, t in points], what=f"{kind} over {group} devices at '{level}'"
    )
    return CollectiveFit(kind, level, group, line.intercept, 1.0 / line.slope)


@dataclass(frozen=True)
class BandwidthFit:
    """A streaming kernel: achieved bytes/s (read + written) and its fixed cost."""

    bandwidth: float
    fixed: float


def fit_bandwidth(points: Sequence[tuple[float, float]]) -> BandwidthFit:
    """Bandwidth and fixed seconds from ``(bytes moved, seconds)`` of a streaming kernel."""
    line = fit_line(points, what="memory bandwidth")
    return BandwidthFit(1.0 / line.slope, line.intercept)


def per_kernel_floor(short: float, long: float, kernels: int) -> float:
    """The seconds one more kernel adds: a program of ``kernels`` chained tiny
    kernels took ``long``, one of a single such kernel ``short`` (>= 0)."""
    if kernels < 2:
        raise AlpaError(f"per_kernel_floor: needs at least 2 kernels, got {kernels}")
    return max((long - short) / (kernels - 1), 0.0)


def transposed_read_rate(nbytes: float, seconds: float, bandwidth: float) -> tuple[float, float]:
    """``(nbytes, bytes/s)`` of a read through a transpose, from a kernel that
    read ``nbytes`` transposed, streamed as many and wrote as many in
    ``seconds``: the streamed two at ``bandwidth``, the rest the transposed
    read's (at most as fast as streaming)."""
    if not (nbytes > 0 and seconds > 0 and bandwidth > 0):
        raise AlpaError(
            f"transposed_read_rate: needs positive bytes, seconds and bandwidth, "
            f"got {nbytes}, {seconds}, {bandwidth}"
        )
    streamed = nbytes / bandwidth
    return (float(nbytes), nbytes / max(seconds - 2.0 * streamed, streamed))


def gemm_flops(m: int, n: int, k: int) -> float:
    """FLOPs of ``m × k`` by ``k × n``: a multiply and an add per term."""
    return 2.0 * m * n * k


def geometric_sizes(smallest: int, largest: int, count: int) -> tuple[int, ...]:
    """``count`` sizes from ``smallest`` to ``largest`` in geometric steps,
    rounded to multiples of 1024 bytes (at least ``smallest``), distinct."""
    if not 0 < smallest <= largest or count < 1:
        raise AlpaError(f"geometric_sizes: bad range {smallest}..{largest} x {count}")
    if count == 1:
        return (largest,)
    ratio = (largest / smallest) ** (1.0 / (count - 1))
    sizes = []
    for j in range(count):
        raw = smallest * ratio**j
        size = max(smallest, round(raw / 1024.0) * 1024) if raw >= 1024 else round(raw)
        if not sizes or size > sizes[-1]:
            sizes.append(size)
    return tuple(sizes)


__all__ = [
    "BandwidthFit",
    "LineFit",
    "bus_factor",
    "fit_bandwidth",
    "fit_collective",
    "fit_line",
    "gemm_flops",
    "geometric_sizes",
    "median",
    "per_kernel_floor",
    "transposed_read_rate",
]
