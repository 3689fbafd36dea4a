"""The ray backend on this machine's GPUs: run where GPUs are, with
``ALPA_TEST_GPUS=N`` (the GPUs of this machine); skipped elsewhere (CI has none).

A Ray node of this machine declares the N GPUs and its host worker runs the
step on them (``JAX_PLATFORMS=cuda``), while this process plans and computes
the one-device reference on its CPU. The worker computes float32 products in
full precision (``JAX_DEFAULT_MATMUL_PRECISION=highest``, set here before
the node starts, so its workers inherit it): TF32 would differ from the CPU
reference by more than the tolerance. Several processes on one GPU (the
node's worker, a second node's) share its memory: XLA does not preallocate.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import jax
import pytest
from ray_cluster_fixture import joined_cluster
from zoo_fixtures import check_tiny_steps, max_abs_diff, same_steps, tiny_step

import alpa_ir

GPUS = int(os.environ.get("ALPA_TEST_GPUS", "0") or 0)
pytestmark = [
    pytest.mark.ray,
    pytest.mark.xdist_group("multi_host"),
    pytest.mark.skipif(GPUS < 1, reason="set ALPA_TEST_GPUS=<GPUs of this machine> to run"),
]
STEPS = 3


@pytest.fixture(scope="module")
def gpu_node() -> Iterator[Any]:
    os.environ["JAX_DEFAULT_MATMUL_PRECISION"] = "highest"
    os.environ["XLA_PYTHON_CLIENT_PREALLOCATE"] = "false"
    with joined_cluster({"num_cpus": 2, "num_gpus": GPUS}) as cluster:
        yield cluster


def _platforms(executable: Any) -> set[str]:
    import ray

    workers = executable.remote.workers.values()
    return set(
        ray.get([w.__ray_call__.remote(lambda _: jax.devices()[0].platform) for w in workers])
    )


def test_a_mesh_of_the_gpus_equals_one_device(gpu_node: Any) -> None:
    fn, (state, batch) = tiny_step("mlp-tiny")
    method = alpa_ir.ShardParallel(alpa_ir.LogicalDeviceMesh((1, GPUS)), backend="ray")
    parallel = alpa_ir.parallelize(fn, method=method, donate_argnums=())
    executable = parallel.get_executable(state, batch)
    try:
        assert _platforms(executable) == {"gpu"}
        check_tiny_steps(parallel, "mlp-tiny", STEPS)
    finally:
        executable.close()


def test_a_pipeline_on_the_gpus_equals_one_device(gpu_node: Any, tmp_path: Path) -> None:
    """Two micro-batches, 1F1B, as many stages as GPUs (at most 2); then a
    checkpoint written by the GPU host, restored in this process."""
    from pipeshard_fixtures import _example, _step

    state, batch = _example()
    method = alpa_ir.PipeshardParallel(
        num_micro_batches=2,
        stage_option=alpa_ir.UniformStageOption(num_stages=min(GPUS, 2)),
        backend="ray",
    )
    parallel = alpa_ir.parallelize(_step, method=method, donate_argnums=())
    executable = parallel.get_executable(state, batch)
    try:
        assert _platforms(executable) == {"gpu"}
        ours, _ = same_steps(parallel, _step, state, batch, STEPS, state_tol=1e-5)
        saved = alpa_ir.save_checkpoint(tmp_path / "gpu", ours, step=STEPS, on=executable)
        assert max_abs_diff(alpa_ir.restore_checkpoint(saved, target=ours), ours) == 0
    finally:
        executable.close()
