"""bench-local-clock: the planner's predicted step times held against this machine's clock.

With a device profile ``alpa-calibrate`` wrote on these devices (``--profile``),
each case (a zoo model and a method) is planned with :func:`alpa_ir.compile`,
its step time predicted by the planner's cost model on the local devices
priced by that profile, then run on the 8 local CPU devices: the median of
``--steps`` timed steps after ``--warmup`` untimed ones (the first compiles),
every step waited for. Printed per case: predicted seconds, measured seconds,
their ratio, and the process's CPU seconds per step over the machine's cores
(what the step would take alone on a machine it kept fully busy: on a shared
machine the wall time grows with the others' load, this much less); then the cases within ±25 %, the median |error| and the load
average of the machine before and after (the devices share its cores, so
another process's work lengthens the measured steps).

Predictions, from the same cost model the planner plans with
(:mod:`alpa_ir.costs.analytical_stage_cost` reading the profile through
``Cluster.with_profile``):

* one mesh (``ShardParallel``, ``DataParallel``, ``Zero3Parallel``): the plan's
  predicted step time (:attr:`alpa_ir.api.plan.Plan.step_time`): the planned
  program priced on its mesh of the profiled ``local-cpu`` cluster;
* a pipeline (``PipeshardParallel`` with given stages): the planned module
  simulated (the ``simulate`` backend: every stage function priced by the
  analytical stage cost model on its mesh, the schedule played out).

Usage: ``python tools/bench_local_clock.py --profile device_profile.json
[--cases gpt,mlp-dp,...] [--steps 5] [--warmup 2] [--json FILE]``;
``--list`` names the cases; ``--cases single --size gpu`` runs every model
on one device at GPU sizes in bfloat16 (``tools/gpu_calibrate_check.sh``).
About 10 minutes for all of them here (each plan compiles its step for the
8 devices).
"""

from __future__ import annotations

import json
import os
import resource
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from alpa_ir.errors import AlpaError
from alpa_ir.tools.cli_args import OneLineParser, positive_int

PROG = "bench-local-clock"
TOLERANCE = 0.25
"""A prediction holds when ``|predicted / measured − 1| <= TOLERANCE``."""


@dataclass(frozen=True)
class Case:
    """One plan to hold against the clock: ``model`` (a key of :func:`models`),
    ``method`` (a key of :func:`methods`)."""

    name: str
    model: str
    method: str


@dataclass(frozen=True)
class Row:
    """One case's outcome (seconds; ``error`` instead when it failed)."""

    name: str
    model: str
    method: str
    predicted: float | None = None
    measured: float | None = None
    plan_seconds: float | None = None
    cpu_per_core: float | None = None
    """CPU seconds per step over the machine's cores (:func:`measure`)."""
    error: str = ""

    @property
    def ratio(self) -> float | None:
        if self.predicted is None or not self.measured:
            return None
        return self.predicted / self.measured

    @property
    def holds(self) -> bool:
        ratio = self.ratio
        return ratio is not None and abs(ratio - 1.0) <= TOLERANCE


