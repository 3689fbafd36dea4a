"""``alpa_ir.train`` loses a Ray host mid-run and carries on.

A Ray cluster of two nodes on this machine (``ray.cluster_utils.Cluster``,
every node on 127.0.0.1, 4 CPU devices each, as the multi-host tests). The
head's health checks are tightened so that Ray reports a killed node dead
within about a second instead of about 15 s (the test's time, not the
mechanism). The second node is killed (all its processes, SIGKILL) while
``batch_fn(5)`` runs: step 5 fails on its dead worker, ``train`` re-plans
``ShardParallel()`` on the 4 devices of the first node (a new JAX world of
one host), restores checkpoint step 4 and replays steps 4-7 there. The final
state equals 8 uninterrupted steps of ``jax.jit`` on one device. Before that,
a host worker process killed on a node that stays: a pipeline with automatic
stages is planned again on the same hosts. After it, a node lost while the
first plan is made: the run starts over from the given state."""

from __future__ import annotations

import logging
import os
import signal
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from ray_cluster_fixture import joined_cluster
from zoo_fixtures import max_abs_diff, tiny_step

import alpa_ir
from alpa_ir.api.checkpoint import read_manifest

pytestmark = [pytest.mark.ray, pytest.mark.xdist_group("multi_host")]

ray = pytest.importorskip("ray")

FAST_HEALTH_CHECKS = {
    "health_check_period_ms": 300,
    "health_check_timeout_ms": 300,
    "health_check_failure_threshold": 3,
}


NODE = {"num_cpus": 1, "resources": {"alpa_cpu_device": 4}}


@pytest.fixture(scope="module")
def two_hosts() -> Iterator[Any]:
    with joined_cluster(NODE | {"_system_config": FAST_HEALTH_CHECKS}, NODE) as cluster:
        yield cluster


def second_node(cluster: Any) -> Any:
    """The cluster's one node besides the head, added again where an earlier
    test of the module removed it (the tests may run in any order)."""
    from alpa_ir.runtime.ray_cluster import cluster_hosts

    if not cluster.worker_nodes:
        cluster.add_node(**NODE)
    (node,) = cluster.worker_nodes
    assert len(cluster_hosts()) == 2
    return node


def batches(batch: Any) -> Any:
    """Step i's batch: the example batch scaled by 1 + i / 10 (every step differs)."""
    return lambda i: jax.tree.map(lambda x: x * (1.0 + 0.1 * i), batch)


def jit_steps(fn: Any, state: Any, batch_of: Any, n: int) -> tuple[Any, list[float]]:
    """n uninterrupted steps of ``jax.jit`` on one device."""
    losses = []
    for i in range(n):
        state, loss = jax.jit(fn)(state, batch_of(i))
        losses.append(float(loss))
    return state, losses


def host_worker_pids(node: Any) -> list[int]:
    """The host worker processes a Ray node of this test's cluster runs (the
    raylet's children; nothing outside this cluster)."""
    import psutil

    raylet = psutil.Process(node.all_processes["raylet"][0].process.pid)
    return [p.pid for p in raylet.children(recursive=True) if "HostWorker" in " ".join(p.cmdline())]


