"""``alpa-calibrate``'s library: measure the local devices, write a device profile.

:func:`calibrate` runs the sweeps of :class:`CalibrationOptions` on the devices
of one JAX platform (the programs and their timing:
:mod:`alpa_ir.hardware.calibration_sweeps`; the fits:
:mod:`alpa_ir.hardware.calibration_fits`) and returns a
:class:`~alpa_ir.hardware.device_profile.DeviceProfile`:

* **GEMMs** from square to thin shapes in the platform's dtypes (float32 on
  CPU; bfloat16, float16 and float32 on GPU), each device multiplying its own blocks
  while all the others do too; FLOP/s = ``2mnk / seconds``.
* **Memory bandwidth**: a streaming elementwise kernel at several sizes,
  bytes read + written per device over seconds (the slope of the fit).
* **Transposed reads**: a kernel reading ``n × n`` arrays through a
  transpose and streaming as many, at several sides ``n``: the transposed
  bytes over what the kernel took beyond streaming the rest, the rate of
  reading an ``n × n`` array transposed.
* **Sharing the host**: a GEMM on one device alone against the same GEMM
  on every device at once (``solo_speedup``: the CPU devices share the
  host's cores; each GPU computes on its own, ~1).
* **Launch overhead**: what one more tiny kernel adds inside a program (a
  chain of dependent tiny products against a single one).
* **Collectives**: every kind of the profile over groups of 2, 4, ... all
  devices (every group at once), at several sizes, fitted to
  ``latency + factor · S / busbw`` in NCCL's convention, at the network
  ``level`` the local devices form (the innermost level of the ``local-cpu``
  preset: one node).

Every time is a median after warmup, less the dispatch floor of a program
(a trivial program over the same devices): a step pays that once, not per
kernel. The profile's ``source`` says where, when and how it was measured.
``peak_flops``: the datasheet figure of a known GPU; else (CPU) the fastest
GEMM measured.
"""

from __future__ import annotations

import datetime
import os
import socket
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from alpa_ir.errors import AlpaError
from alpa_ir.hardware.calibration_fits import (
    fit_bandwidth,
    fit_collective,
    gemm_flops,
    geometric_sizes,
    per_kernel_floor,
    transposed_read_rate,
)
from alpa_ir.hardware.calibration_sweeps import (
    Timing,
    chain_program,
    collective_bytes,
    collective_program,
    gemm_program,
    stream_program,
    time_program,
    transpose_elements,
    transpose_program,
    trivial_program,
)
from alpa_ir.hardware.device_profile import (
    COLLECTIVE_KINDS,
    CollectiveFit,
    DeviceProfile,
    GemmPoint,
)

KB, MB = 1024, 1024 * 1024

CPU_GEMMS: tuple[tuple[int, int, int], ...] = (
    (128, 128, 128),
    (256, 256, 256),
    (512, 512, 512),
    (1024, 1024, 1024),
    (1024, 1024, 64),
    (1024, 64, 1024),
    (64, 1024, 1024),
    (2048, 256, 512),
    (2048, 512, 128),
    (256, 2048, 512),
    (4096, 128, 256),
    (512, 512, 2048),
)
"""CPU GEMM shapes ``(m, n, k)``: squares, then the thin ones tensor
parallelism makes (a side of 64 or 128), each under ~0.3 s on 8 CPU devices
sharing 2 cores."""

GPU_GEMMS: tuple[tuple[int, int, int], ...] = (
    (256, 256, 256),
    (1024, 1024, 1024),
    (2048, 2048, 2048),
    (4096, 4096, 4096),
    (8192, 8192, 8192),
    (4096, 4096, 64),
    (4096, 64, 4096),
    (64, 4096, 4096),
    (8192, 1024, 4096),
    (8192, 4096, 1024),
    (8192, 512, 8192),
    (16384, 128, 4096),
    (4096, 16384, 512),
)
"""GPU GEMM shapes: squares to 8192 and thin shapes down to a side of 64."""

