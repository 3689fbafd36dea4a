"""The ``ray`` backend on a local Ray instance (shared by this module's tests):
one actor per host (its node's devices) equals the single-device step, a dead worker or a bad
address is an AlpaError within 30 s, a plan too big for the cluster names
both numbers, and shutdown leaves no process behind."""

from __future__ import annotations

import gc
import os
import re
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import jax
import numpy as np
import optax
import pytest
from two_mesh_fixture import example_inputs, reference, two_mesh_module
from zoo_fixtures import same_steps

import alpa_ir
from alpa_ir.errors import AlpaError

pytestmark = pytest.mark.ray

ray = pytest.importorskip("ray")


@pytest.fixture(scope="module")
def ray_instance() -> Iterator[None]:
    yield
    alpa_ir.shutdown()


@pytest.fixture
def cluster(ray_instance: None) -> None:
    """A local Ray instance with this process's 8 devices (started once; again
    only after the shutdown test); never a cluster that runs beside it."""
    alpa_ir.init(cluster="ray", num_devices=8)


def _compile(module: Any) -> Any:
    return alpa_ir.compile_module(module, backend="ray")


def _transports(worker: Any, key: str) -> tuple[list[str], int]:
    """A host worker's transfers of the executable ``key`` that run as
    collective programs, and the bytes its local transport moved."""

    def read(self: Any) -> tuple[list[str], int]:
        transport = self.pipelines[key].transport
        return sorted(transport.moves), transport.local.bytes_moved

    return ray.get(worker.__ray_call__.remote(read))


def test_two_meshes_on_ray_equal_one_device(cluster: None) -> None:
    """One host worker (this instance's one node) runs both meshes in a process
    of its own; the transfer between them stays inside it: a device copy of
    the plan's tiles, no collective program."""
    executable = _compile(two_mesh_module())
    try:
        (host,) = executable.workers
        assert executable.mesh_hosts() == {"mesh0": [host], "mesh1": [host]}
        pid = ray.get(executable.workers[host].pid.remote())
        assert pid != os.getpid()
        assert _transports(executable.workers[host], executable.key) == ([], 0)
        for seed in (0, 1):  # the program is loaded once; steps repeat
            x, w = example_inputs(seed=seed)
            new_w, y = executable(x, jax.numpy.asarray(w))
            assert isinstance(new_w, np.ndarray) and isinstance(y, np.ndarray)
            want_w, want_y = reference(x, w)
            np.testing.assert_allclose(y, want_y, rtol=1e-5, atol=1e-6)
            np.testing.assert_allclose(new_w, want_w, rtol=1e-5, atol=1e-6)
        programs, moved = _transports(executable.workers[host], executable.key)
        assert programs == [] and moved > 0  # every transfer a local copy
    finally:
        executable.close()


def test_the_host_worker_owns_its_nodes_devices(cluster: None) -> None:
    executable = _compile(two_mesh_module(mesh0=(0, 1, 2), mesh1=(3,)))
    try:
        (worker,) = executable.workers.values()
        count = ray.get(worker.__ray_call__.remote(lambda self: len(jax.local_devices())))
        assert count == 8  # the local instance's node offers this process's 8 devices
        x, w = example_inputs()
        np.testing.assert_allclose(executable(x, w)[0], reference(x, w)[0], rtol=1e-5, atol=1e-6)
    finally:
        executable.close()