def models(size: str = "cpu") -> dict[str, Any]:
    """The zoo's models at sizes where one step takes ~0.2-5 s on 8 CPU
    devices sharing 2 cores (batches divide by 8 and by 4 micro-batches × 2);
    ``size="gpu"``: in bfloat16, large enough for ~0.05-1 s on one H100/H200."""
    import jax.numpy as jnp

    from alpa_ir.models import GPTConfig, MLPConfig, MoEConfig, WResNetConfig

    if size == "gpu":
        bf16 = jnp.bfloat16
        return {
            "gpt": GPTConfig(
                vocab_size=8192, hidden_size=2048, num_layers=8, num_heads=16, seq_len=1024,
                batch_size=32, dtype=bf16,
            ),
            "mlp": MLPConfig(
                input_dim=4096, hidden_size=8192, num_layers=8, output_dim=4096,
                batch_size=8192, dtype=bf16,
            ),
            "moe": MoEConfig(
                vocab_size=8192, hidden_size=1024, num_layers=8, num_heads=16, seq_len=1024,
                batch_size=16, num_experts=8, expert_group_size=2048, dtype=bf16,
            ),
            "wresnet": WResNetConfig(
                image_size=64, num_classes=128, stage_sizes=(2, 2, 2), base_channels=64,
                width_factor=2, batch_size=128, dtype=bf16,
            ),
            "tiny": MLPConfig(
                input_dim=32, hidden_size=64, num_layers=2, output_dim=16, batch_size=16
            ),
        }  # fmt: skip
    return {
        "gpt": GPTConfig(
            vocab_size=2048, hidden_size=256, num_layers=4, num_heads=8, seq_len=128,
            batch_size=16,
        ),
        "mlp": MLPConfig(
            input_dim=1024, hidden_size=2048, num_layers=4, output_dim=1024, batch_size=256
        ),
        "moe": MoEConfig(
            vocab_size=2048, hidden_size=256, num_layers=4, num_heads=8, seq_len=128,
            batch_size=16, num_experts=8, expert_group_size=256,
        ),
        "wresnet": WResNetConfig(
            image_size=32, num_classes=16, stage_sizes=(1, 1, 1), base_channels=64,
            width_factor=2, batch_size=32,
        ),
        "tiny": MLPConfig(input_dim=32, hidden_size=64, num_layers=2, output_dim=16, batch_size=16),
    }  # fmt: skip


def methods() -> dict[str, Callable[[], Any]]:
    """Method factories by short name (each call a fresh method)."""
    import alpa_ir
    from alpa_ir.hardware.device_mesh import LogicalDeviceMesh

    def shard(shape: tuple[int, int]) -> Callable[[], Any]:
        return lambda: alpa_ir.ShardParallel(devices=LogicalDeviceMesh(shape))

    def pipeline(stages: int, schedule: str, micro_batches: int = 4) -> Callable[[], Any]:
        return lambda: alpa_ir.PipeshardParallel(
            num_micro_batches=micro_batches,
            layer_option=alpa_ir.AutoLayerOption(layer_num=stages),
            stage_option=alpa_ir.UniformStageOption(num_stages=stages),
            pipeline_schedule=schedule,
        )

    return {
        "single": shard((1, 1)),
        "shard-2x4": shard((2, 4)),
        "shard-1x8": shard((1, 8)),
        "shard-8x1": shard((8, 1)),
        "data": lambda: alpa_ir.DataParallel(),
        "zero3": lambda: alpa_ir.Zero3Parallel(),
        "pipe2-1f1b": pipeline(2, "1f1b"),
        "pipe2-gpipe": pipeline(2, "gpipe"),
        "pipe4-1f1b": pipeline(4, "1f1b"),
        "pipe4-gpipe": pipeline(4, "gpipe"),
    }


def cases() -> tuple[Case, ...]:
    """The plans of the table: every method on GPT, the others spread over
    MLP, MoE and Wide-ResNet (16 plans)."""
    plan = [
        ("gpt", m)
        for m in (
            "shard-2x4", "shard-1x8", "shard-8x1", "data", "zero3",
            "pipe2-1f1b", "pipe2-gpipe", "pipe4-1f1b", "pipe4-gpipe",
        )
    ]  # fmt: skip
    plan += [("mlp", "shard-2x4"), ("mlp", "data"), ("mlp", "zero3"), ("mlp", "pipe2-gpipe")]
    plan += [("moe", "shard-2x4"), ("moe", "pipe2-1f1b")]
    plan += [("wresnet", "shard-1x8"), ("wresnet", "data"), ("wresnet", "pipe2-1f1b")]
    return tuple(Case(f"{model}/{method}", model, method) for model, method in plan)


def tiny_case() -> Case:
    """A plan small enough for a test."""
    return Case("tiny/shard-2x4", "tiny", "shard-2x4")


