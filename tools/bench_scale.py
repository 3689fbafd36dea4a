"""Planning time and planner memory of the search that scales (issue #42):
a zoo model on 1,024 to 16,384 GPUs of a preset, each GPU count planned in a
fresh process (``python tools/bench_scale.py``).

Each count is planned as :mod:`alpa_ir.pipeline.pipeline_replicas` plans it:
the step traced abstractly at the micro-batch shape with its automatic layers
(as ``alpa-bench``), one cost table on the largest pipeline (``layer-sum``
mode, the ``power-of-two`` submesh space), then every replica count's stage
DP and the replicas' gradient all-reduce. The planning time is the child's
wall clock from the trace to the plan (the interpreter's start and imports
excluded); the peak memory is the largest resident set of the planning
process (``ru_maxrss``) and of any costing worker it started, and their sum.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import time
from collections.abc import Sequence
from typing import Any

from alpa_ir.pipeline.pipeline_replicas import DEFAULT_MAX_PIPELINE_DEVICES

DEFAULT_GPUS = (1024, 3072, 8192, 16384)


def plan_once(
    name: str,
    preset: str,
    gpus: int,
    num_micro_batches: int,
    max_pipeline_gpus: int,
    workers: int,
    schedule: str,
) -> dict[str, Any]:
    """Plan ``name`` on ``gpus`` GPUs of ``preset`` in this process (module docstring)."""
    from alpa_ir.costs.analytical_stage_cost import AnalyticalStageCostModel
    from alpa_ir.costs.costing_workers import StartedWorkers
    from alpa_ir.costs.function_plan import bound_cost_model
    from alpa_ir.hardware.clusters import get_cluster
    from alpa_ir.ir.module_utils import main_function
    from alpa_ir.models.train_step import train_step_flops
    from alpa_ir.pipeline.layer_phases import layer_phase_flops
    from alpa_ir.pipeline.layer_ranges import LayerRanges
    from alpa_ir.pipeline.pipeline_replicas import (
        plan_replicated,
        planned_replica_counts,
        scaled_cost_table,
    )
    from alpa_ir.plugins.registry import default_registry
    from alpa_ir.tools.bench_suite import (
        bench_optimizer,
        default_layers,
        early_workers,
        trace,
    )

    cluster = get_cluster(preset, num_devices=gpus)
    counts = planned_replica_counts(cluster, num_micro_batches, max_pipeline_gpus)
    stage_pass = default_registry().get_pass("construct-stages")(
        cluster=preset,
        num_micro_batches=num_micro_batches,
        cost_mode="layer-sum",
        remat=True,
        zero=True,
        fusion=True,
        memory_fallback=True,
        optimizer_state_factor=bench_optimizer(name)[1],
        time_limit=60.0,
        cost_model="auto",
    )
    options = stage_pass.cost_options()
    flops = train_step_flops(name)
    t0 = time.perf_counter()
    cpu0 = sum(
        getattr(resource.getrusage(who), f)
        for who in (resource.RUSAGE_SELF, resource.RUSAGE_CHILDREN)
        for f in ("ru_utime", "ru_stime")
    )
    load = os.getloadavg()[0]
    with StartedWorkers(early_workers(flops, workers)) as started:
        module = trace(name, num_micro_batches, default_layers(name))
        t1 = time.perf_counter()
        ranges = LayerRanges(main_function(module))
        table = scaled_cost_table(
            ranges,
            cluster,
            AnalyticalStageCostModel(options),
            counts,
            workers=workers,
            progress=False,
            phase_flops=layer_phase_flops(ranges),
            started=started,
        )
    t2 = time.perf_counter()
    found = plan_replicated(
        table,
        cluster,
        num_micro_batches,
        schedule,
        replicas=counts,
        pricer=bound_cost_model(options.cost_model, cluster),
        remat=True,
    )
    t3 = time.perf_counter()
    me, kids = (resource.getrusage(who) for who in (resource.RUSAGE_SELF, resource.RUSAGE_CHILDREN))
    own = me.ru_maxrss / 2**20  # KiB -> GiB
    workers_peak = kids.ru_maxrss / 2**20
    cpu = me.ru_utime + me.ru_stime + kids.ru_utime + kids.ru_stime - cpu0
    step = found.iteration_time
    return {
        "model": name,
        "cluster": preset,
        "gpus": gpus,
        "num_micro_batches": num_micro_batches,
        "views": sum(len(v) for v in table.views.values()),
        "pairs_costed": table.pairs_costed,
        "replica_counts": counts,
        "replicas": found.replicas,
        "pipeline_gpus": found.pipeline.num_devices,
        "stages": [
            [s.first, s.last, list(s.submesh), list(s.mesh.shape)] for s in found.plan.stages
        ],
        "iteration_time": step,
        "sync_seconds": found.sync_seconds,
        "pflops": flops / step / 1e15,
        "time": {
            "trace": t1 - t0,
            "costing": t2 - t1,
            "dp": t3 - t2,
            "total": t3 - t0,
            "cpu": cpu,
            "load_at_start": load,
        },
        "peak_rss_gib": {"planner": own, "worker": workers_peak, "sum": own + workers_peak},
    }


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="gpt3-39b")
    parser.add_argument("--cluster", default="dgx-a100")
    parser.add_argument(
        "--gpus",
        default=",".join(map(str, DEFAULT_GPUS)),
        help="comma-separated GPU counts, each planned in a fresh process",
    )
    parser.add_argument("--micro-batches", type=int, default=128)
    parser.add_argument("--max-pipeline-gpus", type=int, default=DEFAULT_MAX_PIPELINE_DEVICES)
    parser.add_argument("--workers", type=int, default=os.cpu_count() or 1)
    parser.add_argument("--schedule", default="1f1b")
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    return parser


def _row(r: dict[str, Any]) -> str:
    if "error" in r:
        return f"| {r['gpus']} | {r['error']} |"
    t, m = r["time"], r["peak_rss_gib"]
    return (
        f"| {r['model']} | {r['gpus']:,} | {r['replicas']} x {r['pipeline_gpus']} "
        f"({len(r['stages'])} stages) | {r['views']} | {t['total']:.1f} "
        f"({t['trace']:.1f} / {t['costing']:.1f} / {t['dp']:.2f}) | {t['cpu']:.1f} | "
        f"{t['load_at_start']:.0f} | "
        f"{m['planner']:.2f} + {m['worker']:.2f} | {r['iteration_time']:.3g} "
        f"(sync {r['sync_seconds']:.3g}) | {r['pflops']:.3g} |"
    )


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    gpus = [int(g) for g in args.gpus.split(",")]
    if args.child:
        result = plan_once(
            args.model,
            args.cluster,
            gpus[0],
            args.micro_batches,
            args.max_pipeline_gpus,
            args.workers,
            args.schedule,
        )
        print(json.dumps(result))
        return 0
    results = []
    for count in gpus:
        command = [
            sys.executable,
            __file__,
            "--child",
            f"--model={args.model}",
            f"--cluster={args.cluster}",
            f"--gpus={count}",
            f"--micro-batches={args.micro_batches}",
            f"--max-pipeline-gpus={args.max_pipeline_gpus}",
            f"--workers={args.workers}",
            f"--schedule={args.schedule}",
        ]
        done = subprocess.run(command, capture_output=True, text=True, check=False)
        if done.returncode:
            results.append({"gpus": count, "error": done.stderr.strip().splitlines()[-1]})
        else:
            results.append(json.loads(done.stdout.strip().splitlines()[-1]))
        if not args.json:
            print(_row(results[-1]), flush=True)
    if args.json:
        print(json.dumps(results, indent=1))
    return 0


if __name__ == "__main__":
    os.environ["JAX_PLATFORMS"] = "cpu"
    sys.exit(main())
