"""Measure every pipeline schedule in this process: the zoo's tiny GPT, 4 stages
on (1, 2) meshes of the 8 local devices, 8 micro-batches.

For each schedule: the median step time over ``--steps`` timed steps (after
two warm-up steps), and the bubble fraction (the meshes' idle share of the
step) of one recorded step's measured timeline beside the simulated one (the
``simulate`` backend on the ``local-cpu`` preset, analytical stage costs).
``--pictures DIR`` draws each schedule's measured and simulated lanes
(``timeline-<schedule>.png``). Run as
``XLA_FLAGS=--xla_force_host_platform_device_count=8 python tools/bench_schedules.py``.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

SCHEDULES = ("gpipe", "1f1b", "zb-h1", "interleaved-1f1b", "zb-v")


def method_for(schedule: str, stages: int, micro_batches: int, **options: Any) -> Any:
    """The tiny GPT's automatic layers, one per stage (two per stage's mesh under
    interleaved-1f1b and zb-v), each stage on a (1, 2) mesh."""
    from alpa_ir.api.pipeshard import AutoLayerOption, PipeshardParallel, UniformStageOption

    chunks = 2 if schedule in ("interleaved-1f1b", "zb-v") else 1
    return PipeshardParallel(
        num_micro_batches=micro_batches,
        layer_option=AutoLayerOption(layer_num=stages * chunks),
        stage_option=UniformStageOption(num_stages=stages, submesh_logical_shape=(1, 2)),
        devices=range(2 * stages),
        pipeline_schedule=schedule,
        **options,
    )


def measure(
    schedule: str, stages: int, micro_batches: int, steps: int, pictures: Path | None
) -> dict[str, Any]:
    import jax

    import alpa_ir
    from alpa_ir.backends.simulate import plan_from_module, simulate
    from alpa_ir.hardware.clusters import get_cluster
    from alpa_ir.models.train_step import make_train_step

    fn, (state, batch) = make_train_step("gpt-tiny")
    parallel = alpa_ir.parallelize(
        fn, method=method_for(schedule, stages, micro_batches), donate_argnums=()
    )
    executable = parallel.get_executable(state, batch)
    for _ in range(2):
        jax.block_until_ready(parallel(state, batch))
    times = []
    for _ in range(steps):
        t0 = time.perf_counter()
        jax.block_until_ready(parallel(state, batch))
        times.append(time.perf_counter() - t0)
    executable.record_timeline = True
    jax.block_until_ready(parallel(state, batch))
    executable.record_timeline = False
    measured = executable.last_timeline
    cluster = get_cluster("local-cpu", num_devices=2 * stages)
    simulated = simulate(plan_from_module(executable.module, cluster), check_memory=False)
    if pictures is not None:
        executable.plot("timeline", pictures / f"timeline-{schedule}.png")
    return {
        "schedule": schedule,
        "step_ms": statistics.median(times) * 1e3,
        "measured_bubble": measured.bubble_fraction(),
        "simulated_bubble": simulated.bubble_fraction(),
    }


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--schedules", default=",".join(SCHEDULES))
    parser.add_argument("--stages", type=int, default=4)
    parser.add_argument("--micro-batches", type=int, default=8)
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--pictures", type=Path, default=None)
    args = parser.parse_args(argv)
    import jax

    if jax.device_count() < 2 * args.stages:
        print(
            f"bench_schedules: needs {2 * args.stages} devices, found {jax.device_count()} "
            "(XLA_FLAGS=--xla_force_host_platform_device_count=8)",
            file=sys.stderr,
        )
        return 2
    if args.pictures is not None:
        args.pictures.mkdir(parents=True, exist_ok=True)
    print(f"{'schedule':<17} {'step ms':>8} {'bubble measured':>16} {'bubble simulated':>17}")
    for schedule in args.schedules.split(","):
        row = measure(schedule, args.stages, args.micro_batches, args.steps, args.pictures)
        print(
            f"{row['schedule']:<17} {row['step_ms']:8.1f} {row['measured_bubble']:16.1%} "
            f"{row['simulated_bubble']:17.1%}"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