def test_pipeshard_step_on_ray_equals_one_device(cluster: None) -> None:
    """An outlined, auto-sharded step on meshes 1x4 and 2x2, 2 micro-batches, 1F1B."""
    from pipeshard_fixtures import _example, _step

    from alpa_ir.api.pipeshard import ManualStageOption, PipeshardParallel
    from alpa_ir.passmanager.pass_manager import PassManager
    from alpa_ir.plugins.registry import default_registry

    state, batch = _example()
    method = PipeshardParallel(
        num_micro_batches=2, stage_option=ManualStageOption([[0], [1, 2]], [(1, 4), (2, 2)])
    )
    module = alpa_ir.parallelize(_step, method=method).get_executable(state, batch).module.clone()
    PassManager(default_registry(), "builtin.module(cross-mesh-resharding,emit-instructions)").run(
        module
    )
    executable = _compile(module)
    try:
        ours, theirs = state, state
        for _ in range(2):
            ours, our_loss = executable(ours, batch)
            theirs, loss = jax.jit(_step)(theirs, batch)
            np.testing.assert_allclose(our_loss, loss, rtol=1e-4)
            for a, b in zip(jax.tree.leaves(ours), jax.tree.leaves(theirs), strict=True):
                np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-6)
    finally:
        executable.close()


def test_tiny_gpt_with_two_stages_of_four_devices_on_ray(cluster: None, tmp_path: Path) -> None:
    """PipeshardParallel(backend="ray"): automatic layers, 2 stages on 1x4 meshes,
    2 micro-batches, the model's default optimizer (Adam, whose step counter
    and bias corrections every stage's apply-grad computes for itself); three
    steps equal the single-device steps."""
    from alpa_ir.api.pipeshard import AutoLayerOption, PipeshardParallel, UniformStageOption
    from alpa_ir.models.train_step import make_train_step

    step, (state, batch) = make_train_step("gpt-tiny")
    assert isinstance(state["opt_state"][0], optax.ScaleByAdamState)
    method = PipeshardParallel(
        num_micro_batches=2,
        layer_option=AutoLayerOption(layer_num=2),
        stage_option=UniformStageOption(num_stages=2),
        backend="ray",
    )
    parallel = alpa_ir.parallelize(step, method=method, donate_argnums=())
    executable = parallel.get_executable(state, batch)
    try:
        ours, theirs = same_steps(parallel, step, state, batch, 3, rtol=1e-4)
        for a, b in zip(jax.tree.leaves(ours), jax.tree.leaves(theirs), strict=True):
            np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-5)
        # the workers time every instruction: a measured bar per RUN executed
        executable.record_timeline = True
        parallel(ours, batch)
        runs = sum(i.kind == "run" for ins in executable.program.instructions.values() for i in ins)
        measured = executable.last_timeline
        assert len(measured.timeline) == runs and len(measured.transfers) > 0
        picture = executable.plot("timeline", tmp_path / "timeline.png")
        assert picture.measured_runs == runs
    finally:
        executable.close()


def test_a_dead_worker_fails_the_step_within_30_s(cluster: None) -> None:
    executable = _compile(two_mesh_module())
    x, w = example_inputs()
    executable(x, w)
    (host,) = executable.workers
    ray.kill(executable.workers[host])
    start = time.monotonic()
    with pytest.raises(AlpaError, match=rf"the worker of {re.escape(host)} died"):
        executable(x, w)
    assert time.monotonic() - start < 30
    assert executable.workers == {}
    with pytest.raises(AlpaError, match="stopped after an error"):
        executable(x, w)


def test_killing_a_worker_during_a_step_fails_it_within_30_s(cluster: None, tmp_path: Path) -> None:
    """The step runs in a thread; the host worker blocks at its first transfer
    (patched to touch a file first: the busy actor takes no other call), and
    the test kills its process there: the call fails within 30 s naming the
    host."""
    import signal
    import threading

    executable = _compile(two_mesh_module())
    x, w = example_inputs()
    executable(x, w)  # one full step first: programs loaded, functions compiled
    ((host, worker),) = executable.workers.items()
    pid = ray.get(worker.pid.remote())

    stalled = tmp_path / "stalled"

    def patch(self: Any) -> None:
        def stall(*_args: Any) -> None:
            stalled.touch()
            threading.Event().wait(600)

        self.pipelines[executable.key].transport.send = stall

    ray.get(worker.__ray_call__.remote(patch))
    outcome: list[BaseException | None] = []

    def step() -> None:
        try:
            executable(x, w)
            outcome.append(None)
        except BaseException as err:
            outcome.append(err)

    thread = threading.Thread(target=step, daemon=True)
    thread.start()
    deadline = time.monotonic() + 60
    while not stalled.exists():
        assert time.monotonic() < deadline, "the step never reached its transfer"
        time.sleep(0.05)
    assert thread.is_alive() and not outcome
    start = time.monotonic()
    os.kill(pid, signal.SIGKILL)
    thread.join(30)
    assert not thread.is_alive(), "the step hangs after its worker was killed"
    assert time.monotonic() - start < 30
    (error,) = outcome
    assert isinstance(error, AlpaError), repr(error)
    assert f"the worker of {host} died" in str(error), str(error)
    with pytest.raises(AlpaError, match="stopped after an error"):
        executable(x, w)


