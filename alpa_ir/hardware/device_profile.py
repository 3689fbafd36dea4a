"""Device profiles: the measured prices every planner decision reads.

A :class:`DeviceProfile` is what one kind of device and its network really
achieve, from microbenchmarks only (never fitted to end-to-end step times,
which are the model's tests):

* ``gemm``: measured matrix multiplications (``m × k`` by ``k × n``, a dtype,
  the FLOP/s reached). :mod:`alpa_ir.costs.device_model` prices a GEMM of any
  shape from them: a roofline over the asymptotic throughput and the memory
  bandwidth, scaled by the measured efficiency of the nearest thin shape
  (tensor-core efficiency falls for the thin matrices tensor parallelism makes).
* ``memory_bandwidth``: bytes/s a streaming elementwise kernel reaches (read +
  written), the price of every memory-bound op after XLA's fusion.
* ``launch_overhead``: seconds a kernel costs however small (launch and tail),
  the floor of every fused op; with ``async_launch`` (GPUs: the host queues
  kernels ahead of the stream) a kernel costs the longer of its run and this
  floor, otherwise (the CPU devices: thunks run one after another on the host)
  the two add up.
* ``collectives``: per network level and collective kind, the latency and the
  achieved *bus* bandwidth in NCCL's convention (``nccl-tests``: an all-reduce
  of ``S`` bytes over ``n`` devices takes ``α + 2(n−1)/n · S / busbw``; an
  all-gather, reduce-scatter or all-to-all ``α + (n−1)/n · S / busbw``, ``S``
  the whole tensor).
* ``transpose_bandwidth``: ``(bytes, bytes/s)`` points: the rate at which a
  kernel reads an array of that many bytes through a transpose that moves its
  minor dimension (strided reads; on CPUs several times slower than streaming
  once the array leaves the caches); empty where such reads stream (GPUs:
  XLA's tiled transposes).
* ``solo_speedup``: how much faster one device computes alone than with
  every device of its host busy (a GEMM on one device against the same GEMM
  on every device at once): above 1 the devices share the host's cores (the
  CPU devices: a pipeline stage that waits leaves its cores to the others);
  1 where each device has compute of its own (GPUs).
* ``overlap``: the share of the gradient synchronization that runs under the
  backward pass (XLA's async collectives), and of the cross-mesh transfers that
  run under compute; 0 where the runtime gets none.

Every profile names its ``source``: the publications of the built-in ones
(:mod:`alpa_ir.hardware.builtin_profiles`), or the host and date where
``alpa-calibrate`` measured it. Profiles are JSON files with a ``format`` and
``version``; :func:`load_profile` refuses other versions with a one-line error.
"""

from __future__ import annotations

import json
import math
import os
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from alpa_ir.errors import AlpaError

FORMAT = "alpa_ir.device_profile"
VERSION = 1

COLLECTIVE_KINDS = ("all-reduce", "all-gather", "reduce-scatter", "all-to-all", "send-recv")
"""Kinds a profile prices; ``send-recv`` is a point-to-point transfer (``S / busbw``)."""


@dataclass(frozen=True)
class GemmPoint:
    """One measured GEMM: ``m × k`` by ``k × n`` in ``dtype``, ``flops_per_s`` reached."""

    m: int
    n: int
    k: int
    dtype: str
    flops_per_s: float


@dataclass(frozen=True)
class CollectiveFit:
    """A collective ``kind`` over ``group`` devices joined at network ``level``
    (0 = any group size): latency (s) and achieved bus bandwidth (bytes/s)."""

    kind: str
    level: str
    group: int
    latency: float
    bus_bandwidth: float


@dataclass(frozen=True)
class Overlap:
    """What the runtime overlaps (shares in [0, 1])."""

    gradient_sync: float = 0.0
    """Of the gradient all-reduce / reduce-scatter after the last micro-batch,
    the share hidden under the backward pass."""
    cross_mesh: float = 0.0
    """Of a pipeline's cross-mesh transfers, the share hidden under compute."""


