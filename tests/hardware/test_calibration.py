"""alpa-calibrate's library: the fits recover known figures from synthetic
points; a tiny sweep on the 8 CPU devices gives a profile that round-trips;
the command line writes a loadable profile and refuses bad output paths in
one line. No timing is asserted (the machine is shared)."""

from __future__ import annotations

import math
from pathlib import Path

import jax
import pytest

from alpa_ir.errors import AlpaError
from alpa_ir.hardware.calibration import CalibrationOptions, calibrate, plan_sweep
from alpa_ir.hardware.calibration_fits import (
    bus_factor,
    fit_bandwidth,
    fit_collective,
    fit_line,
    geometric_sizes,
    median,
    per_kernel_floor,
    transposed_read_rate,
)
from alpa_ir.hardware.calibration_sweeps import (
    Timing,
    collective_bytes,
    collective_program,
    time_program,
)
from alpa_ir.hardware.device_profile import DeviceProfile, load_profile
from alpa_ir.tools.alpa_calibrate import main

SIZES = (64e3, 1e6, 16e6, 256e6)


def test_bus_factors_are_nccls() -> None:
    assert bus_factor("all-reduce", 8) == pytest.approx(2 * 7 / 8)
    assert bus_factor("all-gather", 4) == pytest.approx(3 / 4)
    assert bus_factor("reduce-scatter", 2) == pytest.approx(1 / 2)
    assert bus_factor("all-to-all", 8) == pytest.approx(7 / 8)
    assert bus_factor("send-recv", 8) == 1.0
    with pytest.raises(AlpaError, match="unknown collective kind 'broadcast'"):
        bus_factor("broadcast", 2)


@pytest.mark.parametrize("kind", ["all-reduce", "all-gather", "all-to-all", "send-recv"])
@pytest.mark.parametrize("group", [2, 8])
def test_a_fit_recovers_a_known_latency_and_bus_bandwidth(kind: str, group: int) -> None:
    latency, busbw = 25e-6, 12e9
    factor = bus_factor(kind, group)
    # 2 % multiplicative noise, alternating, as timings scatter
    points = [
        (s, (latency + factor * s / busbw) * (1.02 if j % 2 else 0.98)) for j, s in enumerate(SIZES)
    ]
    fit = fit_collective(kind, "node", group, points)
    assert (fit.kind, fit.level, fit.group) == (kind, "node", group)
    assert fit.latency == pytest.approx(latency, rel=0.1)
    assert fit.bus_bandwidth == pytest.approx(busbw, rel=0.05)


def test_a_negative_intercept_is_clamped_and_the_slope_refitted() -> None:
    # the small message ran faster than the line says: the intercept would be < 0
    line = fit_line([(1e3, 1e-7), (1e6, 1e-3), (1e7, 1e-2)])
    assert line.intercept == 0.0
    assert line.slope == pytest.approx(1e-9, rel=0.05)


def test_points_must_span_two_sizes() -> None:
    with pytest.raises(AlpaError, match="at least two points"):
        fit_line([(1.0, 1.0)])
    with pytest.raises(AlpaError, match="two different sizes"):
        fit_line([(1.0, 1.0), (1.0, 2.0)])
    with pytest.raises(AlpaError, match="positive times"):
        fit_line([(1.0, 0.0), (2.0, 1.0)])


def test_a_transposed_read_is_what_the_kernel_took_beyond_streaming() -> None:
    # 1 MB read transposed at 0.5 GB/s, 1 MB streamed in and 1 MB out at 10 GB/s
    seconds = 1e6 / 0.5e9 + 2e6 / 10e9
    assert transposed_read_rate(1e6, seconds, 10e9) == pytest.approx((1e6, 0.5e9))
    # noise below streaming: never faster than a streamed read
    assert transposed_read_rate(1e6, 1e-6, 10e9) == pytest.approx((1e6, 10e9))
    with pytest.raises(AlpaError, match="needs positive bytes, seconds and bandwidth"):
        transposed_read_rate(1e6, 0.0, 10e9)


def test_memory_bandwidth_and_launch_floor() -> None:
    fit = fit_bandwidth([(b, 4e-6 + b / 20e9) for b in SIZES])
    assert fit.bandwidth == pytest.approx(20e9, rel=1e-6)
    assert fit.fixed == pytest.approx(4e-6, rel=1e-3)
    assert per_kernel_floor(10e-6, 10e-6 + 63 * 2e-6, 64) == pytest.approx(2e-6)
    assert per_kernel_floor(10e-6, 9e-6, 64) == 0.0  # noise: never negative
    assert median([3.0, 1.0, 2.0, 100.0, 2.5]) == 2.5
    assert geometric_sizes(64 * 1024, 16 * 1024 * 1024, 5) == tuple(
        64 * 1024 * 4**j for j in range(5)
    )