def single_device_cases() -> tuple[Case, ...]:
    """Every model on one device (``--cases single``: a host with one GPU)."""
    return tuple(Case(f"{m}/single", m, "single") for m in ("gpt", "mlp", "moe", "wresnet"))


def local_cluster(profile: Any, num_devices: int) -> Any:
    """The ``local-cpu`` cluster of ``num_devices`` priced by ``profile``."""
    from alpa_ir.hardware.clusters import local_cpu

    return local_cpu().one_node(num_devices).with_profile(profile)


@dataclass
class PlannedStages:
    """The stage cost model protocol over functions already planned (a
    pipeline's stage functions after ``shard-stages``): each priced as planned
    (:meth:`AnalyticalStageCostModel.price_planned`), not planned again."""

    model: Any

    def stage_cost(
        self, function: Any, mesh: Any, cluster: Any, param_args: Sequence[int] | None = None
    ) -> Any:
        return self.model.price_planned(function, mesh, cluster, param_args)


def predict(plan: Any, cluster: Any) -> float:
    """The predicted seconds of ``plan``'s step on ``cluster`` (module docstring)."""
    from alpa_ir.api.plan import planned_step_time
    from alpa_ir.costs.analytical_stage_cost import AnalyticalStageCostModel
    from alpa_ir.costs.stage_cost import StageCostOptions
    from alpa_ir.dialects.pipeline import PlanOp
    from alpa_ir.ir.module_utils import top_level_ops

    options = StageCostOptions(fusion=True)
    if any(True for _ in top_level_ops(plan.module, PlanOp)):
        from alpa_ir.backends.simulate import plan_from_module, simulate

        stages = PlannedStages(AnalyticalStageCostModel(options))
        sim = plan_from_module(plan.module, cluster, stages)  # type: ignore[arg-type]
        return float(simulate(sim, check_memory=False).iteration_time)
    seconds = planned_step_time(plan.module, cluster, options)
    if seconds is None:
        raise AlpaError(f"{plan.method}: the plan has no predicted step time")
    return seconds


def measure(executable: Any, args: tuple[Any, ...], steps: int, warmup: int) -> tuple[float, float]:
    """Median wall seconds of ``steps`` calls after ``warmup`` (each waited
    for), and the median CPU seconds this process spent per call divided by
    the machine's cores: what the step would take alone on the machine if it
    kept every core busy (a load-independent companion of the wall time)."""
    import jax

    for _ in range(warmup):
        jax.block_until_ready(executable(*args))
    walls, cpus = [], []
    for _ in range(steps):
        start, cpu = time.perf_counter(), _cpu_seconds()
        jax.block_until_ready(executable(*args))
        walls.append(time.perf_counter() - start)
        cpus.append(_cpu_seconds() - cpu)
    return statistics.median(walls), statistics.median(cpus) / (os.cpu_count() or 1)


def _cpu_seconds() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def run_case(case: Case, profile: Any, steps: int, warmup: int, size: str = "cpu") -> Row:
    """Plan, predict and measure one case; an error is the row's one line."""
    import jax

    import alpa_ir
    from alpa_ir.models import make_train_step

    base = Row(case.name, case.model, case.method)
    try:
        fn, args = make_train_step(models(size)[case.model])
        start = time.perf_counter()
        plan = alpa_ir.compile(fn, *args, method=methods()[case.method](), donate_argnums=())
        planned = time.perf_counter() - start
        predicted = predict(plan, local_cluster(profile, jax.device_count()))
        measured, cpu = measure(plan.executable(), args, steps, warmup)
    except AlpaError as err:
        return Row(**{**asdict(base), "error": str(err)})
    return Row(case.name, case.model, case.method, predicted, measured, planned, cpu)


def format_row(row: Row) -> str:
    if row.error:
        return f"{row.name:<22} error: {row.error}"
    ratio = row.ratio
    assert row.predicted is not None and row.measured is not None and ratio is not None
    mark = "ok" if row.holds else "off"
    cpu = f"{row.cpu_per_core:10.4g}" if row.cpu_per_core is not None else f"{'':10}"
    return f"{row.name:<22} {row.predicted:10.4g} {row.measured:10.4g} {ratio:7.2f} {mark:>4} {cpu}"


