"""alpa-calibrate: measure the local devices and write their device profile.

Runs the microbenchmarks of :mod:`alpa_ir.hardware.calibration` on every
device of JAX's default backend (the 8 CPU devices of
``XLA_FLAGS=--xla_force_host_platform_device_count=8`` here; the GPUs on a
GPU host): GEMMs from square to thin in the platform's dtypes, a streaming
kernel for memory bandwidth, a chain of tiny kernels for the launch floor,
a kernel reading arrays through a transpose at several sizes, one device's
GEMM alone against every device's at once (how much the devices share the
host's cores), and every collective over groups of 2, 4, ... devices at several sizes. The
profile is written as JSON (``--out``), loadable with
:func:`alpa_ir.hardware.device_profile.load_profile`; ``tools/bench_local_clock.py``
holds the planner's predictions made with it against measured step times.

Usage: ``alpa-calibrate [--out FILE] [--quick] [--repeats N] [--quiet]``.
About 80 s on the 8 CPU devices of a 2-core machine; ``--quick`` in ~10 s
(fewer shapes and sizes: a smoke run, not a profile to plan with).
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

from alpa_ir.errors import AlpaError
from alpa_ir.tools.cli_args import OneLineParser, positive_int

PROG = "alpa-calibrate"


def build_parser() -> OneLineParser:
    parser = OneLineParser(
        prog=PROG,
        description="Measure the local devices (GEMMs, memory bandwidth, launch floor, "
        "transposed reads, shared cores, collectives) and write a device profile (JSON) "
        "the planner reads.",
    )
    parser.add_argument(
        "--out", default="device_profile.json", help="where to write the profile (JSON)"
    )
    parser.add_argument(
        "--quick", action="store_true", help="fewer shapes and sizes (a smoke run, ~10 s)"
    )
    parser.add_argument(
        "--repeats", type=positive_int, default=5, help="timed calls per measurement (median)"
    )
    parser.add_argument(
        "--warmup", type=positive_int, default=1, help="untimed calls before (compilation)"
    )
    parser.add_argument(
        "--clock",
        choices=("wall", "cpu"),
        default="wall",
        help="time calls by the wall clock, or by this process's CPU seconds over the "
        "machine's cores (a machine shared with other work)",
    )
    parser.add_argument("--quiet", action="store_true", help="no progress bar, no summary")
    return parser


def check_output(path: Path) -> None:
    """One-line error unless a file can be written at ``path`` (before measuring)."""
    if path.is_dir():
        raise AlpaError(f"--out {path}: is a folder, not a file")
    folder = path.parent if str(path.parent) else Path(".")
    if not folder.is_dir():
        raise AlpaError(f"--out {path}: folder {folder} does not exist")
    if not os.access(folder, os.W_OK) or (path.exists() and not os.access(path, os.W_OK)):
        raise AlpaError(f"--out {path}: not writable")


CPU_DEVICES = 8
"""CPU devices the host platform is split into unless ``XLA_FLAGS`` says
(as the tests and the other tools run)."""


def run(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    out = Path(args.out)
    check_output(out)
    flags = os.environ.get("XLA_FLAGS", "")
    if "xla_force_host_platform_device_count" not in flags:  # before JAX starts
        count = f"--xla_force_host_platform_device_count={CPU_DEVICES}"
        os.environ["XLA_FLAGS"] = f"{flags} {count}".strip()
    from alpa_ir.hardware.calibration import CalibrationOptions, calibrate, plan_sweep
    from alpa_ir.hardware.calibration_sweeps import Timing
    from alpa_ir.passmanager.progress import ProgressBar

    repeats = args.repeats
    timing = Timing(
        warmup=args.warmup, repeats=repeats, min_repeats=min(3, repeats), clock=args.clock
    )
    options = CalibrationOptions(quick=args.quick, timing=timing)
    import jax

    devices = jax.devices()
    sweep = plan_sweep(options, devices)
    start = time.perf_counter()
    with ProgressBar(
        f"calibrating {len(devices)} {sweep.platform} devices", sweep.steps, enabled=not args.quiet
    ) as bar:
        profile = calibrate(options, devices, lambda done, label: bar.update(done, label))
    try:
        profile.save(out)
    except OSError as err:
        raise AlpaError(f"--out {out}: cannot write: {err.strerror or err}") from None
    if not args.quiet:
        print(summary(profile, time.perf_counter() - start, out))
    return 0


def summary(profile: object, seconds: float, out: Path) -> str:
    """A few lines: where the profile went and its headline figures."""
    from alpa_ir.hardware.device_profile import DeviceProfile

    assert isinstance(profile, DeviceProfile)
    best = max(profile.gemm, key=lambda p: p.flops_per_s)
    lines = [
        f"{PROG}: wrote {out} in {seconds:.0f} s ({profile.name}, {profile.device})",
        f"  GEMM: {len(profile.gemm)} shapes, best {best.flops_per_s / 1e9:.1f} GFLOP/s "
        f"per device ({best.m}x{best.n}x{best.k} {best.dtype})",
        f"  memory bandwidth {profile.memory_bandwidth / 1e9:.2f} GB/s per device, "
        f"launch floor {profile.launch_overhead * 1e6:.1f} us",
        f"  one device alone {profile.solo_speedup:.2f}x faster than all at once; "
        + (
            "transposed reads "
            + ", ".join(
                f"{r / 1e9:.2f} GB/s at {b / 2**20:g} MiB" for b, r in profile.transpose_bandwidth
            )
            if profile.transpose_bandwidth
            else "no transposed reads measured"
        ),
    ]
    for c in profile.collectives:
        lines.append(
            f"  {c.kind:>14} over {c.group}: latency {c.latency * 1e6:7.1f} us, "
            f"bus bandwidth {c.bus_bandwidth / 1e9:6.2f} GB/s"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    try:
        return run(argv)
    except AlpaError as err:
        print(f"{PROG}: error: {err}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