TRANSPOSE_SIDES: tuple[int, ...] = (256, 512, 1024, 2048)
"""Sides of the transposed-read kernel's arrays: 256 KiB (in cache) to 16 MiB
(a 2048 × 2048 float32 weight gradient)."""

QUICK_GEMMS = 4
"""``--quick``: the first shapes of at most 512 (CPU) or 4096 (GPU) a side."""

DATASHEET_PEAKS: tuple[tuple[str, tuple[tuple[str, float], ...]], ...] = (
    # NVIDIA datasheets, dense tensor-core peaks (no sparsity); float32 at the
    # TF32 tensor-core peak where there is one (XLA's default f32 precision on GPU).
    ("H200", (("bfloat16", 989e12), ("float16", 989e12), ("float32", 494e12))),
    ("H100", (("bfloat16", 989e12), ("float16", 989e12), ("float32", 494e12))),
    ("A100", (("bfloat16", 312e12), ("float16", 312e12), ("float32", 156e12))),
    ("V100", (("float16", 125e12), ("float32", 15.7e12))),
)
"""Dense peak FLOP/s by a substring of the device kind (H100 SXM5, A100 and
V100 SXM2 datasheets; the H200 has the H100's compute)."""


@dataclass(frozen=True)
class CalibrationOptions:
    """What :func:`calibrate` measures. ``quick``: fewer shapes, sizes and
    groups (a smoke run in seconds, not a profile to plan with)."""

    quick: bool = False
    timing: Timing = field(default_factory=Timing)
    gemm_shapes: tuple[tuple[int, int, int], ...] | None = None
    """Default: :data:`CPU_GEMMS` or :data:`GPU_GEMMS` by platform."""
    dtypes: tuple[str, ...] | None = None
    """Default: ``float32`` on CPU; ``bfloat16``, ``float16`` and ``float32``
    (XLA's default precision: TF32 tensor cores) on GPU."""
    stream_bytes: tuple[int, ...] | None = None
    """Bytes per device of the streaming kernel's input."""
    transpose_sides: tuple[int, ...] | None = None
    """Sides ``n`` of the transposed-read kernel's ``n × n`` float32 arrays."""
    solo_side: int | None = None
    """Side of the square GEMM timed on one device alone and on all at once
    (default 1024; 256 with ``quick``)."""
    transpose_total: int = 2048 * 2048
    """Elements per device the transposed-read kernel reads transposed (a
    batch of ``n × n`` arrays), so that small sides take long enough to time."""
    collective_bytes: tuple[int, ...] | None = None
    """Tensor sizes ``S`` of the collectives."""
    groups: tuple[int, ...] | None = None
    """Group sizes; default every power of two from 2 to the device count."""
    kinds: tuple[str, ...] = COLLECTIVE_KINDS
    chain: int = 256
    """Tiny kernels in the launch-overhead program."""
    level: str | None = None
    """The network level of the fits; default the ``local-cpu`` preset's."""

    def __post_init__(self) -> None:
        bad = [k for k in self.kinds if k not in COLLECTIVE_KINDS]
        if bad:
            raise AlpaError(
                f"calibrate: unknown collective kind '{bad[0]}'; known: "
                f"{', '.join(COLLECTIVE_KINDS)}"
            )
        if self.chain < 2:
            raise AlpaError(f"calibrate: chain needs at least 2 kernels, got {self.chain}")


@dataclass(frozen=True)
class Sweep:
    """What :func:`calibrate` will measure on given devices, resolved."""

    platform: str
    gemms: tuple[tuple[int, int, int, str], ...]
    stream_bytes: tuple[int, ...]
    collectives: tuple[tuple[str, int, int], ...]
    """(kind, group, bytes S)."""
    level: str
    transpose_sides: tuple[int, ...] = ()
    transpose_total: int = 2048 * 2048
    solo_side: int = 1024

    @property
    def steps(self) -> int:
        """Measurements, for a progress bar: the floors, then each program."""
        return (
            3
            + len(self.gemms)
            + len(self.stream_bytes)
            + len(self.transpose_sides)
            + 1
            + len(self.collectives)
        )