def summary(rows: Sequence[Row], load: tuple[float, float]) -> list[str]:
    """Against the wall time (the acceptance), then against CPU seconds per core."""
    lines = []
    for what, of in (("measured", lambda r: r.measured), ("cpu/core", lambda r: r.cpu_per_core)):
        ratios = [r.predicted / of(r) for r in rows if r.predicted is not None and of(r)]
        errors = [abs(x - 1.0) for x in ratios]
        held = sum(e <= TOLERANCE for e in errors)
        line = f"against {what}: within ±{TOLERANCE:.0%}: {held} of {len(rows)} plans"
        if errors:
            line += f"; median |error| {statistics.median(errors):.1%}, max {max(errors):.1%}"
        lines.append(line)
    lines.append(f"load average (1 min) before {load[0]:.2f}, after {load[1]:.2f}")
    return lines


def build_parser() -> OneLineParser:
    parser = OneLineParser(prog=PROG, description=__doc__.split("\n\n")[0])
    parser.add_argument("--profile", default="device_profile.json", help="alpa-calibrate's JSON")
    parser.add_argument(
        "--cases", default="all", help="comma-separated case names or models (--list), or all"
    )
    parser.add_argument("--steps", type=positive_int, default=5, help="timed steps (median)")
    parser.add_argument("--warmup", type=positive_int, default=2, help="untimed steps before")
    parser.add_argument(
        "--size", choices=("cpu", "gpu"), default="cpu", help="the models' sizes (and dtype)"
    )
    parser.add_argument("--json", default=None, help="also write the rows as JSON here")
    parser.add_argument("--list", action="store_true", help="name the cases and stop")
    return parser


def select(text: str) -> tuple[Case, ...]:
    """The cases ``--cases`` names: ``all``, or a comma-separated list of case
    names, models or methods of the table, ``tiny``, ``single`` (every model
    on one device)."""
    if text == "all":
        return cases()
    known = (*cases(), tiny_case())
    chosen: list[Case] = []
    for word in (w.strip() for w in text.split(",") if w.strip()):
        if word == "single":
            found = list(single_device_cases())
        else:
            found = [c for c in known if word in (c.name, c.model, c.method)]
        if not found:
            names = ", ".join(c.name for c in (*known, *single_device_cases()))
            raise AlpaError(f"--cases: unknown case '{word}'; known: {names}")
        chosen += [c for c in found if c not in chosen]
    return tuple(chosen)


def run(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    chosen = select(args.cases)
    if args.list:
        print("\n".join(c.name for c in chosen))
        return 0
    from alpa_ir.hardware.device_profile import load_profile

    profile = load_profile(args.profile)
    flags = os.environ.get("XLA_FLAGS", "")
    if "xla_force_host_platform_device_count" not in flags:  # before JAX starts
        os.environ["XLA_FLAGS"] = f"{flags} --xla_force_host_platform_device_count=8".strip()
    before = os.getloadavg()[0]
    print(f"profile: {args.profile} ({profile.name}, {profile.device})")
    print(f"{'plan':<22} {'predicted':>10} {'measured':>10} {'ratio':>7} {'':>4} {'cpu/core':>10}")
    rows = []
    for case in chosen:
        row = run_case(case, profile, args.steps, args.warmup, args.size)
        rows.append(row)
        print(format_row(row), flush=True)
    load = (before, os.getloadavg()[0])
    for line in summary(rows, load):
        print(line)
    if args.json:
        body = {
            "profile": str(args.profile),
            "load_average": list(load),
            "rows": [{**asdict(r), "ratio": r.ratio, "holds": r.holds} for r in rows],
        }
        Path(args.json).write_text(json.dumps(body, indent=1) + "\n")
    return 0


def main(argv: list[str] | None = None) -> int:
    try:
        return run(argv)
    except AlpaError as err:
        print(f"{PROG}: error: {err}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