def test_a_plan_for_more_devices_than_the_cluster_has(cluster: None) -> None:
    module = two_mesh_module(mesh0=range(0, 8), mesh1=range(8, 16))
    start = time.monotonic()
    with pytest.raises(AlpaError, match=r"the plan needs 16 devices but the Ray cluster.* have 8"):
        _compile(module)
    assert time.monotonic() - start < 30


def test_without_init_the_backend_says_what_to_do(cluster: None) -> None:
    with pytest.raises(AlpaError, match=r"unknown cluster 'gpu'"):
        alpa_ir.init(cluster="gpu")  # type: ignore[arg-type]
    alpa_ir.init(cluster="local")  # the xla backend's: nothing to start
    alpa_ir.init(cluster="ray")  # idempotent


def test_methods_without_a_backend_follow_the_session(cluster: None) -> None:
    """Alpa's switch: connected to Ray, a method without ``backend`` runs on
    ray; an explicit backend is kept; after ``shutdown``, local again."""
    from alpa_ir.api.runtime_api import session_backend

    assert alpa_ir.ShardParallel().backend is None
    assert session_backend(None) == "ray"
    assert session_backend("xla") == "xla"
    alpa_ir.shutdown()
    assert session_backend(None) == "xla"
    alpa_ir.init(cluster="ray")  # as the other tests of this module expect


_BAD_ADDRESSES = """
import time, alpa_ir
from alpa_ir.errors import AlpaError
for address, timeout in (("127.0.0.1:1", 30.0), ("192.0.2.123:6379", 3.0)):
    start = time.monotonic()
    try:
        alpa_ir.init(cluster="ray", address=address, timeout_s=timeout)
    except AlpaError as err:
        print(f"{time.monotonic() - start:.1f} {err}")
alpa_ir.shutdown()
try:
    alpa_ir.compile_module(alpa_ir.parse_module("builtin.module {}"), backend="ray")
except AlpaError as err:
    print(err)
"""


def test_an_address_that_does_not_answer_fails_within_30_s() -> None:
    """A refused port, and an address that swallows packets (TEST-NET-1)."""
    out = subprocess.run(
        [sys.executable, "-c", _BAD_ADDRESSES],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "JAX_PLATFORMS": "cpu"},
    )
    lines = out.stdout.strip().splitlines()
    assert len(lines) == 3, out.stdout + out.stderr
    for line, address in zip(lines, ("127.0.0.1:1", "192.0.2.123:6379"), strict=False):
        seconds, message = line.split(" ", 1)
        assert float(seconds) < 30
        assert message.startswith(f"no Ray cluster answers at {address}")
    assert "call alpa_ir.init(cluster='ray') first" in lines[2]


def _descendants() -> list[Any]:
    """This process's children that belong to Ray: the local instance's
    processes and its workers (not, e.g., the resource tracker of another
    test's multiprocessing pool in the same pytest worker)."""
    psutil = pytest.importorskip("psutil")
    out = []
    for p in psutil.Process().children(recursive=True):
        try:
            line = " ".join(p.cmdline())
        except psutil.Error:
            continue
        if "ray" in line or "HostWorker" in line:
            out.append(p)
    return out