def test_a_worker_killed_on_a_live_host_is_started_again(
    two_hosts: Any, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A pipeline with automatic stages: host1's worker process is killed
    (SIGKILL, as the OOM killer does) while batch_fn(3) runs; its node stays,
    so after lost_host_timeout_s the stages are planned again on the same two
    hosts and steps 2-3 replayed from checkpoint step 2."""
    from pipeshard_fixtures import _example, _step

    state, batch = _example()
    batch_of = batches(batch)
    want, want_losses = jit_steps(_step, state, batch_of, 4)
    second = second_node(two_hosts)
    calls: list[int] = []

    def batch_fn(i: int) -> Any:
        calls.append(i)
        if i == 3 and calls.count(3) == 1:
            (pid,) = host_worker_pids(second)
            os.kill(pid, signal.SIGKILL)
        return batch_of(i)

    method = alpa_ir.PipeshardParallel(num_micro_batches=2, stage_option=alpa_ir.AutoStageOption())
    with caplog.at_level(logging.INFO, logger="alpa_ir.train"):
        final, losses = alpa_ir.train(
            _step,
            state,
            batch_fn,
            method=method,
            num_steps=4,
            checkpoint_dir=tmp_path / "ckpt",
            checkpoint_every=2,
            recovery=alpa_ir.RecoveryOption(lost_host_timeout_s=3.0),
        )
    notes = [r.getMessage() for r in caplog.records if r.name == "alpa_ir.train"]
    assert notes == [
        "alpa_ir.train: lost a host worker at step 3; re-planned PipeshardParallel on 8 "
        "devices; resumed from checkpoint step 2"
    ]
    assert calls == [0, 1, 2, 3, 2, 3]  # replayed from the checkpoint, once
    np.testing.assert_allclose(losses, want_losses, rtol=1e-4, atol=1e-6)
    assert max_abs_diff(final, want) <= 1e-4


def test_a_killed_host_is_survived_on_the_host_that_remains(
    two_hosts: Any, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    from alpa_ir.runtime.ray_cluster import cluster_hosts

    fn, (state, batch) = tiny_step("mlp-tiny")
    batch_of = batches(batch)
    want, want_losses = jit_steps(fn, state, batch_of, 8)

    second = second_node(two_hosts)
    # hosts are named in (address, node id) order: on one address, by node id
    lost = {h.node_id: h.name for h in cluster_hosts()}[second.node_id]
    calls: list[int] = []

    def batch_fn(i: int) -> Any:
        calls.append(i)
        if i == 5 and calls.count(5) == 1:
            assert len(cluster_hosts()) == 2
            two_hosts.remove_node(second, allow_graceful=False)  # SIGKILL, no goodbye
        return batch_of(i)

    with caplog.at_level(logging.INFO, logger="alpa_ir.train"):
        final, losses = alpa_ir.train(
            fn,
            state,
            batch_fn,
            method=alpa_ir.ShardParallel(),
            num_steps=8,
            checkpoint_dir=tmp_path / "ckpt",
            checkpoint_every=2,
            recovery=alpa_ir.RecoveryOption(lost_host_timeout_s=30.0),
        )
    assert [h.num_devices for h in cluster_hosts()] == [4]  # one host left
    notes = [r.getMessage() for r in caplog.records if r.name == "alpa_ir.train"]
    assert notes == [
        f"alpa_ir.train: lost {lost} at step 5; re-planned ShardParallel on 4 devices; "
        "resumed from checkpoint step 4"
    ]
    assert calls == [0, 1, 2, 3, 4, 5, 4, 5, 6, 7]  # replayed from the checkpoint, once
    assert read_manifest(tmp_path / "ckpt")["step"] == 8
    np.testing.assert_allclose(losses, want_losses, rtol=1e-4, atol=1e-6)
    assert max_abs_diff(final, want) <= 1e-4


def test_a_host_lost_while_the_first_plan_is_made_restarts_from_step_0(
    two_hosts: Any,
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A node joins, then dies after the first plan is made for 8 devices and
    before its workers start, nothing committed: that plan cannot start (its
    host is gone, or its worker there never comes up), so ``train`` plans
    again on the 4 left and starts over from the given state.

    The node dies inside the first ``start_hosts``: killed from ``batch_fn``
    instead, Ray may report it gone before the plan is made (CI did, at
    6f925f4), and the first plan is then made for 4 devices and runs."""
    from alpa_ir.backends.ray_hosts import RayHostGroup
    from alpa_ir.runtime.ray_cluster import cluster_hosts

    joined = second_node(two_hosts)
    lost = {h.node_id: h.name for h in cluster_hosts()}[joined.node_id]
    calls: list[int] = []
    starts: list[int] = []
    start_hosts = RayHostGroup.start_hosts

    def start_after_losing_the_node(group: Any, num_devices: int, timeout_s: float) -> None:
        starts.append(num_devices)
        if len(starts) == 1:
            two_hosts.remove_node(joined, allow_graceful=False)
        start_hosts(group, num_devices, timeout_s)

    monkeypatch.setattr(RayHostGroup, "start_hosts", start_after_losing_the_node)

    def step(state: jax.Array, batch: jax.Array) -> tuple[jax.Array, jax.Array]:
        return state + batch, jnp.sum(batch)

    def batch_fn(i: int) -> jax.Array:
        calls.append(i)
        return jnp.full((8, 4), float(i + 1))

    with caplog.at_level(logging.INFO, logger="alpa_ir.train"):
        final, losses = alpa_ir.train(
            step,
            jnp.zeros((8, 4)),
            batch_fn,
            method=alpa_ir.ShardParallel(),
            num_steps=2,
            checkpoint_dir=tmp_path / "ckpt",
            checkpoint_every=2,
            recovery=alpa_ir.RecoveryOption(lost_host_timeout_s=30.0),
        )
    notes = [r.getMessage() for r in caplog.records if r.name == "alpa_ir.train"]
    assert notes == [
        f"alpa_ir.train: lost {lost} at step 0; re-planned ShardParallel on 4 devices; "
        "resumed from the initial state (step 0)"
    ]
    assert starts == [8, 4]
    assert calls == [0, 0, 1] and losses == [32.0, 64.0]
    np.testing.assert_array_equal(np.asarray(final), np.full((8, 4), 3.0))
