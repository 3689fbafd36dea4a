"""Benchmark of intra-operator planning: plan quality and solve time.

``quality`` (default): for each tiny zoo model, mesh and method (auto-sharding
and the baselines: data parallel, ZeRO-2, ZeRO-3, Megatron-style manual,
Alpa's Heuristic), plan and compile the step on the local devices, run one
step and compare it with the single-device step (rtol = atol = 1e-4; "exact"
is ``acc`` when, with micro-batches, it equals only the one-device step with
the same accumulation, as batch-norm models do; with ``B`` micro-batches the
step's batch is ``B`` times the tiny one, so each micro-batch has the rows of
the one-batch step), and
report the ILP objective, the bytes one device sends by the plan's explicit
collectives (predicted) and by the collectives XLA compiled (measured, from
``alpa_ir.hlo_collectives``), and the time of the auto-sharding pass.

``scaling``: the solve time of the auto-sharding pass against graph size: GPT
train steps of the paper's widths (hidden 12288, GPT-3 175B) with 2, 8, 24
and 96 layers, imported abstractly, planned for a 2x4 and an 8x8 mesh (no
execution).

Run: ``python -m alpa_ir.tools.bench_auto_sharding [quality|scaling] --help``.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from dataclasses import dataclass, replace
from typing import Any

from alpa_ir.passmanager.pass_statistics import statistic

METHODS = ("auto", "data", "zero2", "zero3", "megatron", "heuristic")
MESHES = ((1, 8), (2, 4), (4, 2), (1, 4), (2, 2))
MODELS = ("mlp-tiny", "gpt-tiny", "moe-tiny", "wresnet-tiny", "bert-tiny")


@dataclass
class Row:
    model: str
    mesh: tuple[int, int]
    method: str
    micro_batches: int
    objective: float = float("nan")
    predicted_bytes: float = float("nan")
    measured_bytes: float = float("nan")
    solve_time: float = float("nan")
    max_diff: float = float("nan")
    ok: bool = False
    ok_accumulated: bool = False
    """With micro-batches: equal to the one-device step with the same gradient
    accumulation (what batch-norm models can match; see ``measure``)."""
    error: str = ""


def _megatron_specs(args: Any, mesh: Any) -> Any:
    """The zoo's Megatron-style plan (``alpa_ir.models.megatron``) as a pytree of
    PartitionSpecs, leaves named as the IR names the train step's arguments."""
    import jax

    from alpa_ir.frontend.pytree_codec import flat_names
    from alpa_ir.models.megatron import megatron_spec
    from alpa_ir.runtime.devices import partition_spec

    leaves, tree = jax.tree.flatten(args)
    names = flat_names(args, ["state", "batch"])
    specs = [
        None if spec is None else partition_spec(spec, mesh.axis_names)
        for spec in (
            # optimizer state and batch statistics are left to the planner
            None
            if "opt_state" in name or "batch_stats" in name
            else megatron_spec(name, leaf.shape, mesh.shape)
            for name, leaf in zip(names, leaves, strict=True)
        )
    ]
    return jax.tree.unflatten(tree, specs)


def parallel_method(kind: str, mesh: Any, micro: int | None, args: Any) -> Any:
    from alpa_ir.api import parallel

    if kind == "auto":
        return parallel.ShardParallel(mesh, micro)
    if kind == "megatron":
        specs = _megatron_specs(args, mesh)
        return parallel.ManualShardParallel(specs, mesh, micro)
    factory = {
        "data": parallel.DataParallel,
        "zero2": parallel.Zero2Parallel,
        "zero3": parallel.Zero3Parallel,
        "heuristic": parallel.HeuristicParallel,
    }[kind]
    return factory(mesh, micro)


def _close(got: Any, want: Any) -> bool:
    import jax
    import numpy as np

    return all(
        np.allclose(np.asarray(a), np.asarray(b), rtol=1e-4, atol=1e-4)
        for a, b in zip(jax.tree.leaves(got), jax.tree.leaves(want), strict=True)
    )


