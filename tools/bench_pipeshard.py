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

``overhead``: the driver's time per instruction, on a chain of 8x8 layers
whose compute is negligible (each stage on one device).

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
    from alpa_ir.api.pipeshard import AutoLayerOption, PipeshardParallel, UniformStageOption

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
    from alpa_ir.api.shard_parallel import ShardParallel
    from alpa_ir.hardware.device_mesh import LogicalDeviceMesh
    from alpa_ir.models import get_config, make_train_step

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
    from alpa_ir.api.shard_parallel import ShardParallel
    from alpa_ir.models import get_config, make_train_step

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


def _tiny_chain(num_layers: int) -> tuple[Any, Any, Any]:
    """A step of ``num_layers`` 8x8 tanh layers (one pipeline boundary
    between each): compute is negligible, so a step's time is the driver's."""
    import jax.numpy as jnp

    import alpa_ir

    def loss(p: list[Any], x: Any) -> Any:
        h = x
        for k, w in enumerate(p):
            if k:
                h = alpa_ir.mark_pipeline_boundary(h)
            h = jnp.tanh(h @ w)
        return jnp.mean(h**2)

    def step(p: list[Any], x: Any) -> tuple[list[Any], Any]:
        value, grads = alpa_ir.value_and_grad(loss)(p, x)
        return [w - 0.1 * g for w, g in zip(p, grads, strict=True)], value

    params = [jnp.eye(8) * 0.5 for _ in range(num_layers)]
    return step, params, jnp.ones((64, 8))


def _overhead(args: argparse.Namespace) -> int:
    import alpa_ir
    from alpa_ir.api.pipeshard import PipeshardParallel, UniformStageOption

    step, params, x = _tiny_chain(args.stages)
    if "ray" in args.backends:
        alpa_ir.init(cluster="ray")
    try:
        for backend in args.backends:
            method = PipeshardParallel(
                num_micro_batches=args.micro_batches,
                stage_option=UniformStageOption(
                    num_stages=args.stages, submesh_logical_shape=(1, 1)
                ),
                devices=range(args.stages),
                backend=backend,  # type: ignore[arg-type]
            )
            parallel = alpa_ir.parallelize(step, method=method, donate_argnums=())
            seconds = _median_time(parallel, params, x, args.repeat)
            executable = parallel.get_executable(params, x)
            count = executable.num_instructions
            print(
                f"{backend}: {args.stages} stages of 1 device, B={args.micro_batches}: "
                f"{seconds * 1e3:.2f} ms / step, {count} instructions, "
                f"{seconds / count * 1e3:.3f} ms per instruction",
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
    overhead = sub.add_parser("overhead", help="driver time per instruction (negligible compute)")
    overhead.add_argument("--stages", type=int, default=4)
    overhead.add_argument("--micro-batches", type=int, default=8)
    overhead.add_argument("--repeat", type=int, default=20)
    overhead.add_argument("--backends", nargs="+", default=["xla", "ray"])
    overhead.set_defaults(run=_overhead)
    args = parser.parse_args(argv)
    return int(args.run(args))


if __name__ == "__main__":
    sys.exit(main())
