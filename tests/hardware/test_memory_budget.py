"""The memory budget of the local devices: the host memory the CPU devices
share, a figure given by hand, the devices' own, and the one-line errors of a
bad figure (Python API and command line)."""

from __future__ import annotations

import math
import os
from dataclasses import dataclass
from typing import Any

import jax
import pytest

import alpa_ir
from alpa_ir.api.pipeshard import PipeshardParallel
from alpa_ir.errors import AlpaError
from alpa_ir.hardware.clusters import Cluster, GiB, get_cluster, local_cpu
from alpa_ir.hardware.memory_budget import (
    HOST_MEMORY_MARGIN,
    MEMORY_ENV,
    NOMINAL_DEVICE_MEMORY,
    MemoryBudget,
    format_gib,
    local_device_budget,
    meminfo_available,
    parse_memory_size,
    shared_host_memory_budget,
)
from alpa_ir.tools import alpa_bench

MEMINFO = """MemTotal:       24684096 kB
MemFree:         1234567 kB
MemAvailable:   16777216 kB
Buffers:          123456 kB
"""
"""A /proc/meminfo with 16 GiB available."""


def _meminfo(text: str | None = MEMINFO) -> Any:
    return lambda: text


def test_shared_budget_is_the_available_memory_less_the_margin_over_the_devices() -> None:
    budget = shared_host_memory_budget(8, meminfo=_meminfo())
    assert budget.per_device == 16 * GiB * (1 - HOST_MEMORY_MARGIN) / 8
    assert budget.enforced
    assert "shared host memory: 16 GiB available (MemAvailable)" in budget.source
    assert "over 8 devices" in budget.source
    assert shared_host_memory_budget(2, meminfo=_meminfo()).per_device == 16 * GiB * 0.9 / 2
    assert shared_host_memory_budget(4, margin=0.0, meminfo=_meminfo()).per_device == 4 * GiB


def test_without_meminfo_sysconf_says_and_without_either_the_nominal_figure() -> None:
    for text in (None, "MemTotal: 1000 kB\n"):  # no file, or no MemAvailable line
        budget = shared_host_memory_budget(4, meminfo=_meminfo(text), sysconf=lambda: 8.0 * GiB)
        assert budget.per_device == 8 * GiB * 0.9 / 4 and "(sysconf)" in budget.source
    unknown = shared_host_memory_budget(4, meminfo=_meminfo(None), sysconf=lambda: None)
    assert unknown.per_device == NOMINAL_DEVICE_MEMORY and not unknown.enforced
    assert meminfo_available(MEMINFO) == 16 * GiB


def test_the_real_host_is_read() -> None:
    budget = shared_host_memory_budget(8)
    assert 0 < budget.per_device * 8 < 2 * 1024**5 and budget.enforced


@pytest.mark.parametrize(
    ("text", "nbytes"),
    [
        ("6GiB", 6 * GiB),
        ("6 gib", 6 * GiB),
        ("512MiB", 512 * 1024**2),
        ("8GB", 8e9),
        ("1.5e9", 1.5e9),
        ("1e3KiB", 1024e3),
        ("4096", 4096.0),
        (" 2 TiB ", 2 * 1024**4),
        (1024, 1024.0),
        (2.5e9, 2.5e9),
    ],
)
def test_sizes_given_by_hand(text: object, nbytes: float) -> None:
    assert parse_memory_size(text, "opt") == nbytes


BAD_SIZES = ["-1", "abc", "nan", "inf", "0", "", "6G", "1e400", "--1", -5, 0, math.nan, math.inf]


@pytest.mark.parametrize("value", [*BAD_SIZES, True, None, [1]])
def test_a_bad_size_is_one_line_naming_option_and_value(value: object) -> None:
    with pytest.raises(AlpaError) as error:
        parse_memory_size(value, "--the-option")
    message = str(error.value)
    assert "\n" not in message
    assert message.startswith("--the-option must be a positive number of bytes")
    assert message.endswith(f"got {value!r}")


def test_a_budget_given_by_hand_overrides_the_host() -> None:
    env = {MEMORY_ENV: "6GiB"}
    budget = local_device_budget(8, environ=env, meminfo=_meminfo())
    assert budget == MemoryBudget(6 * GiB, "ALPA_DEVICE_MEMORY=6GiB")
    given = local_device_budget(8, given="1MiB", environ=env, meminfo=_meminfo())
    assert given.per_device == 1024**2 and given.source == "device_memory='1MiB' given by hand"
    host = local_device_budget(8, environ={}, meminfo=_meminfo())
    assert host.per_device == 16 * GiB * 0.9 / 8