def measure(model: str, shape: tuple[int, int], kind: str, micro: int) -> Row:
    import jax
    import numpy as np

    from alpa_ir.api.parallel import parallelize
    from alpa_ir.hardware.device_mesh import LogicalDeviceMesh
    from alpa_ir.models import get_config, make_train_step

    row = Row(model, shape, kind, micro)
    # With B micro-batches the step takes B times the tiny batch: each
    # micro-batch keeps the rows of the one-batch step (as gradient
    # accumulation is used), so data parallelism still splits them 8 ways.
    config = get_config(model)
    fn, args = make_train_step(replace(config, batch_size=config.batch_size * micro))
    want = jax.jit(fn)(*args)
    mesh = LogicalDeviceMesh(shape)
    try:
        step = parallelize(
            fn, method=parallel_method(kind, mesh, micro if micro > 1 else None, args)
        )
        executable = step.get_executable(*args)
        got = step(*args)
        row.solve_time = statistic(executable.pass_statistics, "auto-sharding", "solve-time")
        row.objective = executable.auto_sharding_objective
        row.predicted_bytes = executable.predicted_wire_bytes()
        row.measured_bytes = executable.measured_wire_bytes()
        diffs = [
            float(np.max(np.abs(np.asarray(a, np.float64) - np.asarray(b, np.float64)), initial=0))
            for a, b in zip(jax.tree.leaves(got), jax.tree.leaves(want), strict=True)
        ]
        row.max_diff = max(diffs, default=0.0)
        row.ok = _close(got, want)
        if micro > 1 and not row.ok:
            # Batch norm normalises each micro-batch by its own statistics, so
            # accumulation changes the step; compare with one device accumulating.
            single = LogicalDeviceMesh((1, 1), devices=(mesh.devices[0],))  # type: ignore[index]
            one = parallelize(fn, method=parallel_method("auto", single, micro, args))
            row.ok_accumulated = _close(got, one(*args))
    except Exception as exc:  # a row per failure, the table goes on
        row.error = f"{type(exc).__name__}: {str(exc).splitlines()[0]}"[:200]
    return row


def _quality(argv: argparse.Namespace) -> int:
    rows = []
    header = (
        f"{'model':13} {'mesh':6} {'method':9} {'B':>2} {'objective':>12} {'pred bytes':>11} "
        f"{'HLO bytes':>11} {'err %':>6} {'solve s':>8} {'exact':>5}"
    )
    print(header, flush=True)
    for model in argv.models:
        for shape in argv.meshes:
            for micro in argv.micro_batches:
                for kind in argv.methods:
                    row = measure(model, shape, kind, micro)
                    rows.append(row)
                    if row.error:
                        print(
                            f"{model:13} {shape!s:6} {kind:9} {micro:>2} ERROR {row.error}",
                            flush=True,
                        )
                        continue
                    err = (
                        100 * (row.predicted_bytes - row.measured_bytes) / row.measured_bytes
                        if row.measured_bytes
                        else 0.0
                    )
                    print(
                        f"{model:13} {'x'.join(map(str, shape)):6} {kind:9} {micro:>2} "
                        f"{row.objective:12.1f} {row.predicted_bytes:11.0f} {row.measured_bytes:11.0f} "
                        f"{err:6.1f} {row.solve_time:8.2f} {'yes' if row.ok else ('acc' if row.ok_accumulated else 'NO'):>5}",
                        flush=True,
                    )
    _summary(rows)
    if argv.json:
        with open(argv.json, "w") as f:
            json.dump([r.__dict__ for r in rows], f, indent=1)
    return 0 if all(r.ok for r in rows) else 1


def _summary(rows: list[Row]) -> None:
    """Per case: auto-sharding's compiled bytes against the best baseline's, and
    the relative error of the predicted bytes over all rows."""
    print("\nauto-sharding vs the best baseline (bytes one device sends, from the HLO):")
    cases: dict[tuple[str, tuple[int, int], int], list[Row]] = {}
    for row in rows:
        cases.setdefault((row.model, row.mesh, row.micro_batches), []).append(row)
    for (model, mesh, micro), group in cases.items():
        auto = next((r for r in group if r.method == "auto" and not r.error), None)
        others = [r for r in group if r.method != "auto" and not r.error]
        if auto is None or not others:
            continue
        best = min(others, key=lambda r: r.measured_bytes)
        verdict = "ok" if auto.measured_bytes <= best.measured_bytes else "MORE BYTES"
        print(
            f"  {model:13} {'x'.join(map(str, mesh)):5} B={micro}: auto {auto.measured_bytes:.0f} "
            f"(objective {auto.objective:.1f}) vs {best.method} {best.measured_bytes:.0f} "
            f"(objective {best.objective:.1f}): {verdict}"
        )
    errors = [
        abs(r.predicted_bytes - r.measured_bytes) / r.measured_bytes
        for r in rows
        if not r.error and r.measured_bytes
    ]
    if errors:
        within = sum(e <= 0.10 for e in errors)
        print(
            f"predicted vs HLO bytes: {within}/{len(errors)} rows within 10 %, "
            f"largest error {100 * max(errors):.1f} %"
        )


