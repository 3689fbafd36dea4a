"""Device profiles (alpa_ir.hardware.device_profile) and the device model's
prices (alpa_ir.costs.device_model)."""

from __future__ import annotations

import json
import math
from dataclasses import replace
from pathlib import Path

import pytest

from alpa_ir.costs.device_model import DeviceModel, nominal_profile
from alpa_ir.errors import AlpaError
from alpa_ir.hardware.builtin_profiles import builtin_profiles, v100_sxm2_aws
from alpa_ir.hardware.clusters import Cluster, get_cluster
from alpa_ir.hardware.device_profile import (
    CollectiveFit,
    DeviceProfile,
    GemmPoint,
    load_profile,
)


def _profile(**changes: object) -> DeviceProfile:
    base = DeviceProfile(
        name="test",
        device="test-device",
        source="made in the test",
        peak_flops=(("float32", 100e9),),
        gemm=(
            GemmPoint(1024, 1024, 1024, "float32", 50e9),
            GemmPoint(1024, 1024, 64, "float32", 10e9),
        ),
        memory_bandwidth=10e9,
        launch_overhead=1e-5,
        collectives=(CollectiveFit("all-reduce", "device", 0, 2e-5, 5e9),),
    )
    return replace(base, **changes)  # type: ignore[arg-type]


def test_a_profile_round_trips_through_json(tmp_path: Path) -> None:
    for profile in (_profile(), *builtin_profiles().values()):
        path = profile.save(tmp_path / f"{profile.name}.json")
        assert load_profile(path) == profile
        assert DeviceProfile.loads(profile.dumps()) == profile


def test_a_profiles_transposed_read_rates_round_trip(tmp_path: Path) -> None:
    profile = _profile(transpose_bandwidth=((262144.0, 5e9), (16777216.0, 1e9)), solo_speedup=7.5)
    assert load_profile(profile.save(tmp_path / "t.json")) == profile


def test_reads_through_a_transpose_cost_the_measured_rate_beyond_streaming() -> None:
    """Rates measured at 256 KiB (5 GB/s) and 16 MiB (1 GB/s), streaming at
    10 GB/s: a read pays its bytes at the rate of its size, less the streamed
    read already counted; interpolated in log size, clamped outside."""
    small, large = 262144.0, 16777216.0
    model = DeviceModel(_profile(transpose_bandwidth=((small, 5e9), (large, 1e9))))
    assert model.transposed_read_time(small) == pytest.approx(small * (1 / 5e9 - 1 / 10e9))
    assert model.transposed_read_time(large) == pytest.approx(large * (1 / 1e9 - 1 / 10e9))
    assert model.transposed_read_time(4 * large) == pytest.approx(4 * large * (1 / 1e9 - 1 / 10e9))
    middle = math.sqrt(small * large)  # halfway in log size: halfway in seconds per byte
    per_byte = 0.5 * (1 / 5e9 + 1 / 1e9) - 1 / 10e9
    assert model.transposed_read_time(middle) == pytest.approx(middle * per_byte)
    assert DeviceModel(_profile()).transposed_read_time(large) == 0.0  # no rates: streamed
    fast = DeviceModel(_profile(transpose_bandwidth=((small, 20e9),)))
    assert fast.transposed_read_time(small) == 0.0  # never cheaper than streaming


def test_a_profile_of_another_version_is_refused_in_one_line(tmp_path: Path) -> None:
    data = _profile().to_json()
    data["version"] = 99
    path = tmp_path / "p.json"
    path.write_text(json.dumps(data))
    with pytest.raises(AlpaError, match="version 99 is not supported") as err:
        load_profile(path)
    assert "\n" not in str(err.value)
    path.write_text("{not json")
    with pytest.raises(AlpaError, match="not JSON"):
        load_profile(path)
    with pytest.raises(AlpaError, match="cannot read"):
        load_profile(tmp_path / "missing.json")
    with pytest.raises(AlpaError, match="not a device profile"):
        DeviceProfile.loads("{}")


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"gemm": ()}, "at least one GEMM"),
        ({"memory_bandwidth": 0.0}, "memory_bandwidth must be positive"),
        ({"launch_overhead": -1.0}, "launch_overhead"),
        ({"collectives": (CollectiveFit("broadcast", "x", 0, 0.0, 1.0),)}, "unknown collective"),
        ({"sm_count": -1}, "sm_count"),
        ({"transpose_bandwidth": ((1024.0, 0.0),)}, "transpose_bandwidth point"),
        ({"solo_speedup": 0.5}, "solo_speedup must be >= 1"),
    ],
)
def test_bad_profiles_are_refused(changes: dict[str, object], message: str) -> None:
    with pytest.raises(AlpaError, match=message):
        _profile(**changes)


