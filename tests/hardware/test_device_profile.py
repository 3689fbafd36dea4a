"""Device profiles (alpa_ir.hardware.device_profile) and the device model's
prices (alpa_ir.costs.device_model)."""

from __future__ import annotations

import json
import math
from dataclasses import replace
from pathlib import Path

import jax
import jax.numpy as jnp
import pytest

import alpa_ir
from alpa_ir.costs.device_model import DeviceModel, nominal_profile
from alpa_ir.dialects.types import shape_of
from alpa_ir.errors import AlpaError
from alpa_ir.hardware.builtin_profiles import builtin_profiles, v100_sxm2_aws
from alpa_ir.hardware.clusters import Cluster, get_cluster
from alpa_ir.hardware.device_profile import (
    CollectiveFit,
    DeviceProfile,
    GemmPoint,
    load_profile,
)
from alpa_ir.ir.module_utils import main_function


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
        ({"gemm_tiles": ((64, 0),)}, "gemm_tile"),
        ({"max_split_k": 0}, "max_split_k"),
        ({"l2_bandwidth": -1.0}, "l2_bandwidth"),
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


def _one_tile_v100() -> DeviceProfile:
    """The V100 profile with cuBLAS's 128 x 128 tile only, no split-K, and
    launches that add to every kernel (the device model before tile choice)."""
    return replace(v100_sxm2_aws(), gemm_tiles=(), max_split_k=1, async_launch=False)


def test_wave_quantization_charges_a_partial_wave_whole() -> None:
    """80 SMs of 128 x 128 tiles: 81 tiles take two waves, twice 80 tiles' time."""
    model = DeviceModel(_one_tile_v100())
    assert model.wave_efficiency(128 * 80, 128) == 1.0
    assert model.wave_efficiency(128 * 81, 128) == pytest.approx(81 / 160)
    # the compute-bound time of 81 tiles is that of 160
    t80 = model.gemm_time(128 * 80, 128, 8192, "float16")
    t81 = model.gemm_time(128 * 81, 128, 8192, "float16")
    assert t81 - 5e-6 == pytest.approx(2 * (t80 - 5e-6), rel=0.02)


def test_a_gemm_runs_with_its_fastest_tile_and_split() -> None:
    """cuBLAS picks a tile and a split of k per problem: 81 tiles of 128 x 128
    over 80 SMs (two waves, half of the second idle) run faster split in k
    (more, fuller waves, the fp32 partial sums through memory), never faster
    than all SMs busy; a problem of whole waves keeps the 128 x 128 time."""
    chosen, single = DeviceModel(v100_sxm2_aws()), DeviceModel(_one_tile_v100())
    m, n, k = 128 * 81, 128, 8192
    busy = 2 * m * n * k / chosen._curve("float16")[0]
    assert busy < chosen.gemm_time(m, n, k, "float16") < 0.8 * single.gemm_time(m, n, k, "float16")
    # split 4: 324 tiles in 5 waves of 80, the partials written and read once
    split4 = busy * 400 / 324 + 2 * 4 * m * n * 4 / 750e9
    assert chosen.gemm_time(m, n, k, "float16") <= split4
    whole = (128 * 80, 128 * 8, 8192)
    assert chosen.gemm_time(*whole, "float16") == pytest.approx(
        single.gemm_time(*whole, "float16") - 5e-6
    )


def test_small_tiles_run_at_most_at_the_rate_the_l2_cache_feeds_them() -> None:
    """A 64 x 64 fp16 tile reads 64 + 64 elements (256 bytes) per 2·64·64
    FLOPs: at the V100's 2,155 GB/s of L2 it reaches 69 TFLOP/s, below the
    large tiles' 93; in fp32 (no tensor cores, 11.6 TFLOP/s) it is not bound."""
    model = DeviceModel(v100_sxm2_aws())
    assert model.tile_rate((64, 64), "float16", 93e12) == pytest.approx(2155e9 * 32)
    assert model.tile_rate((128, 128), "float16", 93e12) == 93e12
    assert model.tile_rate((64, 64), "float32", 11.6e12) == 11.6e12
    # a smaller tile packs its share of the 128 x 128 tile's SM: 4 per SM
    assert model.wave_efficiency(64 * 320, 64, tile=(64, 64)) == 1.0
    assert model.wave_efficiency(64 * 321, 64, tile=(64, 64)) == pytest.approx(321 / 640)


def test_queued_launches_cost_the_longer_of_run_and_floor() -> None:
    """GPUs queue kernels ahead (async_launch): a kernel costs max(run, 5 µs);
    where the host runs them one by one (CPU devices) the two add up."""
    queued, serial = DeviceModel(v100_sxm2_aws()), DeviceModel(_one_tile_v100())
    assert queued.gemm_time(16, 16, 16, "float16") == pytest.approx(5e-6)
    assert serial.gemm_time(16, 16, 16, "float16") > 5e-6
    big = (4096, 4096, 4096)
    assert queued.gemm_time(*big, "float16") == pytest.approx(
        serial.gemm_time(*big, "float16") - 5e-6, rel=1e-6
    )


def test_only_kernels_shorter_than_the_floor_pay_it() -> None:
    """A block of one large elementwise kernel and one tiny one: with queued
    launches only the tiny one pays (its shortfall to 5 µs); launched one by
    one both pay 5 µs each."""

    def fn(x: jax.Array, y: jax.Array) -> tuple[jax.Array, jax.Array]:
        return jnp.exp(x) * 2.0, jnp.tanh(y)

    block = main_function(alpa_ir.import_jax(fn, jnp.ones((4096, 4096)), jnp.ones((8,)))).body.block
    shapes = lambda v: tuple(shape_of(v.type))  # noqa: E731
    queued = DeviceModel(v100_sxm2_aws()).block_times(block, shapes)
    serial = DeviceModel(_one_tile_v100()).block_times(block, shapes)
    assert serial.kernels == queued.kernels == 2
    assert serial.launches == pytest.approx(2 * 5e-6)
    tiny = 2 * 8 * 4 / 750e9  # the tiny kernel reads and writes 32 bytes
    assert queued.launches == pytest.approx(5e-6 - tiny)
    assert queued.memory == pytest.approx(serial.memory)


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
