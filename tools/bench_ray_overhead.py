"""Benchmark: what the driver of the ray backend adds to a pipeline step.

Compiles the tiny GPT with ``PipeshardParallel`` (2 stages of 4 CPU devices,
2 micro-batches) on the ray backend (one host worker per Ray node: with
``--hosts 2`` two local Ray nodes of 4 devices, one stage on each, every
transfer an XLA program between the two processes; with ``--hosts 1`` one
node of 8) and on the xla backend (the same instruction lists interpreted
in this process), runs ``--steps`` timed steps after a warm-up with the
timeline recorded, and prints per step: the driver's wall time, the window
in which the workers executed instructions (first start to last end), the
number of instructions, and the difference per instruction: what the driver
adds (splitting and shipping the inputs, starting the step on every worker,
collecting the outputs) spread over the instructions it runs.

Run: ``python -m alpa_ir.tools.bench_ray_overhead``.
"""

from __future__ import annotations

import os
import statistics
import sys
import time
from collections.abc import Sequence
from typing import Any

from alpa_ir.tools.cli_args import OneLineParser, positive_int


def _measure(executable: Any, state: Any, batch: Any, steps: int) -> dict[str, float]:
    executable(state, batch)  # warm-up: compiles on the workers
    executable.record_timeline = True
    walls, windows = [], []
    for _ in range(steps):
        start = time.perf_counter()
        executable(state, batch)
        walls.append(time.perf_counter() - start)
        events = executable.runner.events
        windows.append(max(e.end for e in events) - min(e.start for e in events))
    count = sum(len(v) for v in executable.program.instructions.values())
    wall, window = statistics.median(walls), statistics.median(windows)
    return {
        "wall": wall,
        "window": window,
        "instructions": count,
        "per_instruction": (wall - window) / count,
    }


def bench(steps: int, hosts: int) -> dict[str, dict[str, float]]:
    import contextlib

    import alpa_ir
    from alpa_ir.models import make_train_step
    from alpa_ir.runtime.ray_cluster import local_cluster

    step, (state, batch) = make_train_step("gpt-tiny")
    out = {}
    stack = contextlib.ExitStack()
    for backend in ("xla", "ray"):
        if backend == "ray":
            stack.enter_context(local_cluster(hosts, 8 // hosts))
        method = alpa_ir.PipeshardParallel(
            num_micro_batches=2,
            layer_option=alpa_ir.AutoLayerOption(layer_num=2),
            stage_option=alpa_ir.UniformStageOption(num_stages=2),
            backend=backend,  # type: ignore[arg-type]
        )
        executable = alpa_ir.parallelize(step, method=method, donate_argnums=()).get_executable(
            state, batch
        )
        try:
            out[backend] = _measure(executable, state, batch, steps)
        finally:
            executable.close()
    stack.close()
    return out


def main(argv: Sequence[str] | None = None) -> int:
    parser = OneLineParser(prog="bench_ray_overhead", description=__doc__)
    parser.add_argument("--steps", type=positive_int, default=10, help="timed steps")
    parser.add_argument(
        "--hosts", type=int, choices=(1, 2), default=2, help="local Ray nodes (8 devices in all)"
    )
    args = parser.parse_args(argv)
    os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=8")
    results = bench(args.steps, args.hosts)
    print(
        f"tiny GPT, 2 stages x 4 devices, 2 micro-batches, ray on {args.hosts} host(s) "
        f"(median of {args.steps} steps):"
    )
    for backend, r in results.items():
        print(
            f"  {backend:4s} step {r['wall'] * 1e3:8.1f} ms, workers busy {r['window'] * 1e3:8.1f} ms,"
            f" {r['instructions']:.0f} instructions, driver adds "
            f"{r['per_instruction'] * 1e3:.2f} ms per instruction"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
