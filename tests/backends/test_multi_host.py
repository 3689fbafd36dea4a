"""Meshes across hosts on a Ray cluster of two nodes on this machine.

``ray.cluster_utils.Cluster`` starts two Ray nodes bound to 127.0.0.1, each
declaring 4 devices (``alpa_cpu_device``). The ray backend starts one actor
per node, with that node's 4 CPU devices; the actors form one JAX world
(``jax.distributed``, gloo collectives). ``ShardParallel`` runs its step as
one SPMD program over a (2, 4) mesh that spans both hosts;
``PipeshardParallel`` runs a stage on host0 and a stage whose (2, 2) mesh
spans both hosts, the activations and gradients between them moving as one
XLA program over both meshes."""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import jax
import pytest
from ray_cluster_fixture import joined_cluster
from zoo_fixtures import check_tiny_steps, max_abs_diff, same_steps, tiny_step

import alpa_ir
from alpa_ir.errors import AlpaError

pytestmark = [pytest.mark.ray, pytest.mark.xdist_group("multi_host")]

ray = pytest.importorskip("ray")

STEPS = 3


@pytest.fixture(scope="module")
def two_hosts() -> Iterator[Any]:
    node = {"num_cpus": 1, "resources": {"alpa_cpu_device": 4}}
    with joined_cluster(node, node) as cluster:
        yield cluster


def test_the_probe_measures_the_link_between_hosts(two_hosts: Any) -> None:
    """The probe runs on the host workers every executable shares."""
    from alpa_ir.backends.ray_link_probe import probe_hosts
    from alpa_ir.runtime.ray_cluster import host_link

    assert not host_link("alpa_cpu_device").probed  # the default until probed
    link = probe_hosts()
    assert link.probed and link.bandwidth > 1e6 and 0 < link.latency < 1.0
    assert host_link("alpa_cpu_device") == link  # kept in the cluster, found again