def test_a_gemm_costs_its_measured_time_at_the_measured_shapes() -> None:
    model = DeviceModel(_profile())
    for m, n, k, rate in ((1024, 1024, 1024, 50e9), (1024, 1024, 64, 10e9)):
        assert model.gemm_time(m, n, k, "float32") == pytest.approx(2 * m * n * k / rate)


def test_thin_gemms_run_at_the_measured_thin_efficiency() -> None:
    """Between the measured smallest dimensions the efficiency is interpolated
    (log scale); below and above, the nearest measured one holds."""
    model = DeviceModel(_profile())
    square = 2 * 2048**3 / (model.gemm_time(2048, 2048, 2048, "float32") - 1e-5)
    thin = 2 * 2048 * 2048 * 64 / (model.gemm_time(2048, 2048, 64, "float32") - 1e-5)
    middle = 2 * 2048 * 2048 * 256 / (model.gemm_time(2048, 2048, 256, "float32") - 1e-5)
    assert square == pytest.approx(50e9, rel=1e-3)  # the launch floor taken off
    assert thin < middle < square


def test_wave_quantization_charges_a_partial_wave_whole() -> None:
    """80 SMs of 128 x 128 tiles: 81 tiles take two waves, twice 80 tiles' time."""
    model = DeviceModel(v100_sxm2_aws())
    assert model.wave_efficiency(128 * 80, 128) == 1.0
    assert model.wave_efficiency(128 * 81, 128) == pytest.approx(81 / 160)
    # the compute-bound time of 81 tiles is that of 160
    t80 = model.gemm_time(128 * 80, 128, 8192, "float16")
    t81 = model.gemm_time(128 * 81, 128, 8192, "float16")
    assert t81 - 5e-6 == pytest.approx(2 * (t80 - 5e-6), rel=0.02)


def test_memory_bound_gemms_run_at_the_memory_bandwidth() -> None:
    model = DeviceModel(v100_sxm2_aws())
    m = n = 8192
    k = 1
    moved = 2 * (m * k + k * n + m * n)
    assert model.gemm_time(m, n, k, "float16") >= moved / 750e9


def test_the_nominal_profile_is_the_constant_efficiency_model() -> None:
    model = DeviceModel(nominal_profile(1e12, 0.0, 0.5, 0.8))
    assert model.gemm_time(512, 512, 512, "float32") == pytest.approx(2 * 512**3 / 0.5e12)


def test_presets_carry_their_profiles_and_their_achieved_links() -> None:
    c = get_cluster("alpa-testbed", num_nodes=2)
    assert c.profile is not None and c.profile.device == c.device_name
    gpu = c.profile.collective("all-reduce", "gpu", 8)
    assert gpu is not None and c.levels[-1].bandwidth == gpu.bus_bandwidth
    # a level the profile does not name keeps the share of the nearest inner one
    big = get_cluster("dgx-a100", num_devices=2048)
    line = get_cluster("dgx-a100", num_devices=2048)
    assert {lv.bandwidth for lv in big.levels[:-1]} == {line.levels[-2].bandwidth}
    # the profile travels with the cluster through the IR
    assert Cluster.from_op(c.to_op()) == c


def test_a_cluster_takes_a_profile() -> None:
    c = get_cluster("local-cpu")
    profile = _profile(collectives=(CollectiveFit("all-reduce", "device", 0, 3e-5, 7e9),))
    priced = c.with_profile(profile)
    assert priced.profile == profile
    assert priced.levels[0].bandwidth == 7e9 and priced.levels[0].latency == 3e-5
    assert math.isclose(priced.logical_mesh((1, 8)).beta[1], 1 / 7e9)