def plan_sweep(options: CalibrationOptions, devices: Sequence[Any]) -> Sweep:
    """The measurements ``options`` asks for on ``devices`` (one platform)."""
    if not devices:
        raise AlpaError("calibrate: no devices to measure")
    platforms = {d.platform for d in devices}
    if len(platforms) != 1:
        raise AlpaError(f"calibrate: devices of several platforms {sorted(platforms)}")
    (platform,) = platforms
    gpu = platform in ("gpu", "cuda", "rocm")
    shapes = options.gemm_shapes or (GPU_GEMMS if gpu else CPU_GEMMS)
    if options.quick and options.gemm_shapes is None:
        limit = 4096 if gpu else 512
        shapes = tuple(s for s in shapes if max(s) <= limit)[:QUICK_GEMMS]
    dtypes = options.dtypes or (("bfloat16", "float16", "float32") if gpu else ("float32",))
    gemms = tuple((m, n, k, dt) for dt in dtypes for m, n, k in shapes)
    largest = 256 * MB if gpu else 16 * MB
    stream = options.stream_bytes or geometric_sizes(
        64 * KB, 4 * MB if options.quick else largest, 3 if options.quick else 5
    )
    sizes = options.collective_bytes or geometric_sizes(
        64 * KB, 4 * MB if options.quick else (256 * MB if gpu else 32 * MB),
        3 if options.quick else 4,
    )  # fmt: skip
    count = len(devices)
    groups = options.groups or tuple(g for g in (2, 4, 8, 16, 32, 64) if g <= count)
    if options.quick and options.groups is None:
        groups = tuple(g for g in groups if g in (2, count))
    bad = [g for g in groups if g < 2 or count % g]
    if bad:
        raise AlpaError(f"calibrate: groups of {bad[0]} do not divide the {count} devices")
    collectives = tuple((kind, g, s) for kind in options.kinds for g in groups for s in sizes)
    level = options.level or _local_level()
    sides = options.transpose_sides or ((256, 1024) if options.quick else TRANSPOSE_SIDES)
    solo = options.solo_side or (256 if options.quick else 1024)
    return Sweep(
        platform,
        gemms,
        tuple(stream),
        collectives,
        level,
        tuple(sides),
        options.transpose_total,
        solo,
    )


def _local_level() -> str:
    from alpa_ir.hardware.clusters import local_cpu

    return local_cpu().levels[-1].name