def test_shutdown_leaves_no_process_behind(cluster: None) -> None:
    psutil = pytest.importorskip("psutil")
    executable = _compile(two_mesh_module())
    x, w = example_inputs()
    executable(x, w)
    before = _descendants()
    names = " ".join(" ".join(p.cmdline()) for p in before)
    assert "raylet" in names and "gcs_server" in names and "HostWorker" in names
    alpa_ir.shutdown()
    alpa_ir.shutdown()  # idempotent
    _gone, alive = psutil.wait_procs(before, timeout=15)
    assert alive == [], [" ".join(p.cmdline())[:80] for p in alive]
    assert not ray.is_initialized()
    # an executable collected after the shutdown asks no worker to unload (a
    # call on a handle would start a new Ray instance, and the steps after it
    # would run there)
    del executable
    gc.collect()
    assert not ray.is_initialized()


def _dropout_step(state: dict[str, Any], batch: dict[str, Any]) -> Any:
    key, sub = jax.random.split(state["key"])

    def loss(p: dict[str, Any]) -> Any:
        h = jax.numpy.tanh(batch["x"] @ p["w0"])
        alpa_ir.mark_pipeline_boundary()
        keep = jax.random.bernoulli(sub, 0.8, h.shape)
        h = jax.numpy.where(keep, h / 0.8, 0.0)
        return jax.numpy.mean((h @ p["w1"] - batch["y"]) ** 2)

    value, grads = jax.value_and_grad(loss)(state["p"])
    p = jax.tree.map(lambda w, g: w - 0.1 * g, state["p"], grads)
    return {"p": p, "key": key}, value


def test_prng_keys_cross_into_and_out_of_the_hosts(cluster: None) -> None:
    """A typed key in the state goes in as key data and comes back a key; the
    dropout mask drawn on the second stage equals one device's."""
    rng = np.random.default_rng(0)
    state = {
        "p": {
            "w0": jax.numpy.asarray(rng.normal(size=(8, 16)), jax.numpy.float32),
            "w1": jax.numpy.asarray(rng.normal(size=(16, 4)), jax.numpy.float32),
        },
        "key": jax.random.key(5),
    }
    batch = {
        "x": jax.numpy.asarray(rng.normal(size=(8, 8)), jax.numpy.float32),
        "y": jax.numpy.asarray(rng.normal(size=(8, 4)), jax.numpy.float32),
    }
    method = alpa_ir.PipeshardParallel(
        num_micro_batches=2,
        stage_option=alpa_ir.ManualStageOption([[0], [1]], [(1, 2), (1, 2)]),
        backend="ray",
        devices=[0, 1, 2, 3],
    )
    parallel = alpa_ir.parallelize(_dropout_step, method=method, donate_argnums=())
    executable = parallel.get_executable(state, batch)
    try:
        ours, theirs = same_steps(parallel, _dropout_step, state, batch, 2, rtol=1e-5)
        assert ours["key"].dtype == state["key"].dtype
        np.testing.assert_array_equal(
            jax.random.key_data(ours["key"]), jax.random.key_data(theirs["key"])
        )
        np.testing.assert_allclose(ours["p"]["w1"], theirs["p"]["w1"], rtol=1e-5, atol=1e-6)
    finally:
        executable.close()