def test_a_collective_program_moves_what_it_says() -> None:
    devices = jax.devices()
    fn, (x,) = collective_program(devices, "all-gather", 4, 4096)
    out = fn(x)
    # the all-gather's S is its output per device: 4096 bytes of float32
    assert out.size * 4 == collective_bytes("all-gather", 4, 4096) * len(devices)
    fn, (x,) = collective_program(devices, "all-reduce", 2, 4096)
    assert float(fn(x)[0]) == pytest.approx(2 * 0.5)  # psum of 0.5 over 2
    assert time_program((fn, (x,)), Timing(warmup=1, repeats=2, min_repeats=1)) > 0
    by_cpu = Timing(warmup=1, repeats=2, min_repeats=1, clock="cpu")
    assert time_program((fn, (x,)), by_cpu) > 0
    with pytest.raises(AlpaError, match="clock must be one of wall, cpu, got 'sundial'"):
        Timing(clock="sundial")
    with pytest.raises(AlpaError, match="groups of 3 do not divide 8 devices"):
        collective_program(devices, "all-reduce", 3, 4096)


def test_the_sweep_is_resolved_per_platform() -> None:
    devices = jax.devices()
    full = plan_sweep(CalibrationOptions(), devices)
    assert full.platform == "cpu" and full.level == "device"  # local-cpu's level
    assert {g for _, g, _ in full.collectives} == {2, 4, 8}
    assert {k for k, _, _ in full.collectives} == {
        "all-reduce", "all-gather", "reduce-scatter", "all-to-all", "send-recv",
    }  # fmt: skip
    assert {dt for *_, dt in full.gemms} == {"float32"}
    assert any(min(m, n, k) <= 64 for m, n, k, _ in full.gemms)  # thin shapes
    quick = plan_sweep(CalibrationOptions(quick=True), devices)
    assert quick.steps < full.steps / 2
    with pytest.raises(AlpaError, match="groups of 3 do not divide the 8 devices"):
        plan_sweep(CalibrationOptions(groups=(3,)), devices)
    with pytest.raises(AlpaError, match="unknown collective kind 'gossip'"):
        CalibrationOptions(kinds=("gossip",))


def test_a_tiny_calibration_gives_a_profile_that_round_trips(tmp_path: Path) -> None:
    options = CalibrationOptions(
        timing=Timing(warmup=1, repeats=2, min_repeats=1),
        gemm_shapes=((64, 16, 32),),
        stream_bytes=(4096, 65536),
        collective_bytes=(4096, 65536),
        groups=(8,),
        kinds=("all-reduce", "send-recv"),
        chain=4,
        transpose_sides=(32,),
        transpose_total=4096,
        solo_side=64,
    )
    seen: list[int] = []
    profile = calibrate(options, progress=lambda done, label: seen.append(done))
    assert seen == list(range(1, 3 + 1 + 1 + 2 + 1 + 4 + 1))
    assert profile.solo_speedup >= 1.0
    ((size, rate),) = profile.transpose_bandwidth  # an array of 32 x 32 float32
    assert size == 32 * 32 * 4 and rate > 0
    assert [(p.m, p.n, p.k, p.dtype) for p in profile.gemm] == [(64, 16, 32, "float32")]
    assert all(p.flops_per_s > 0 for p in profile.gemm)
    assert profile.memory_bandwidth > 0 and profile.launch_overhead >= 0
    assert sorted((c.kind, c.group) for c in profile.collectives) == [
        ("all-reduce", 8), ("send-recv", 8),
    ]  # fmt: skip
    assert all(c.level == "device" and c.bus_bandwidth > 0 for c in profile.collectives)
    assert "8 cpu devices measured all at once" in profile.source
    assert dict(profile.peak_flops)["float32"] == max(p.flops_per_s for p in profile.gemm)
    path = profile.save(tmp_path / "p.json")
    assert load_profile(path) == profile
    assert DeviceProfile.loads(profile.dumps()) == profile


@pytest.mark.slow
def test_the_command_line_writes_a_loadable_profile(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "cpu.json"
    assert main(["--quick", "--quiet", "--repeats", "2", "--out", str(out)]) == 0
    profile = load_profile(out)
    assert profile.name == "calibrated-cpu" and len(profile.gemm) >= 3
    assert {c.kind for c in profile.collectives} == {
        "all-reduce", "all-gather", "reduce-scatter", "all-to-all", "send-recv",
    }  # fmt: skip
    assert all(math.isfinite(c.bus_bandwidth) for c in profile.collectives)


@pytest.mark.parametrize(
    ("out", "message"),
    [
        ("missing/p.json", "folder {tmp}/missing does not exist"),
        (".", "{tmp}: is a folder, not a file"),
    ],
)
def test_a_bad_output_path_is_one_line_before_measuring(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], out: str, message: str
) -> None:
    target = tmp_path / out if out != "." else tmp_path
    assert main(["--out", str(target)]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"alpa-calibrate: error: --out {target}: ")
    assert message.format(tmp=tmp_path) in err and err.count("\n") == 1