def test_automatic_stages_plan_on_the_ray_hosts(two_hosts: Any) -> None:
    """AutoStageOption on the ray backend plans on 2 hosts of 4 devices joined
    by the probed link: every stage mesh lies inside a host or spans whole hosts."""
    from pipeshard_fixtures import _example, _step

    from alpa_ir.dialects.mesh import ClusterOp
    from alpa_ir.ir.module_utils import top_level_ops

    state, batch = _example()
    method = alpa_ir.PipeshardParallel(num_micro_batches=2, stage_option="auto", backend="ray")
    parallel = alpa_ir.parallelize(_step, method=method, donate_argnums=())
    executable = parallel.get_executable(state, batch)
    try:
        (cluster,) = top_level_ops(executable.input_module, ClusterOp)
        assert [(lv.level_name.data, lv.size.data) for lv in cluster.levels.data] == [
            ("host", 2),
            ("device", 4),
        ]
        hosts_of = executable.remote.mesh_hosts()
        for info in executable.program.meshes.values():
            spans = {d // 4 for d in info.device_ids}
            assert len(spans) == 1 or len(info.device_ids) == 4 * len(spans)
            assert len(hosts_of[info.name]) == len(spans)
        same_steps(parallel, _step, state, batch, 1, state_tol=1e-5)
    finally:
        executable.close()


@pytest.mark.parametrize("schedule", ["1f1b", "gpipe", "zb-h1"])
def test_a_pipeline_stage_spanning_two_hosts_equals_one_device(
    two_hosts: Any, tmp_path: Path, schedule: str
) -> None:
    """Stage 0 on devices 0-1 (host0), stage 1 on a (2, 2) mesh of devices
    2-5 (two on each host), stage 2 on devices 6-7 (host1); 2 micro-batches
    (gradients accumulated), 1F1B, GPipe or ZB-H1 (split backward), 3 steps; then (1F1B) checkpoints
    across hosts."""
    from pipeshard_fixtures import _example, _step

    state, batch = _example()
    method = alpa_ir.PipeshardParallel(
        num_micro_batches=2,
        stage_option=alpa_ir.ManualStageOption([[0], [1], [2]], [(1, 2), (2, 2), (1, 2)]),
        pipeline_schedule=schedule,  # type: ignore[arg-type]
        backend="ray",
    )
    parallel = alpa_ir.parallelize(_step, method=method, donate_argnums=())
    executable = parallel.get_executable(state, batch)
    try:
        runner = executable.remote
        host0, host1 = (h.name for h in runner.hosts)
        mesh0, mesh1, mesh2 = executable.stage_mesh_names()
        assert runner.mesh_hosts() == {mesh0: [host0], mesh1: [host0, host1], mesh2: [host1]}
        transfers = executable.program.transfers
        pairs = {(t.src_mesh, t.dst_mesh) for t in transfers.values()}
        assert {(mesh0, mesh1), (mesh1, mesh2), (mesh2, mesh1), (mesh1, mesh0)} <= pairs
        # every transfer crosses hosts: a collective program on the hosts of both meshes
        hosts_of = runner.mesh_hosts()
        for host, worker in runner.workers.items():
            got = ray.get(
                worker.__ray_call__.remote(
                    lambda w, key: sorted(w.pipelines[key].transport.moves), runner.key
                )
            )
            want = [
                n for n, t in sorted(transfers.items())
                if host in hosts_of[t.src_mesh] + hosts_of[t.dst_mesh]
            ]  # fmt: skip
            assert got == want
        ours, _ = same_steps(parallel, _step, state, batch, STEPS, state_tol=1e-5)
        if schedule == "1f1b":
            _checkpoints_across_hosts(parallel, executable, ours, batch, tmp_path)
    finally:
        executable.close()


@pytest.mark.parametrize(("stages", "micro_batches"), [(2, 4), (4, 8)])
@pytest.mark.parametrize("schedule", ["gpipe", "1f1b", "zb-h1", "interleaved-1f1b", "zb-v"])
def test_every_schedule_runs_the_tiny_gpt_across_hosts(
    two_hosts: Any, schedule: str, stages: int, micro_batches: int
) -> None:
    """The tiny GPT's stages on (1, 2) meshes of the two hosts under each schedule
    equal one device over 3 steps (the xla backend runs the whole grid of 2 and
    4 stages by 4 and 8 micro-batches: tests/api/test_pipeline_schedules.py;
    here its two corners, each run costs seconds of Ray)."""
    from pipeshard_fixtures import tiny_gpt_method

    fn, (state, batch) = tiny_step("gpt-tiny")
    method = tiny_gpt_method(schedule, stages, micro_batches, backend="ray")
    parallel = alpa_ir.parallelize(fn, method=method, donate_argnums=())
    executable = parallel.get_executable(state, batch)
    try:
        same_steps(parallel, fn, state, batch, STEPS, state_tol=1e-5)
    finally:
        executable.close()


def test_gradient_accumulation_on_a_mesh_spanning_two_hosts(two_hosts: Any) -> None:
    """ShardParallel with 2 micro-batches on a (2, 4) mesh over both hosts:
    the accumulated step equals one device's whole-batch step."""
    fn, (state, batch) = tiny_step("mlp-tiny")
    method = alpa_ir.ShardParallel(
        alpa_ir.LogicalDeviceMesh((2, 4)), num_micro_batches=2, backend="ray"
    )
    parallel = alpa_ir.parallelize(fn, method=method, donate_argnums=())
    executable = parallel.get_executable(state, batch)
    try:
        check_tiny_steps(parallel, "mlp-tiny", STEPS)
    finally:
        executable.close()


def _checkpoints_across_hosts(
    parallel: Any, executable: Any, state: Any, batch: Any, tmp_path: Path
) -> None:
    """Saved by both hosts under the pipeline plan, restored in this one
    process; saved by this process, restored for the pipeline plan (placed
    as its stages read the state), whose next step equals one device's."""
    from pipeshard_fixtures import _step

    saved = alpa_ir.save_checkpoint(tmp_path / "hosts", state, step=3, on=executable)
    written = {p.name for p in saved.rglob("ocdbt.process_*")}
    assert {"ocdbt.process_0", "ocdbt.process_1"} <= written, written  # each host its shards
    back = alpa_ir.restore_checkpoint(saved, target=state)
    assert max_abs_diff(back, state) == 0
    alpa_ir.save_checkpoint(tmp_path / "one", state, step=3)
    placed = alpa_ir.restore_checkpoint(tmp_path / "one", target=executable)
    assert max_abs_diff(placed, state) == 0
    ours, our_loss = parallel(placed, batch)  # placed as the stages read it
    theirs, loss = jax.jit(_step)(state, batch)
    assert abs(float(our_loss) - float(loss)) <= 1e-5 * max(1.0, abs(float(loss)))
    assert max_abs_diff(ours, theirs) <= 1e-5


@pytest.fixture(scope="module")
def shard_on_two_hosts(two_hosts: Any) -> Iterator[Any]:
    """Alpa's switch: ``alpa_ir.init(cluster="ray")`` (by ``two_hosts``) makes a
    method without a ``backend`` run on the Ray hosts."""
    fn, args = tiny_step("mlp-tiny")
    method = alpa_ir.ShardParallel(alpa_ir.LogicalDeviceMesh((2, 4)))
    executable = alpa_ir.parallelize(fn, method=method).get_executable(*args)
    yield executable
    executable.close()


def test_an_explicit_xla_backend_stays_local_while_connected(two_hosts: Any) -> None:
    fn, args = tiny_step("mlp-tiny")
    method = alpa_ir.ShardParallel(alpa_ir.LogicalDeviceMesh((2, 4)), backend="xla")
    executable = alpa_ir.parallelize(fn, method=method).get_executable(*args)
    assert executable.remote is None


def test_a_mesh_spanning_two_hosts_equals_one_device(shard_on_two_hosts: Any) -> None:
    executable = shard_on_two_hosts
    hosts = executable.remote.hosts
    assert len(hosts) == 2 and [h.num_devices for h in hosts] == [4, 4]
    assert {h.address for h in hosts} == {"127.0.0.1"}  # loopback only (tests/conftest.py)
    pids = ray.get([w.pid.remote() for w in executable.remote.workers.values()])
    assert len(set(pids)) == 2 and os.getpid() not in pids
    check_tiny_steps(executable, "mlp-tiny", STEPS)


def test_a_step_on_one_host_runs_beside_a_step_on_both(shard_on_two_hosts: Any) -> None:
    """The hosts' workers are shared: a step on host0's 4 devices compiles and
    runs while the (2, 4) step over both hosts holds them (host1 takes no part
    in it), and both equal one device."""
    fn, (state, batch) = tiny_step("mlp-tiny")
    method = alpa_ir.ShardParallel(alpa_ir.LogicalDeviceMesh((1, 4)), backend="ray")
    parallel = alpa_ir.parallelize(fn, method=method, donate_argnums=())
    executable = parallel.get_executable(state, batch)
    try:
        host0 = executable.remote.hosts[0].name
        assert list(executable.remote.mesh_workers) == [host0]
        assert executable.remote.workers == shard_on_two_hosts.remote.workers
        assert max_abs_diff(parallel(state, batch), jax.jit(fn)(state, batch)) <= 1e-5
        check_tiny_steps(shard_on_two_hosts, "mlp-tiny", 1)
    finally:
        executable.close()


def test_a_killed_host_fails_the_step_naming_the_host(shard_on_two_hosts: Any) -> None:
    executable = shard_on_two_hosts
    _, args = tiny_step("mlp-tiny")
    name, worker = list(executable.remote.workers.items())[1]
    ray.kill(worker, no_restart=True)
    start = time.monotonic()
    with pytest.raises(AlpaError, match=rf"the worker of {name.split()[0]} .*died"):
        executable(*args)
    assert time.monotonic() - start < 30
    with pytest.raises(AlpaError, match="stopped after an error"):
        executable(*args)