@pytest.mark.parametrize("value", ["-1", "abc", "nan", "0"])
def test_a_bad_environment_variable_is_one_line(
    monkeypatch: pytest.MonkeyPatch, value: str
) -> None:
    monkeypatch.setenv(MEMORY_ENV, value)
    with pytest.raises(AlpaError, match=rf"^ALPA_DEVICE_MEMORY must be .*, got '{value}'$"):
        get_cluster("local-cpu")


@pytest.mark.parametrize("value", ["-1", "abc", math.nan, -3.0])
def test_a_bad_device_memory_of_a_method_is_one_line(value: object) -> None:
    for method, name in (
        (alpa_ir.ShardParallel, "ShardParallel"),
        (PipeshardParallel, "PipeshardParallel"),
    ):
        with pytest.raises(AlpaError) as error:
            method(device_memory=value)  # type: ignore[arg-type]
        message = str(error.value)
        assert "\n" not in message and f"got {value!r}" in message
        assert message.startswith(f"{name}(device_memory=...) must be a positive number")


@pytest.mark.skipif(not os.path.exists("/proc/meminfo"), reason="reads Linux's /proc/meminfo")
def test_local_cpu_budgets_the_shared_host_memory(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(MEMORY_ENV, raising=False)
    cluster = get_cluster("local-cpu")
    assert cluster.memory_source.startswith("shared host memory: ")
    assert f"over {len(jax.local_devices())} devices" in cluster.memory_source
    with open("/proc/meminfo") as f:
        total = int(f.read().split()[1]) * 1024  # MemTotal, kB
    assert cluster.device_memory <= total / len(jax.local_devices())  # not 4 GiB each any more
    fixed = local_cpu(budget=MemoryBudget(3 * GiB, "test"))
    assert fixed.device_memory == 3 * GiB and fixed.memory_source == "test"


def test_local_cpu_takes_the_budget_given_by_hand_and_keeps_its_source(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv(MEMORY_ENV, "3GiB")
    cluster = get_cluster("local-cpu")
    assert cluster.device_memory == 3 * GiB
    assert cluster.memory_source == "ALPA_DEVICE_MEMORY=3GiB"
    again = Cluster.from_op(cluster.to_op())
    assert again == cluster
    assert "mesh.memory_source" in str(cluster.to_op())
    assert cluster.one_node(2).memory_source == cluster.memory_source


@dataclass(frozen=True)
class _FakeDevice:
    """A device with memory of its own (a GPU), as JAX describes one."""

    platform: str
    limit: int | None

    def memory_stats(self) -> dict[str, int] | None:
        return None if self.limit is None else {"bytes_limit": self.limit, "bytes_in_use": 0}


def test_devices_with_their_own_memory_keep_a_per_device_figure() -> None:
    gpus = [_FakeDevice("gpu", 40 * GiB), _FakeDevice("gpu", 39 * GiB)]
    budget = local_device_budget(devices=gpus, environ={}, meminfo=_meminfo())
    assert budget.per_device == 39 * GiB and not budget.enforced  # not the host's
    unknown = local_device_budget(devices=[_FakeDevice("gpu", None)], environ={})
    assert unknown.per_device == NOMINAL_DEVICE_MEMORY and not unknown.enforced
    by_hand = local_device_budget(devices=gpus, environ={MEMORY_ENV: "20GiB"})
    assert by_hand.per_device == 20 * GiB and by_hand.enforced


def test_gib_in_messages() -> None:
    assert format_gib(2.5 * GiB) == "2.5 GiB"
    assert format_gib(1024**2) == "0.000977 GiB (1024 KiB)"


def test_the_command_line_reports_a_bad_budget_in_one_line(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(MEMORY_ENV, "abc")
    monkeypatch.setattr(alpa_bench, "bench_model", _no_work)
    argv = ["--models", "mlp-tiny", "--cluster", "local-cpu", "--micro-batches", "2"]
    with pytest.raises(SystemExit) as stop:
        alpa_bench.main(argv)
    assert stop.value.code != 0
    captured = capsys.readouterr()
    assert captured.out == "" and "Traceback" not in captured.err
    (line,) = captured.err.strip().splitlines()
    assert line.startswith("alpa-bench: error: ALPA_DEVICE_MEMORY must be ")
    assert line.endswith("got 'abc'")


def _no_work(*args: Any, **kwargs: Any) -> Any:
    raise AssertionError("a bad command line must be rejected before any work")