@dataclass(frozen=True)
class DeviceProfile:
    """One device kind and its network as measured (module docstring)."""

    name: str
    device: str
    source: str
    peak_flops: tuple[tuple[str, float], ...]
    """Datasheet dense peak FLOP/s per dtype (``float16``, ``bfloat16``, ``float32``)."""
    gemm: tuple[GemmPoint, ...]
    memory_bandwidth: float
    launch_overhead: float
    collectives: tuple[CollectiveFit, ...]
    overlap: Overlap = field(default_factory=Overlap)
    sm_count: int = 0
    """Streaming multiprocessors (GPUs): a GEMM's output tiles run in waves of
    ``sm_count`` tiles of ``gemm_tile``, and a last partial wave costs a whole
    one (wave quantization, NVIDIA's *Matrix Multiplication Background*
    guide). 0: not modelled (the measured points carry it, e.g. on CPUs)."""
    gemm_tile: tuple[int, int] = (128, 128)
    """The output tile of one thread block (cuBLAS's common 128 × 128 tile):
    one SM's worth of work at the asymptotic GEMM throughput."""
    gemm_tiles: tuple[tuple[int, int], ...] = ()
    """Other output tiles the GEMM library picks from per problem (cuBLAS:
    256 × 128, 128 × 64, 64 × 64, ...). A GEMM runs with the tile (and split
    of ``k``) that takes least time; a tile smaller than ``gemm_tile`` packs
    several thread blocks on an SM and runs at most at the rate the L2 cache
    feeds it (``l2_bandwidth``). Empty: ``gemm_tile`` only."""
    l2_bandwidth: float = 0.0
    """Bytes/s the L2 cache serves to all SMs (a tile of ``tm × tn`` reads
    ``tm + tn`` elements per ``2·tm·tn`` FLOPs from it); 0: not modelled."""
    max_split_k: int = 1
    """The most slices a GEMM's ``k`` may be split into (split-K: more tiles
    for a skinny output; the fp32 partial sums go through memory); 1: none."""
    async_launch: bool = False
    """Kernels are queued ahead of the device (``launch_overhead``)."""
    transpose_bandwidth: tuple[tuple[float, float], ...] = ()
    """``(bytes, bytes/s)``: reading an array of ``bytes`` through a transpose
    that moves its minor dimension (module docstring); empty: at
    ``memory_bandwidth``."""
    solo_speedup: float = 1.0
    """One device alone against every device of its host busy (module docstring)."""
    version: int = VERSION

    def __post_init__(self) -> None:
        where = f"device profile '{self.name}'"
        if not self.gemm:
            raise AlpaError(f"{where}: needs at least one GEMM measurement")
        for p in self.gemm:
            if min(p.m, p.n, p.k) < 1 or not _positive(p.flops_per_s):
                raise AlpaError(f"{where}: GEMM point {p} must have positive sizes and FLOP/s")
        for what, value in (
            ("memory_bandwidth", self.memory_bandwidth),
            *((f"peak_flops[{d}]", v) for d, v in self.peak_flops),
        ):
            if not _positive(value):
                raise AlpaError(f"{where}: {what} must be positive, got {value}")
        if self.sm_count < 0 or any(
            len(t) != 2 or min(t) < 1 for t in (self.gemm_tile, *self.gemm_tiles)
        ):
            raise AlpaError(f"{where}: sm_count must be >= 0 and gemm_tile(s) two sizes >= 1 each")
        if self.max_split_k < 1 or not (
            math.isfinite(self.l2_bandwidth) and self.l2_bandwidth >= 0
        ):
            raise AlpaError(f"{where}: max_split_k must be >= 1 and l2_bandwidth >= 0")
        if not (math.isfinite(self.launch_overhead) and self.launch_overhead >= 0):
            raise AlpaError(f"{where}: launch_overhead must be >= 0 s, got {self.launch_overhead}")
        if not (math.isfinite(self.solo_speedup) and self.solo_speedup >= 1.0):
            raise AlpaError(f"{where}: solo_speedup must be >= 1, got {self.solo_speedup}")
        for size, rate in self.transpose_bandwidth:
            if not (_positive(size) and _positive(rate)):
                raise AlpaError(
                    f"{where}: transpose_bandwidth point ({size}, {rate}) must be positive"
                )
        for c in self.collectives:
            if c.kind not in COLLECTIVE_KINDS:
                raise AlpaError(
                    f"{where}: unknown collective kind '{c.kind}'; known: "
                    f"{', '.join(COLLECTIVE_KINDS)}"
                )
            if not _positive(c.bus_bandwidth) or not c.latency >= 0 or c.group < 0:
                raise AlpaError(f"{where}: collective {c} needs bandwidth > 0, latency >= 0")
        for what, share in (
            ("gradient_sync", self.overlap.gradient_sync),
            ("cross_mesh", self.overlap.cross_mesh),
        ):
            if not 0.0 <= share <= 1.0:
                raise AlpaError(f"{where}: overlap.{what} must be in [0, 1], got {share}")

    # -- queries --------------------------------------------------------------

    def peak(self, dtype: str) -> float:
        """The datasheet peak for ``dtype`` (else the largest listed: a dtype
        the datasheet does not name runs at most that fast)."""
        found = dict(self.peak_flops)
        return found.get(dtype, max(found.values()))

    def gemm_points(self, dtype: str) -> tuple[GemmPoint, ...]:
        """The measured GEMMs of ``dtype``, else of the dtype measured most."""
        same = tuple(p for p in self.gemm if p.dtype == dtype)
        if same:
            return same
        counts: dict[str, int] = {}
        for p in self.gemm:
            counts[p.dtype] = counts.get(p.dtype, 0) + 1
        best = max(counts, key=lambda d: counts[d])
        return tuple(p for p in self.gemm if p.dtype == best)

    def collective(self, kind: str, level: str, group: int) -> CollectiveFit | None:
        """The fit for ``kind`` over ``group`` devices at ``level``: the exact
        group size if measured, else the nearest measured size (in log scale),
        else the level's all-reduce fit (bus bandwidths of one link differ
        little between kinds); None when the level is not in the profile."""
        at_level = [c for c in self.collectives if c.level == level]
        for wanted in (kind, "all-reduce"):
            fits = [c for c in at_level if c.kind == wanted]
            if fits:
                return min(fits, key=lambda c: _group_distance(c.group, group))
        return None

    # -- files ------------------------------------------------------------------

    def to_json(self) -> dict[str, Any]:
        body = asdict(self)
        body["peak_flops"] = dict(self.peak_flops)
        return {"format": FORMAT, **body}

    def dumps(self) -> str:
        return json.dumps(self.to_json(), sort_keys=True, separators=(",", ":"))

    def save(self, path: str | os.PathLike[str]) -> Path:
        where = Path(path)
        where.write_text(json.dumps(self.to_json(), indent=1, sort_keys=True) + "\n")
        return where

    @staticmethod
    def from_json(data: Any, where: str = "device profile") -> DeviceProfile:
        if not isinstance(data, dict) or data.get("format") != FORMAT:
            raise AlpaError(f'{where}: not a device profile (no "format": "{FORMAT}")')
        if data.get("version") != VERSION:
            raise AlpaError(
                f"{where}: device profile version {data.get('version')!r} is not supported "
                f"(this alpa_ir reads version {VERSION}); run alpa-calibrate again"
            )
        try:
            return DeviceProfile(
                name=str(data["name"]),
                device=str(data["device"]),
                source=str(data["source"]),
                peak_flops=tuple(
                    (str(k), float(v)) for k, v in sorted(dict(data["peak_flops"]).items())
                ),
                gemm=tuple(GemmPoint(**p) for p in data["gemm"]),
                memory_bandwidth=float(data["memory_bandwidth"]),
                launch_overhead=float(data["launch_overhead"]),
                collectives=tuple(CollectiveFit(**c) for c in data["collectives"]),
                overlap=Overlap(**data.get("overlap", {})),
                sm_count=int(data.get("sm_count", 0)),
                gemm_tile=tuple(int(t) for t in data.get("gemm_tile", (128, 128))),  # type: ignore[arg-type]
                gemm_tiles=tuple((int(a), int(b)) for a, b in data.get("gemm_tiles", ())),
                l2_bandwidth=float(data.get("l2_bandwidth", 0.0)),
                max_split_k=int(data.get("max_split_k", 1)),
                async_launch=bool(data.get("async_launch", False)),
                solo_speedup=float(data.get("solo_speedup", 1.0)),
                transpose_bandwidth=tuple(
                    (float(b), float(r)) for b, r in data.get("transpose_bandwidth", ())
                ),
                version=VERSION,
            )
        except (KeyError, TypeError, ValueError) as err:
            raise AlpaError(f"{where}: malformed device profile: {err}") from None

    @staticmethod
    def loads(text: str, where: str = "device profile") -> DeviceProfile:
        try:
            data = json.loads(text)
        except json.JSONDecodeError as err:
            raise AlpaError(f"{where}: not JSON: {err}") from None
        return DeviceProfile.from_json(data, where)


def load_profile(path: str | os.PathLike[str]) -> DeviceProfile:
    """The profile in the JSON file ``path`` (one-line errors)."""
    where = Path(path)
    try:
        text = where.read_text()
    except OSError as err:
        raise AlpaError(f"device profile {where}: cannot read: {err.strerror or err}") from None
    return DeviceProfile.loads(text, f"device profile {where}")


def _positive(x: float) -> bool:
    return isinstance(x, (int, float)) and math.isfinite(x) and x > 0


def _group_distance(measured: int, wanted: int) -> float:
    if measured == 0:  # any group size: a fallback behind every exact one
        return 1e9
    return abs(math.log2(max(measured, 1)) - math.log2(max(wanted, 1)))


__all__ = [
    "COLLECTIVE_KINDS",
    "FORMAT",
    "VERSION",
    "CollectiveFit",
    "DeviceProfile",
    "GemmPoint",
    "Overlap",
    "load_profile",
]
