"""The device model: seconds of compute and memory traffic from a device profile.

One price list (:class:`~alpa_ir.hardware.device_profile.DeviceProfile`) for
every planner decision: the analytical stage cost, the pipeline simulator's
apply-grad and the baselines all price a function's kernels here.

* **GEMMs** (``dot_general``, convolutions as implicit GEMMs): a roofline,
  ``max(FLOPs / P, bytes / B)``, ``P`` the throughput the profile's large
  GEMMs reach and ``B`` its memory bandwidth, times the measured efficiency of
  thin shapes: the profile's GEMM points give, as a function of the smallest of
  ``m, n, k`` (log scale, interpolated), how far below that roofline a
  measured GEMM fell (tile and wave quantization: a ``(2048, 12288) ×
  (12288, 128)`` product, a Megatron layer's last matmul on 8-way tensor
  parallelism, runs far below the square one). The tiles: the profile's
  output tiles and splits of ``k`` (split-K), the one that takes least time
  (cuBLAS picks a kernel per problem), each charged its wave quantization.
  Plus the launch floor.
* **Memory-bound kernels** (everything XLA fuses: elementwise chains,
  reductions, layout changes, gathers): the bytes the fusion model says they
  read and write (:mod:`alpa_ir.costs.fusion`) at the achieved bandwidth, plus
  the launch floor per kernel. A read through a transpose that moves the
  minor dimension (XLA fuses it into each consumer: on CPUs, an Adam moment
  update of a weight gradient the backward produced transposed) is priced at
  the profile's measured transposed-read rate for that array's size instead.

The two are summed: kernels of one stream run one after another. The launch
floor adds to every kernel where the host runs kernels one after another (the
CPU devices); where the host queues them ahead of the device (``async_launch``,
GPUs) a kernel costs the longer of its run and the floor, so that only kernels
shorter than the floor pay it (their shortfall).
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Callable
from dataclasses import dataclass, field

from xdsl.ir import Block, Operation, SSAValue

from alpa_ir.costs.flops import op_bytes, op_flops
from alpa_ir.costs.fusion import (
    BlockFusion,
    fused_traffic_bytes,
    is_identity,
    traffic_by_kernel,
    transposed_reads,
)
from alpa_ir.dialects.lax import LaxOp
from alpa_ir.dialects.lax_primitives import OpKind
from alpa_ir.dialects.types import dtype_of
from alpa_ir.hardware.device_profile import DeviceProfile, GemmPoint

MATMUL_PRIMITIVES = frozenset({"dot_general", "conv_general_dilated"})
"""Ops priced as GEMMs."""

MIN_SPLIT_K_SLICE = 256
"""The shortest slice of ``k`` a split-K GEMM gives a tile (8 of the 32-deep
k-steps of cuBLAS's Volta tensor-core kernels, so that a slice's prologue and
epilogue stay small against its main loop)."""


@dataclass(frozen=True)
class KernelTimes:
    """A function's kernels priced: GEMM time, memory-bound time, and what the
    launch floor adds to the memory-bound kernels (all of it, or with
    ``async_launch`` the short kernels' shortfall)."""

    gemm: float
    memory: float
    launches: float
    kernels: int


@dataclass(frozen=True)
class DeviceModel:
    """Prices of one profile (module docstring)."""

    profile: DeviceProfile
    _curves: dict[str, tuple[float, tuple[float, ...], tuple[float, ...]]] = field(
        default_factory=dict, init=False, repr=False, compare=False, hash=False
    )
    _gemms: dict[tuple[int, int, int, str, int], float] = field(
        default_factory=dict, init=False, repr=False, compare=False, hash=False
    )

    # -- GEMMs ----------------------------------------------------------------

    def gemm_time(self, m: int, n: int, k: int, dtype: str, batch: int = 1) -> float:
        """Seconds of ``batch`` GEMMs ``(m × k) · (k × n)`` in ``dtype``, launch included."""
        if min(m, n, k, batch) <= 0:
            return 0.0
        key = (m, n, k, dtype, batch)
        found = self._gemms.get(key)
        if found is None:  # the same shapes recur in every layer and plan
            throughput, dims, ratios = self._curve(dtype)
            efficiency = _interpolate(math.log2(min(m, n, k)), dims, ratios)
            run = self._roof(m, n, k, dtype, batch, throughput) / efficiency
            found = self._gemms[key] = self.kernel_time(run)
        return found

    def kernel_time(self, run: float) -> float:
        """Seconds a kernel that runs ``run`` seconds costs in its stream: the
        launch floor added (launches one after another), or the longer of the
        two (``async_launch``: queued ahead of the device)."""
        launch = self.profile.launch_overhead
        return max(run, launch) if self.profile.async_launch else run + launch

    def _roof(self, m: int, n: int, k: int, dtype: str, batch: int, throughput: float) -> float:
        """The roofline of a GEMM: its FLOPs at ``throughput`` over the tiles
        it really fills (wave quantization, where the profile has SMs; the
        best of the profile's tiles and splits of ``k``), or its operands and
        result at the memory bandwidth, whichever takes longer."""
        moved = batch * _itemsize(dtype) * (m * k + k * n + m * n)
        return max(
            self._tiled_time(m, n, k, dtype, batch, throughput),
            moved / self.profile.memory_bandwidth,
        )

    def _tiled_time(
        self, m: int, n: int, k: int, dtype: str, batch: int, throughput: float
    ) -> float:
        """The compute time of the fastest tiling: ``gemm_tile`` at
        ``throughput``, each of ``gemm_tiles`` at the rate the L2 cache feeds
        it (capped at ``throughput``), each with ``k`` whole or split in 2, 4,
        ... up to ``max_split_k`` slices of at least ``MIN_SPLIT_K_SLICE``
        (split-K: ``split`` times the tiles; the fp32 partial sums written and
        read back once by a reduction at the memory bandwidth)."""
        flops = 2.0 * batch * m * n * k
        main = self.profile.gemm_tile
        best = flops / (throughput * self.wave_efficiency(m, n, batch))
        if not self.profile.sm_count:
            return best
        tiles = [main]
        if self.profile.l2_bandwidth > 0:
            tiles += [t for t in self.profile.gemm_tiles if t != main]
        splits = [1]
        while splits[-1] * 2 <= self.profile.max_split_k and (
            k // (splits[-1] * 2) >= MIN_SPLIT_K_SLICE
        ):
            splits.append(splits[-1] * 2)
        for tile in tiles:
            rate = throughput if tile == main else self.tile_rate(tile, dtype, throughput)
            for split in splits:
                if tile == main and split == 1:
                    continue
                partials = (
                    2.0 * split * batch * m * n * 4 / self.profile.memory_bandwidth
                    if split > 1
                    else 0.0
                )
                busy = flops / (rate * self.wave_efficiency(m, n, batch * split, tile))
                best = min(best, busy + partials)
        return best

    def tile_rate(self, tile: tuple[int, int], dtype: str, throughput: float) -> float:
        """FLOP/s of a ``tm × tn`` output tile: it reads ``tm + tn`` elements
        from the L2 cache per ``2·tm·tn`` FLOPs, so it runs at most at
        ``l2_bandwidth × 2·tm·tn / (itemsize·(tm + tn))`` (small tiles reuse
        less: NVIDIA's *Matrix Multiplication Background* guide, "larger tiles
        have more data reuse"), and at most at ``throughput``."""
        tm, tn = tile
        fed = self.profile.l2_bandwidth * 2.0 * tm * tn / (_itemsize(dtype) * (tm + tn))
        return min(throughput, fed) if fed > 0 else throughput

    def wave_efficiency(
        self, m: int, n: int, batch: int = 1, tile: tuple[int, int] | None = None
    ) -> float:
        """The share of the tiles' work that is the GEMM's own: output tiles
        (``gemm_tile`` unless ``tile``) run ``sm_count`` at a time, a partial
        tile or a partial last wave costs a whole one (1.0 where the profile
        has no SM count). A tile smaller than ``gemm_tile`` packs
        ``gemm_tile``'s area over its own thread blocks on an SM (one SM's
        worth of work per wave stays the same)."""
        sms = self.profile.sm_count
        if not sms:
            return 1.0
        tm, tn = tile or self.profile.gemm_tile
        big_m, big_n = self.profile.gemm_tile
        per_sm = max(1, (big_m * big_n) // (tm * tn))
        tiles = math.ceil(m / tm) * math.ceil(n / tn) * batch
        waves = math.ceil(tiles / (sms * per_sm))
        return (m * n * batch) / (waves * sms * per_sm * tm * tn)

    def _curve(self, dtype: str) -> tuple[float, tuple[float, ...], tuple[float, ...]]:
        """``dtype``'s GEMM throughput on whole waves and the measured
        efficiency (roofline / measured) against log2 of the smallest dimension."""
        found = self._curves.get(dtype)
        if found is not None:
            return found
        points = self.profile.gemm_points(dtype)
        throughput = max(
            _rate_without_launch(p, self.profile.launch_overhead) / self.wave_efficiency(p.m, p.n)
            for p in points
        )
        by_dim: dict[float, list[float]] = {}
        for p in points:
            roof = self._roof(p.m, p.n, p.k, p.dtype, 1, throughput)
            measured = 2.0 * p.m * p.n * p.k / p.flops_per_s - self.profile.launch_overhead
            ratio = 1.0 if measured <= 0 else min(max(roof / measured, 1e-3), 1.0)
            by_dim.setdefault(math.log2(min(p.m, p.n, p.k)), []).append(ratio)
        dims = tuple(sorted(by_dim))
        ratios = tuple(_median(by_dim[d]) for d in dims)
        found = (throughput, dims, ratios)
        self._curves[dtype] = found
        return found

    def op_gemm_time(self, op: LaxOp, shapes: Callable[[SSAValue], tuple[int, ...]]) -> float:
        """A ``dot_general`` or convolution on its local shapes, as ``batch``
        GEMMs of the shape its FLOPs and operand sizes imply."""
        dtype = _dtype_name_of_op(op)
        flops = op_flops(op, shapes)
        if op.primitive_name == "dot_general":
            lhs, rhs = shapes(op.operands[0]), shapes(op.operands[1])
            (lc, rc), (lb, _rb) = op.param("dimension_numbers")
            batch = math.prod(lhs[d] for d in lb)
            k = math.prod(lhs[d] for d in lc)
            m = math.prod(s for d, s in enumerate(lhs) if d not in lc and d not in lb)
            n = math.prod(s for d, s in enumerate(rhs) if d not in rc and d not in _rb)
            return self.gemm_time(m, n, k, dtype, batch)
        # a convolution as an implicit GEMM: m = output positions × batch,
        # n = output features, k = FLOPs / (2 m n)
        out = shapes(op.results[0])
        rhs = shapes(op.operands[1])
        features = rhs[op.param("dimension_numbers").rhs_spec[0]]
        m = max(math.prod(out) // max(features, 1), 1)
        k = max(round(flops / (2.0 * m * max(features, 1))), 1)
        return self.gemm_time(m, features, k, dtype)

    # -- strided reads ------------------------------------------------------------

    def transposed_read_time(self, nbytes: float) -> float:
        """The seconds a read of ``nbytes`` through a transpose costs beyond the
        same read streamed: the profile's transposed-read rate interpolated at
        that size (log scale, clamped to the measured sizes); 0 without one."""
        points = sorted(self.profile.transpose_bandwidth)
        if not points or nbytes <= 0:
            return 0.0
        sizes = tuple(math.log2(b) for b, _ in points)
        per_byte = tuple(1.0 / r for _, r in points)
        slow = _interpolate(math.log2(nbytes), sizes, per_byte)
        return max(slow - 1.0 / self.profile.memory_bandwidth, 0.0) * nbytes

    # -- a function -------------------------------------------------------------

    def block_times(
        self,
        block: Block,
        shapes: Callable[[SSAValue], tuple[int, ...]],
        fusion: BlockFusion | None = None,
        *,
        fused: bool = True,
    ) -> KernelTimes:
        """The kernels of ``block`` on local ``shapes``: its top-level ops (an
        op with a body, a loop or a branch, is priced as its FLOPs at the GEMM
        throughput, one kernel). ``fusion``: the block's fusion decisions, if
        made already; ``fused=False``: every op reads and writes memory (no
        fusion, the upper bound)."""
        fusion = fusion or BlockFusion(block)
        gemm = 0.0
        gemm_bytes = 0.0
        kernels: dict[Operation, float] = {}  # the other kernels: their compute seconds
        for op in fusion.ops:
            if isinstance(op, LaxOp) and op.primitive_name in MATMUL_PRIMITIVES:
                gemm += self.op_gemm_time(op, shapes)
                gemm_bytes += op_bytes(op, shapes)
            elif op.regions and any(r.blocks for r in op.regions):
                body = op_flops(op, shapes) / self._curve(_dtype_name_of_op(op))[0]
                gemm += body
                kernels[op] = body
            elif _materializes(op, fusion):
                kernels[op] = 0.0
        floor = self.profile.launch_overhead
        if self.profile.async_launch and floor > 0:
            # each kernel pays only what its run falls short of the floor
            by_kernel = (
                traffic_by_kernel(block, shapes, fusion)
                if fused
                else {op: op_bytes(op, shapes) for op in fusion.ops if isinstance(op, LaxOp)}
            )
            total = sum(by_kernel.values())
            bandwidth = self.profile.memory_bandwidth
            launches = sum(
                max(floor - busy - by_kernel.get(op, 0.0) / bandwidth, 0.0)
                for op, busy in kernels.items()
            )
        else:
            total = (
                fused_traffic_bytes(block, shapes, fusion)
                if fused
                else sum(op_bytes(op, shapes) for op in fusion.ops if isinstance(op, LaxOp))
            )
            launches = len(kernels) * floor
        traffic = max(total - gemm_bytes, 0.0)
        strided = (
            sum(self.transposed_read_time(b) for b in transposed_reads(block, shapes, fusion))
            if fused and self.profile.transpose_bandwidth
            else 0.0
        )
        return KernelTimes(
            gemm=gemm,
            memory=traffic / self.profile.memory_bandwidth + strided,
            launches=launches,
            kernels=len(kernels),
        )


def nominal_profile(
    peak_flops: float, hbm_bandwidth: float, compute_efficiency: float, memory_efficiency: float
) -> DeviceProfile:
    """The prices of a cluster without a measured profile: every GEMM at
    ``compute_efficiency`` of the peak, memory traffic at ``memory_efficiency``
    of the bandwidth (none where it is unknown, 0), no launch floor, no
    quantization: the constant-efficiency model the planner had before
    device profiles."""
    bandwidth = hbm_bandwidth * memory_efficiency if hbm_bandwidth > 0 else math.inf
    return DeviceProfile(
        name="nominal",
        device="",
        source="nominal: datasheet peak and bandwidth at constant efficiencies",
        peak_flops=(("float32", peak_flops),),
        gemm=(GemmPoint(1 << 20, 1 << 20, 1 << 20, "float32", peak_flops * compute_efficiency),),
        memory_bandwidth=bandwidth if math.isfinite(bandwidth) else 1e300,
        launch_overhead=0.0,
        collectives=(),
    )


def _materializes(op: Operation, fusion: BlockFusion) -> bool:
    """Does ``op`` end a kernel (writes a materialized value)? Markers,
    constants and collectives (priced as communication) are not kernels here."""
    if is_identity(op) or not isinstance(op, LaxOp):
        return False
    if op.kind in (OpKind.MARKER,) or op.primitive_name == "constant":
        return False
    return any(r in fusion.materialized for r in op.results)


def _rate_without_launch(point: GemmPoint, launch: float) -> float:
    """The FLOP/s a measured GEMM reached once its launch floor is taken off."""
    flops = 2.0 * point.m * point.n * point.k
    busy = flops / point.flops_per_s - launch
    return flops / busy if busy > 0 else point.flops_per_s


def _interpolate(x: float, xs: tuple[float, ...], ys: tuple[float, ...]) -> float:
    if x <= xs[0]:
        return ys[0]
    if x >= xs[-1]:
        return ys[-1]
    i = bisect.bisect_right(xs, x)
    t = (x - xs[i - 1]) / (xs[i] - xs[i - 1])
    return ys[i - 1] + t * (ys[i] - ys[i - 1])


def _median(values: list[float]) -> float:
    ordered = sorted(values)
    mid = len(ordered) // 2
    return ordered[mid] if len(ordered) % 2 else 0.5 * (ordered[mid - 1] + ordered[mid])


def _itemsize(dtype: str) -> int:
    """Bytes per element of the dtype named ``dtype`` (4 for a name JAX does not know)."""
    import jax.numpy as jnp

    try:
        return int(jnp.dtype(dtype).itemsize)
    except TypeError:
        return 4


def _dtype_name(value: SSAValue) -> str | None:
    try:
        return str(dtype_of(value.type))
    except Exception:  # a non-tensor value (a token)
        return None


def _dtype_name_of_op(op: Operation) -> str:
    """The dtype of ``op``'s first tensor operand or result (float32 without one)."""
    names = (_dtype_name(v) for v in (*op.operands, *op.results))
    return next((n for n in names if n is not None), "float32")


__all__ = ["MATMUL_PRIMITIVES", "DeviceModel", "KernelTimes", "nominal_profile"]
