"""PipeshardParallel on the local devices: the numerical oracle over a matrix of
plans, and iteration times against ShardParallel.

``oracle``: for each tiny model, stage count (automatic layers, uniform
stages on equal submeshes), schedule and micro-batch count, three training
steps must give the losses and parameters of the single-device step (rtol
1e-4). With ``B`` micro-batches the step takes ``B`` times the tiny batch.
Wide-ResNet's batch norm normalises each micro-batch by its own statistics,
so with ``B > 1`` it is compared with one device accumulating the same way
("acc" in the table).

``time``: median iteration time of the tiny GPT on 8 CPU devices under
ShardParallel and PipeshardParallel on the xla and ray backends, with the
number of stage calls and instructions per step.

Run: ``python -m alpa_ir.tools.bench_pipeshard oracle`` (``--help`` for options).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from dataclasses import replace
from typing import Any

STEPS = 3


def _close(got: Any, want: Any) -> bool:
    import jax
    import numpy as np

    return all(
        np.allclose(a, b, rtol=1e-4, atol=1e-5)
        for a, b in zip(jax.tree.leaves(got), jax.tree.leaves(want), strict=True)
    )


def _run_steps(step: Any, state: Any, batch: Any) -> list[Any]:
    outs = []
    for _ in range(STEPS):
        state, loss = step(state, batch)
        outs.append((state, loss))
    return outs


def _method(stages: int, micro: int, schedule: str, backend: str = "xla") -> Any:
    from alpa_ir.pipeshard import AutoLayerOption, PipeshardParallel, UniformStageOption

    return PipeshardParallel(
        num_micro_batches=micro,
        layer_option=AutoLayerOption(layer_num=stages),
        stage_option=UniformStageOption(num_stages=stages),
        pipeline_schedule=schedule,  # type: ignore[arg-type]
        backend=backend,  # type: ignore[arg-type]
    )


def oracle_row(model: str, stages: int, schedule: str, micro: int) -> str:
    import jax

    import alpa_ir
    from alpa_ir.device_mesh import LogicalDeviceMesh
    from alpa_ir.models import get_config, make_train_step
    from alpa_ir.parallel import ShardParallel

    config = get_config(model)
    fn, (state, batch) = make_train_step(replace(config, batch_size=config.batch_size * micro))
    start = time.perf_counter()
    try:
        step = alpa_ir.parallelize(fn, method=_method(stages, micro, schedule), donate_argnums=())
        step.get_executable(state, batch)
        compile_s = time.perf_counter() - start
        got = _run_steps(step, state, batch)
        verdict = "yes" if _close(got, _run_steps(jax.jit(fn), state, batch)) else "NO"
        if verdict == "NO" and micro > 1:
            single = LogicalDeviceMesh((1, 1), devices=(0,))
            one = alpa_ir.parallelize(
                fn, method=ShardParallel(single, num_micro_batches=micro), donate_argnums=()
            )
            verdict = "acc" if _close(got, _run_steps(one, state, batch)) else "NO"
    except Exception as exc:  # one row per failure; the table goes on
        return f"{model:13} {stages:2} {schedule:6} {micro:2}  ERROR {type(exc).__name__}: {str(exc).splitlines()[0][:120]}"
    return f"{model:13} {stages:2} {schedule:6} {micro:2} {compile_s:8.1f} {verdict:>5}"


def _oracle(args: argparse.Namespace) -> int:
    print(f"{'model':13} {'S':>2} {'sched':6} {'B':>2} {'compile':>8} {'equal':>5}", flush=True)
    bad = 0
    for model in args.models:
        for stages in args.stages:
            for schedule in args.schedules:
                for micro in args.micro_batches:
                    row = oracle_row(model, stages, schedule, micro)
                    bad += row.rstrip().endswith("NO") or "ERROR" in row
                    print(row, flush=True)
    print(f"{bad} rows not equal", flush=True)
    return 1 if bad else 0


def _median_time(step: Any, state: Any, batch: Any, repeat: int) -> float:
    import jax

    jax.block_until_ready(step(state, batch))
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        jax.block_until_ready(step(state, batch))
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def _time(args: argparse.Namespace) -> int:
    import alpa_ir
    from alpa_ir.models import get_config, make_train_step
    from alpa_ir.parallel import ShardParallel

    config = get_config(args.model)
    micro = args.micro_batches
    fn, (state, batch) = make_train_step(replace(config, batch_size=config.batch_size * micro))
    shard = alpa_ir.parallelize(
        fn, method=ShardParallel(num_micro_batches=micro), donate_argnums=()
    )
    t_shard = _median_time(shard, state, batch, args.repeat)
    print(f"ShardParallel (1x8), B={micro}: {t_shard * 1e3:.1f} ms / step", flush=True)
    if "ray" in args.backends:
        alpa_ir.init(cluster="ray")
    try:
        for backend in args.backends:
            for stages in args.stages:
                method = _method(stages, micro, "1f1b", backend)
                pipe = alpa_ir.parallelize(fn, method=method, donate_argnums=())
                t_pipe = _median_time(pipe, state, batch, args.repeat)
                executable = pipe.get_executable(state, batch)
                program = executable.program
                runs = sum(i.kind == "run" for ins in program.instructions.values() for i in ins)
                total = sum(len(ins) for ins in program.instructions.values())
                print(
                    f"PipeshardParallel ({backend}) {stages} stages, B={micro}: "
                    f"{t_pipe * 1e3:.1f} ms / step, {runs} stage calls, {total} instructions",
                    flush=True,
                )
                executable.close()
    finally:
        if "ray" in args.backends:
            alpa_ir.shutdown()
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="bench_pipeshard", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    oracle = sub.add_parser("oracle", help="pipeline plans vs the single-device step")
    oracle.add_argument("--models", nargs="+", default=["gpt-tiny", "moe-tiny", "wresnet-tiny"])
    oracle.add_argument("--stages", nargs="+", type=int, default=[2, 4])
    oracle.add_argument("--schedules", nargs="+", default=["gpipe", "1f1b"])
    oracle.add_argument("--micro-batches", nargs="+", type=int, default=[1, 2, 4])
    oracle.set_defaults(run=_oracle)
    timing = sub.add_parser("time", help="iteration time, ShardParallel vs PipeshardParallel")
    timing.add_argument("--model", default="gpt-tiny")
    timing.add_argument("--stages", nargs="+", type=int, default=[2, 4])
    timing.add_argument("--micro-batches", type=int, default=2)
    timing.add_argument("--repeat", type=int, default=10)
    timing.add_argument("--backends", nargs="+", default=["xla", "ray"])
    timing.set_defaults(run=_time)
    args = parser.parse_args(argv)
    return int(args.run(args))


if __name__ == "__main__":
    sys.exit(main())