def test_the_driver_plans_for_the_clusters_devices_not_its_own() -> None:
    """A driver with 8 devices plans a (2, 8) mesh for a cluster of 16 (as a
    CPU head node does for GPU hosts); a mesh beyond the cluster names both."""
    from zoo_fixtures import max_abs_diff, tiny_step

    alpa_ir.shutdown()
    alpa_ir.init(cluster="ray", num_devices=16)
    try:
        assert len(jax.devices()) == 8
        fn, (state, batch) = tiny_step("mlp-tiny")
        method = alpa_ir.ShardParallel(alpa_ir.LogicalDeviceMesh((2, 8)), backend="ray")
        parallel = alpa_ir.parallelize(fn, method=method, donate_argnums=())
        ours = parallel(state, batch)
        assert max_abs_diff(ours, jax.jit(fn)(state, batch)) <= 1e-5
        parallel.get_executable(state, batch).close()
        too_big = alpa_ir.ShardParallel(alpa_ir.LogicalDeviceMesh((2, 16)), backend="ray")
        with pytest.raises(AlpaError, match=r"needs 32 devices .* the Ray cluster's hosts have 16"):
            alpa_ir.parallelize(fn, method=too_big).get_executable(state, batch)
        pipeline = alpa_ir.PipeshardParallel(num_micro_batches=2, backend="ray")
        executable = alpa_ir.parallelize(fn, method=pipeline).get_executable(state, batch)
        try:  # the default devices: all 16 of the cluster, in 2 uniform stages
            assert sum(len(info.device_ids) for info in executable.program.meshes.values()) == 16
        finally:
            executable.close()
    finally:
        alpa_ir.shutdown()


_JOIN = """
import sys, alpa_ir
from alpa_ir.errors import AlpaError
try:
    alpa_ir.init(cluster="ray", address=sys.argv[1])
    from alpa_ir.runtime.ray_cluster import cluster_hosts
    print("joined", [h.num_devices for h in cluster_hosts()])
except AlpaError as err:
    print(err)
"""


def test_a_cluster_started_with_ray_start_asks_for_its_token(tmp_path: Path) -> None:
    """``ray start`` turns on Ray's token authentication where a token exists
    (``ray.init()`` of a local instance writes one to ~/.ray/auth_token), and
    Ray sends no token to an explicit address: joining says how to give it
    (a line), and with RAY_AUTH_MODE=token the driver joins. The head node is
    stopped with its process group (``ray stop`` would stop every Ray here)."""
    import signal
    import socket

    psutil = pytest.importorskip("psutil")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = {**os.environ, "HOME": str(tmp_path), "JAX_PLATFORMS": "cpu"}
    env.pop("RAY_AUTH_MODE", None)
    subprocess.run([sys.executable, "-m", "ray.scripts.scripts", "get-auth-token", "--generate"],
                   env=env, check=True, capture_output=True, timeout=60)  # fmt: skip
    assert (tmp_path / ".ray" / "auth_token").exists()
    head = subprocess.Popen(
        [sys.executable, "-m", "ray.scripts.scripts", "start", "--head", "--block",
         "--node-ip-address=127.0.0.1", f"--port={port}", "--include-dashboard=false",
         "--num-cpus=1", "--disable-usage-stats", '--resources={"alpa_cpu_device": 2}'],
        env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True,
    )  # fmt: skip
    try:
        address = f"127.0.0.1:{port}"
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:  # until the head's GCS listens
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                time.sleep(0.5)

        def join(**more: str) -> str:
            out = subprocess.run([sys.executable, "-c", _JOIN, address], env={**env, **more},
                                 capture_output=True, text=True, timeout=120)  # fmt: skip
            return out.stdout.strip()

        refused = join()
        assert refused.startswith(f"the Ray cluster at {address} asks for its authentication token")
        assert "set RAY_AUTH_MODE=token" in refused
        assert join(RAY_AUTH_MODE="token") == "joined [2]"
    finally:
        os.killpg(head.pid, signal.SIGTERM)
        head.wait(timeout=60)
        for p in psutil.process_iter(["cmdline"]):
            if f"--gcs-address=127.0.0.1:{port}" in " ".join(p.info["cmdline"] or ()):
                p.kill()