def _scaling(argv: argparse.Namespace) -> int:
    import alpa_ir
    from alpa_ir.hardware.device_mesh import LogicalDeviceMesh
    from alpa_ir.ir.module_utils import main_function
    from alpa_ir.models import get_config, make_train_step
    from alpa_ir.passmanager.pass_manager import PassManager
    from alpa_ir.plugins.registry import default_registry

    base = get_config("gpt3-175b") if "gpt3-175b" in _names() else None
    if base is None:
        from alpa_ir.models.gpt import GPTConfig

        base = GPTConfig(51200, 12288, 96, 96, 1024, batch_size=1024)
    print(
        f"{'layers':>6} {'mesh':6} {'ops':>7} {'nodes':>6} {'vars':>6} {'import s':>8} "
        f"{'plan s':>8} {'solve s':>8} {'objective':>12}"
    )
    for layers in argv.layers:
        config = replace(base, num_layers=layers)
        start = time.perf_counter()
        fn, args = make_train_step(config, abstract=True)
        text = str(alpa_ir.import_jax(fn, *args, donate_argnums=(0,), batch_argnums=(1,)))
        imported = time.perf_counter() - start
        for shape in argv.meshes:
            module = alpa_ir.parse_module(text)
            function = main_function(module)
            mesh = LogicalDeviceMesh(shape)
            module.body.block.insert_op_before(mesh.to_op("mesh"), function)
            from xdsl.dialects.builtin import FlatSymbolRefAttr

            function.attributes["mesh.mesh"] = FlatSymbolRefAttr("mesh")
            ops = len(list(function.body.block.ops))
            pipeline = (
                "builtin.module(merge-trivial-ops,auto-sharding{"
                f"time-limit={argv.time_limit} repeated-layers={argv.repeated_layers}}})"
            )
            start = time.perf_counter()
            try:
                stats = PassManager(default_registry(), pipeline).execute(module).statistics
                nodes = int(statistic(stats, "auto-sharding", "num-nodes"))
                variables = int(statistic(stats, "auto-sharding", "num-variables"))
                objective = function.attributes["sharding.objective"].value.data  # type: ignore[attr-defined]
                solve = statistic(stats, "auto-sharding", "solve-time")
                planned = time.perf_counter() - start
                print(
                    f"{layers:6} {'x'.join(map(str, shape)):6} {ops:7} {nodes:6} {variables:6} "
                    f"{imported:8.1f} {planned:8.1f} {solve:8.1f} {objective:12.6g}",
                    flush=True,
                )
            except Exception as exc:
                print(f"{layers:6} {'x'.join(map(str, shape)):6} {ops:7} ERROR {exc}", flush=True)
    return 0


def _names() -> list[str]:
    from alpa_ir.models.registry import list_configs

    return list_configs()


def _shape(text: str) -> tuple[int, int]:
    a, b = (int(x) for x in text.split("x"))
    return (a, b)


def main(args: list[str] | None = None) -> int:
    os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=8")
    parser = argparse.ArgumentParser(
        prog="bench_auto_sharding", description=__doc__.splitlines()[0]
    )
    sub = parser.add_subparsers(dest="mode")
    q = sub.add_parser("quality", help="plan quality and numerics of the tiny zoo models")
    q.add_argument("--models", nargs="+", default=list(MODELS))
    q.add_argument("--meshes", nargs="+", type=_shape, default=list(MESHES), help="e.g. 2x4")
    q.add_argument("--methods", nargs="+", choices=METHODS, default=list(METHODS))
    q.add_argument("--micro-batches", nargs="+", type=int, default=[1])
    q.add_argument("--json", help="also write the rows to this file")
    s = sub.add_parser("scaling", help="solve time against GPT depth (paper widths)")
    s.add_argument("--layers", nargs="+", type=int, default=[2, 8, 24, 96])
    s.add_argument("--meshes", nargs="+", type=_shape, default=[(2, 4), (8, 8)])
    s.add_argument("--time-limit", type=float, default=600.0)
    s.add_argument(
        "--repeated-layers",
        choices=("auto", "share", "separate"),
        default="auto",
        help="share the ILP variables of identical layers (auto: for large graphs)",
    )
    argv = parser.parse_args(args)
    if argv.mode == "scaling":
        return _scaling(argv)
    if argv.mode is None:
        argv = parser.parse_args(["quality", *(args or sys.argv[1:])])
    return _quality(argv)


if __name__ == "__main__":
    sys.exit(main())