def calibrate(
    options: CalibrationOptions = CalibrationOptions(),
    devices: Sequence[Any] | None = None,
    progress: Callable[[int, str], None] | None = None,
) -> DeviceProfile:
    """Measure ``devices`` (default: every device of JAX's default backend) as
    ``options`` says and return their profile (module docstring).
    ``progress(done, label)`` is called after each measurement."""
    import jax

    devices = list(devices if devices is not None else jax.devices())
    sweep = plan_sweep(options, devices)
    timing = options.timing
    done = 0

    def tick(label: str) -> None:
        nonlocal done
        done += 1
        if progress is not None:
            progress(done, label)

    floor = time_program(trivial_program(devices), timing)
    tick("dispatch floor")

    def net(seconds: float) -> float:
        return max(seconds - floor, seconds * 0.05, 1e-9)

    single = time_program(chain_program(devices, 1), timing)
    tick("kernel chain 1")
    chained = time_program(chain_program(devices, options.chain), timing)
    tick(f"kernel chain {options.chain}")
    launch = per_kernel_floor(single, chained, options.chain)

    gemm: list[GemmPoint] = []
    for m, n, k, dtype in sweep.gemms:
        seconds = net(time_program(gemm_program(devices, m, n, k, dtype), timing))
        gemm.append(GemmPoint(m, n, k, dtype, gemm_flops(m, n, k) / seconds))
        tick(f"GEMM {m}x{n}x{k} {dtype}")

    side = sweep.solo_side
    together = net(time_program(gemm_program(devices, side, side, side, "float32"), timing))
    alone = net(time_program(gemm_program(devices[:1], side, side, side, "float32"), timing))
    solo_speedup = max(together / alone, 1.0)
    tick(f"GEMM {side}^3 on one device alone")

    stream: list[tuple[float, float]] = []
    for nbytes in sweep.stream_bytes:
        elements = max(nbytes // 4, 1)
        seconds = net(time_program(stream_program(devices, elements), timing))
        stream.append((2.0 * elements * 4, seconds))
        tick(f"stream {nbytes // KB} KiB")
    bandwidth = fit_bandwidth(stream)

    transposed: list[tuple[float, float]] = []
    for side in sweep.transpose_sides:
        total = sweep.transpose_total
        seconds = net(time_program(transpose_program(devices, side, total), timing))
        read = transpose_elements(side, total) * 4
        rate = transposed_read_rate(read, seconds, bandwidth.bandwidth)
        transposed.append((float(side * side * 4), rate[1]))
        tick(f"transposed read {side}x{side}")

    points: dict[tuple[str, int], list[tuple[float, float]]] = {}
    for kind, group, nbytes in sweep.collectives:
        seconds = net(time_program(collective_program(devices, kind, group, nbytes), timing))
        points.setdefault((kind, group), []).append(
            (float(collective_bytes(kind, group, nbytes)), seconds)
        )
        tick(f"{kind} over {group}, {nbytes // KB} KiB")
    collectives: list[CollectiveFit] = [
        fit_collective(kind, sweep.level, group, pts) for (kind, group), pts in points.items()
    ]

    kind_name = str(getattr(devices[0], "device_kind", sweep.platform))
    return DeviceProfile(
        name=f"calibrated-{sweep.platform}",
        device=kind_name,
        source=_source(sweep, len(devices), timing, floor, datasheet_peaks(kind_name) is not None),
        peak_flops=_peaks(kind_name, gemm),
        gemm=tuple(gemm),
        memory_bandwidth=bandwidth.bandwidth,
        launch_overhead=launch,
        collectives=tuple(collectives),
        transpose_bandwidth=tuple(transposed),
        solo_speedup=solo_speedup,
    )


def datasheet_peaks(kind: str) -> tuple[tuple[str, float], ...] | None:
    """The datasheet peaks of a device kind (``NVIDIA H100 80GB HBM3``), if known."""
    for key, peaks in DATASHEET_PEAKS:
        if key.lower() in kind.lower():
            return peaks
    return None


def _peaks(kind: str, gemm: Sequence[GemmPoint]) -> tuple[tuple[str, float], ...]:
    found = datasheet_peaks(kind)
    if found is not None:
        return found
    best: dict[str, float] = {}
    for p in gemm:
        best[p.dtype] = max(best.get(p.dtype, 0.0), p.flops_per_s)
    return tuple(sorted(best.items()))


def _source(sweep: Sweep, count: int, timing: Timing, floor: float, datasheet: bool) -> str:
    when = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC")
    cores = os.cpu_count() or 0
    clock = (
        "wall-clock seconds"
        if timing.clock == "wall"
        else f"CPU seconds of the process over its {cores} cores (the wall time less others' load)"
    )
    shared = f", the {count} devices sharing {cores} CPU cores" if sweep.platform == "cpu" else ""
    return (
        f"alpa-calibrate on {socket.gethostname()} at {when}: {count} {sweep.platform} devices "
        f"measured all at once (one SPMD program over every device, each on its own "
        f"block{shared}); {clock}; median of up to {timing.repeats} calls after {timing.warmup} "
        f"warmup, less the {floor * 1e6:.0f} us dispatch floor of a program; peak_flops: "
        + ("the datasheet's" if datasheet else "the fastest GEMM measured per dtype")
    )


__all__ = [
    "CPU_GEMMS",
    "DATASHEET_PEAKS",
    "GPU_GEMMS",
    "TRANSPOSE_SIDES",
    "CalibrationOptions",
    "Sweep",
    "calibrate",
    "datasheet_peaks",
    "plan_sweep",
]