def test_a_join_without_the_clusters_token_says_how_to_give_it() -> None:
    """Ray's two token errors (as Ray 2.60 words them, nested in its
    ConnectionError) become one line each; other failures keep their text."""
    from alpa_ir.runtime.ray_cluster import join_error

    def nested(text: str) -> Exception:
        try:
            try:
                raise RuntimeError(f"Failed to connect to GCS. Last connection error: {text}")
            except RuntimeError as inner:
                raise ConnectionError("Failed to connect to Ray cluster at h:1") from inner
        except ConnectionError as err:
            return err

    missing = nested("Token authentication is enabled but no authentication token was found.")
    assert join_error(missing, "h:1").endswith(
        "has no token for the Ray cluster at h:1: put the cluster's token in ~/.ray/auth_token "
        "or RAY_AUTH_TOKEN (for a cluster without token authentication, unset RAY_AUTH_MODE)"
    )
    wrong = nested("ray.exceptions.AuthenticationError: RPC error: InvalidAuthToken: missing")
    assert join_error(wrong, "h:1").startswith(
        "the Ray cluster at h:1 asks for its authentication token"
    )
    other = nested("Deadline Exceeded")
    assert join_error(other, "h:1") == (
        "could not join the Ray cluster at h:1: Failed to connect to Ray cluster at h:1 "
        "(Failed to connect to GCS. Last connection error: Deadline Exceeded)"
    )


def test_executables_share_the_host_workers(cluster: None) -> None:
    """Alpa's users compile several functions on one cluster (a train step, an
    eval step, ``create_state``): a second executable on the devices the first
    holds runs on the same host worker, each with its own programs; closing
    one leaves the other running, and a ShardParallel step joins them."""
    from zoo_fixtures import max_abs_diff, tiny_step

    first = _compile(two_mesh_module())
    second = _compile(two_mesh_module(mesh0=(0, 1, 2), mesh1=(3,)))
    try:
        pids = {ray.get(e.workers[h].pid.remote()) for e in (first, second) for h in e.workers}
        assert len(pids) == 1 and first.key != second.key
        x, w = example_inputs()
        for executable in (first, second, first):
            np.testing.assert_allclose(
                executable(x, w)[0], reference(x, w)[0], rtol=1e-5, atol=1e-6
            )
        (worker,) = second.workers.values()

        def loaded() -> set[str]:
            return set(ray.get(worker.__ray_call__.remote(lambda self: list(self.pipelines))))

        assert {first.key, second.key} <= loaded()
        first.close()
        with pytest.raises(AlpaError, match="closed"):
            first(x, w)
        assert first.key not in loaded() and second.key in loaded()
        dropped = _compile(two_mesh_module())
        key = dropped.key
        assert key in loaded()
        del dropped  # never closed: its programs are unloaded when it is collected
        gc.collect()
        assert key not in loaded()
        np.testing.assert_allclose(second(x, w)[0], reference(x, w)[0], rtol=1e-5, atol=1e-6)
        fn, (state, batch) = tiny_step("mlp-tiny")
        method = alpa_ir.ShardParallel(alpa_ir.LogicalDeviceMesh((2, 4)), backend="ray")
        parallel = alpa_ir.parallelize(fn, method=method, donate_argnums=())
        assert max_abs_diff(parallel(state, batch), jax.jit(fn)(state, batch)) <= 1e-5
        (host,) = parallel.get_executable(state, batch).remote.workers
        assert (
            ray.get(parallel.get_executable(state, batch).remote.workers[host].pid.remote()) in pids
        )
        parallel.get_executable(state, batch).close()
    finally:
        first.close()
        second.close()


