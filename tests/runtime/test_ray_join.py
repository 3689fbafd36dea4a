"""``init(cluster="ray")`` joins the Ray cluster that runs here, as Alpa's
``ray.init(address="auto")``: a head started by ``ray start --head`` on
127.0.0.1 (its own temp dir and port, found through ``RAY_ADDRESS`` so that no
other Ray user of this machine sees it), and starts a local instance only
when none runs; one log line says which, and ``shutdown()`` then ``init()``
joins again."""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

import alpa_ir
from alpa_ir.runtime.ray_cluster import cluster_hosts, running_cluster_address

pytestmark = pytest.mark.ray
LOGGER = "alpa_ir.runtime.ray_cluster"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture(scope="module")
def running_head() -> Iterator[str]:
    """``ray start --head --block`` on 127.0.0.1 offering 3 devices, in a
    process group of its own that the teardown ends (``ray stop`` would stop
    every Ray instance of this user on the machine)."""
    alpa_ir.shutdown()
    port = _free_port()
    temp = tempfile.mkdtemp(prefix="arj", dir="/tmp")  # short: Ray's socket paths
    ray = Path(sys.executable).with_name("ray")
    log = open(os.path.join(temp, "ray_start.log"), "w")
    head = subprocess.Popen(
        [str(ray), "start", "--head", "--block", "--node-ip-address=127.0.0.1",
         f"--port={port}", "--num-cpus=1", '--resources={"alpa_cpu_device": 3}',
         "--include-dashboard=false", "--disable-usage-stats", f"--temp-dir={temp}"],
        stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
        # as this process: a token left in ~/.ray would otherwise turn token auth on
        # and, as tests/conftest.py sets it, every port of the head on 127.0.0.1 only
        env={
            **os.environ,
            "RAY_AUTH_MODE": os.environ.get("RAY_AUTH_MODE", "disabled"),
            "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0",
        },
    )  # fmt: skip
    address = f"127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 90
        while True:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError as err:
                if head.poll() is not None or time.monotonic() > deadline:
                    text = Path(log.name).read_text()[-2000:]
                    raise RuntimeError(f"ray start did not come up: {text}") from err
                time.sleep(0.5)
        yield address
    finally:
        alpa_ir.shutdown()
        os.killpg(head.pid, signal.SIGTERM)
        try:
            head.wait(timeout=3)
        except subprocess.TimeoutExpired:
            pass
        with contextlib.suppress(ProcessLookupError):
            os.killpg(head.pid, signal.SIGKILL)  # what SIGTERM left of this group only
        head.wait(timeout=10)
        shutil.rmtree(temp, ignore_errors=True)
        log.close()


def _devices() -> int:
    return sum(h.num_devices for h in cluster_hosts())


def test_init_joins_the_running_cluster_and_again_after_shutdown(
    running_head: str, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setenv("RAY_ADDRESS", running_head)
    assert running_cluster_address() == running_head
    with caplog.at_level(logging.INFO, logger=LOGGER):
        alpa_ir.init(cluster="ray")
    joined = [r.getMessage() for r in caplog.records if r.name == LOGGER]
    assert joined == [f"joining the running Ray cluster at {running_head}"]
    assert _devices() == 3  # the running cluster's, not a local instance's 8
    alpa_ir.shutdown()
    caplog.clear()
    with caplog.at_level(logging.INFO, logger=LOGGER):
        alpa_ir.init()  # Alpa's default cluster is "ray"
    assert [r.getMessage() for r in caplog.records if r.name == LOGGER] == joined
    assert _devices() == 3
    alpa_ir.shutdown()
    alpa_ir.init(cluster_address=running_head)  # Alpa's name of address=
    assert _devices() == 3
    assert _devices() == 3
    alpa_ir.shutdown()  # leaves the cluster running
    assert running_cluster_address() == running_head


def test_init_starts_a_local_instance_only_when_none_runs(
    running_head: str, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setenv("RAY_ADDRESS", "local")  # Ray's word for "none to join"
    assert running_cluster_address() is None
    with caplog.at_level(logging.INFO, logger=LOGGER):
        alpa_ir.init(cluster="ray")
    messages = [r.getMessage() for r in caplog.records if r.name == LOGGER]
    assert messages == ["no Ray cluster is running here: starting a local Ray instance"]
    assert _devices() == 8  # this process's devices
    alpa_ir.shutdown()
    # a given number of devices always means a local instance, cluster or not
    monkeypatch.setenv("RAY_ADDRESS", running_head)
    alpa_ir.init(cluster="ray", num_devices=2)
    assert _devices() == 2
    alpa_ir.shutdown()


def test_a_stale_record_of_a_stopped_cluster_is_not_joined(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("RAY_ADDRESS", f"127.0.0.1:{_free_port()}")  # nothing listens
    assert running_cluster_address() is None


def test_alpas_one_node_of_n_devices_is_a_local_instance_of_n() -> None:
    """Alpa's ``init(cluster="ray", num_nodes=1, num_devices_per_node=N)``."""
    alpa_ir.init(cluster="ray", num_nodes=1, num_devices_per_node=2)
    try:
        assert _devices() == 2
    finally:
        alpa_ir.shutdown()


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"num_nodes": 2, "num_devices_per_node": 4}, "a local Ray instance has one node"),
        ({"num_nodes": 1}, "num_devices_per_node must be a positive integer with num_nodes"),
        ({"num_nodes": 1, "num_devices_per_node": 0}, "num_devices_per_node must be a positive"),
        ({"num_devices": 4, "num_devices_per_node": 4}, "not both"),
    ],
)
def test_alpas_node_options_are_checked(options: dict, message: str) -> None:
    with pytest.raises(alpa_ir.AlpaError, match=message):
        alpa_ir.init(cluster="ray", **options)
    with pytest.raises(alpa_ir.AlpaError, match="options of cluster='ray'"):
        alpa_ir.init(cluster="local", num_nodes=1, num_devices_per_node=2)
    with pytest.raises(alpa_ir.AlpaError, match="not both"):
        alpa_ir.init(cluster_address="127.0.0.1:1", address="127.0.0.1:1")