def test_a_checkpoint_saved_through_a_local_cache_moves_in_the_background(
    cluster: None, tmp_path: Path
) -> None:
    """Alpa's ``save_checkpoint(path, state, step, local_cache_dir)`` on Ray:
    the call returns once the cache holds the step, the driver node's move
    worker moves it (held back here until the test lets it go), and an
    executable's ``sync_move_workers()`` waits until it is there."""
    from alpa_ir.runtime.checkpoint_mover import mover_name

    state = {"w": jax.numpy.arange(12.0).reshape(3, 4)}
    ckpt, cache, go = tmp_path / "ckpt", tmp_path / "cache", tmp_path / "go"
    executable = alpa_ir.parallelize(
        lambda s: {"w": s["w"] * 2}, method=alpa_ir.ShardParallel(backend="xla")
    ).get_executable(state)
    alpa_ir.save_checkpoint(ckpt, state, 1, cache)
    executable.sync_move_workers()
    assert (ckpt / "1").is_dir() and list(cache.iterdir()) == []
    mover = ray.get_actor(mover_name(ray.get_runtime_context().get_node_id()))

    def hold(self: Any) -> None:
        deadline = time.monotonic() + 60
        while not go.exists() and time.monotonic() < deadline:
            time.sleep(0.05)

    mover.__ray_call__.remote(hold)
    alpa_ir.save_checkpoint(ckpt, state, 2, cache, overwrite=True)
    assert not (ckpt / "2").exists() and len(list(cache.iterdir())) == 1  # still cached
    go.touch()
    executable.sync_move_workers()
    assert (ckpt / "2").is_dir() and list(cache.iterdir()) == []
    back = alpa_ir.restore_checkpoint(ckpt, 2, state)
    np.testing.assert_array_equal(back["w"], state["w"])

    # a save that takes the next step number waits for the moves before it:
    # step 3 is still in the cache when the next save (step=None) starts
    go.unlink()
    mover.__ray_call__.remote(hold)
    alpa_ir.save_checkpoint(ckpt, state, 3, cache, overwrite=True)
    saving = threading.Thread(
        target=alpa_ir.save_checkpoint, args=(ckpt, state, None, cache), kwargs={"overwrite": True}
    )
    saving.start()
    saving.join(timeout=1.0)
    assert saving.is_alive()  # waiting for step 3's move
    go.touch()
    saving.join(timeout=60)
    executable.sync_move_workers()
    assert sorted(p.name for p in ckpt.iterdir() if p.name.isdigit()) == ["1", "2", "3", "4"]


def test_a_train_step_and_its_follower_run_on_the_same_hosts(cluster: None) -> None:
    """Alpa's use on a cluster: a train step and an evaluation step that
    follows it (FollowParallel), both on the Ray hosts (the session's backend),
    each compiled while the other holds the host's devices; the eval step
    keeps the train step's parameter specs and both equal one device."""
    from flax.training.train_state import TrainState

    rng = np.random.default_rng(0)
    params = {"w": jax.numpy.asarray(rng.normal(size=(16, 16)), jax.numpy.float32)}
    state = TrainState.create(apply_fn=None, params=params, tx=optax.sgd(0.1))
    batch = {"x": jax.numpy.asarray(rng.normal(size=(32, 16)), jax.numpy.float32)}

    def loss(p: Any, b: dict[str, Any]) -> Any:
        return jax.numpy.mean(jax.numpy.tanh(b["x"] @ p["w"]) ** 2)

    def train_step(state: TrainState, b: dict[str, Any]) -> TrainState:
        return state.apply_gradients(grads=jax.grad(loss)(state.params, b))

    train = alpa_ir.parallelize(train_step, method=alpa_ir.ShardParallel(), donate_argnums=())
    evaluate = alpa_ir.parallelize(loss, method=alpa_ir.FollowParallel(train))
    want = jax.jit(train_step)(state, batch)
    for _ in range(2):  # each executable runs while the other is loaded
        new = train(state, batch)
        np.testing.assert_allclose(evaluate(new.params, batch), loss(want.params, batch), rtol=1e-5)
    np.testing.assert_allclose(new.params["w"], want.params["w"], rtol=1e-5, atol=1e-6)
    assert train.get_last_executable().remote is not None
    assert evaluate.get_last_executable().remote is not None
    specs = evaluate.get_last_executable().get_input_placement_specs()[0]
    assert specs == train.get_last_executable().get_input_placement_specs()[0].params
    train.get_last_executable().close()
    evaluate.get_last_executable().close()
