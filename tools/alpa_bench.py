"""alpa-bench: Alpa's weak-scaling benchmark (§8.1) under the simulator.

For each paper size of a suite at its GPU count (or ``--gpus``), the step is
traced abstractly (shapes only) at the micro-batch shape with automatic
layers (``cluster-operators``), every layer range is priced on every logical
mesh view (``construct-stages``' cost table), the stage DP picks the plan and
the plan is outlined. Every plan, Alpa's and the baselines', is then
simulated from the same cost table (:func:`alpa_ir.backends.simulate.simulate`):
a stage's forward takes one third of its forward+backward latency and its
backward two thirds (backward matmuls are twice the forward FLOPs; with
rematerialization, one quarter and three quarters: the backward also runs the
forward again); its
apply-grad reads and writes its persistent state once at HBM speed; the
transfers between consecutive stages are ``construct-stages``' cross-stage
estimates (:meth:`StageCostTable.transfer_times`): the activations the later
stage receives forward, the gradients the earlier one receives back, each
link carrying one micro-batch at a time. (Re-pricing the outlined functions
with ``plan_from_module`` would auto-shard every forward, backward and
apply-grad function again; the table already holds their sum.)

As in the paper's benchmark suites, every method trains with per-layer
rematerialization (``--remat``, the default; gradient checkpointing at the
automatic layers, as Alpa's ``AutoLayerOption(remat_layer=True)``) and ZeRO-2
where data parallelism replicates parameters (``--zero``, the default; Alpa
runs the benchmark with ``prefer_reduce_scatter``): see
:mod:`alpa_ir.costs.analytical_stage_cost` for how the cost model counts both. The paper sizes
train in mixed precision (fp16 computation, fp32 parameters and Adam state,
:mod:`alpa_ir.models.registry`), except Wide-ResNet, which the artifact ran in
fp32 (``--dtype artifact``, the default), and the memory estimates model XLA's operator
fusion (``--fusion``, the default; :mod:`alpa_ir.costs.fusion`): only fusion outputs
occupy memory and move through HBM. Where a layer's persistent memory is
large, it is also priced with every parameter sharded (``--memory-fallback``,
the default; ``StageCostOptions.memory_fallback``), and each stage takes the
fastest of the two plans that fits, as Alpa keeps the fastest of several
auto-sharding options per logical mesh.

By default every suite size runs with the micro-batch count of Alpa's measured
plan (``--micro-batches artifact``, :data:`~alpa_ir.models.measurements.ARTIFACT_MICRO_BATCHES`),
and ``--measured`` prints every method beside the artifact's measured per-GPU
TFLOPS (:mod:`alpa_ir.tools.bench_measured`).

Besides Alpa's plan, every run reports ``alpa+comm``: the stage DP on the same
cost table with the cross-stage transfers in its objective (option 6a,
``--cross-stage-comm`` makes that the main plan instead).

Baselines under the same simulator: ``intra-op`` (one stage on all devices),
``inter-op`` (the DP restricted to 1x1 submeshes; it needs a layer per device,
so with fewer automatic layers than devices the step is traced again with one
automatic layer per device and costed on one device), ``megatron`` (GPT:
dp x op x pp grid, equal layer counts per stage, every stage on a (dp, op)
view), ``pp-dp`` (Wide-ResNet: the same grid with op = 1) and ``deepspeed``
(MoE, below).

**DeepSpeed-style MoE** (the paper §8.1: DeepSpeed-MoE combines GShard's
expert parallelism, which "partitions the expert axis for the operators in MoE
layers, but switches back to data parallelism for non-expert layers", with
ZeRO data parallelism; it has no inter-operator parallelism, and its degrees
are grid-searched). Modelled as one stage on all devices. The grid: every
logical view ``(dp', ep)`` of the whole cluster whose minor axis ``ep``, the
expert-parallel degree, divides the expert count and spans at least one node
(DeepSpeed's ``ep_size``; the experts are replicated ``dp'`` times). On each
view every layer's function is planned by the same ILP with its argument
shardings fixed (``keep_argument_specs``) and all-gathers forbidden:
expert weights and biases (parameters whose first dimension is the expert
count) split along the expert axis over mesh axis 1, every other parameter
replicated, every batch-dependent argument (the batch, the tensors between
layers) split along its first dimension over all devices where it divides.
The ILP then finds the communication this implies: the all-to-alls between
batch-split tokens and expert-split experts (dispatch and combine, forward
and backward) and the gradient all-reduces of the replicated parameters
(ZeRO-2: reduce-scatter plus all-gather, the same bytes; optimizer state and
gradients partitioned over the replicas, ``StageCostOptions.zero``). An
all-to-all over a view axis that spans nodes is priced at the inter-node
α/β for all its bytes: DeepSpeed-MoE then had no hierarchical (intra-node
first) all-to-all, and the paper notes it "only maintains a good performance
within a node". Not modelled: DeepSpeed's tensor model parallelism for the
non-expert layers (replicated here; MoE's hidden sizes are small) and ZeRO-3.
Remat and micro-batches (gradient accumulation) as for every method.

Compile time is broken down like the paper's Table 5: clustering (tracing,
import and operator clustering), intra-op costing, DP, other (extraction,
outlining, simulation).
"""

from __future__ import annotations

import argparse
import itertools
import json
import math
import os
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from alpa_ir.errors import AlpaError, PlanError
from alpa_ir.passmanager.progress import ProgressBar
from alpa_ir.tools.cli_args import (
    BooleanOption,
    OneLineParser,
    nonnegative_finite_float,
    positive_int,
    positive_seconds,
)

if TYPE_CHECKING:  # imported where used: a bad option is rejected before jax loads
    from alpa_ir.hardware.clusters import Cluster
from alpa_ir.tools.bench_measured import (
    entries,
    entries_json,
    format_entries,
    format_summary,
    summarize,
    summary_json,
)
from alpa_ir.tools.bench_published import PUBLISHED_SUITES, PublishedRun
from alpa_ir.tools.bench_suite import (
    METHOD_SETTINGS,
    SUITES,
    auto_micro_batches,
    batch_divisors,
    bench_cluster,
    bench_model,
    default_layers,
)


def format_result(result: dict[str, Any], why: bool = False) -> str:
    lines = [
        f"{result['model']} on {result['gpus']} GPUs ({result['cluster']}), "
        f"B={result['num_micro_batches']}, {result['layers']} layers, "
        f"remat {'on' if result['remat'] else 'off'}, zero {'on' if result['zero'] else 'off'}, "
        f"fusion {'on' if result.get('fusion') else 'off'}, "
        f"{result.get('dtype') or 'dtype of the config'}, "
        f"cost cache {result['cache']['hits']} hits / {result['cache']['misses']} misses"
    ]
    lines.append(
        f"  {'method':<10} {'PFLOPS':>8} {'iter s':>9} {'Eq.2 s':>9} {'peak GiB':>9} "
        f"{'schedule':<8}  plan"
    )
    for o in result["outcomes"]:
        plan = " | ".join(
            f"L{s['layers'][0]}-{s['layers'][1]} {s['submesh'][0]}x{s['submesh'][1]}"
            f"->{s['logical_mesh'][0]}x{s['logical_mesh'][1]}"
            for s in o["stages"]
        )
        if o["error"]:
            unchecked = o.get("pflops_ignoring_memory", 0.0)
            if unchecked:
                plan = f"(ignoring memory: {unchecked:.4g} PFLOPS) {plan}"
            plan = f"{o['error']}  {plan}"[:300]
        lines.append(
            f"  {o['method']:<10} {o['pflops']:8.4g} {o['iteration_time']:9.4g} "
            f"{o.get('eq2_latency', 0.0):9.4g} {o['peak_memory_gib']:9.2f} "
            f"{o.get('schedule', '1f1b'):<8}  {plan}"
        )
    if result.get("schedules"):
        tried = ", ".join(
            f"{name} {c['iteration_time']:.4g} s ({c['stages']} stages)"
            if c["stages"] and c["iteration_time"] != math.inf
            else f"{name}: {c['note'] or 'no plan'}"
            for name, c in result["schedules"].items()
        )
        lines.append(f"  schedules (chosen first): {tried}")
    for o in result["outcomes"]:
        if o.get("setting"):
            lines.append(f"  {o['method']} as the artifact ran it: {o['setting']}")
    for reason in result.get("why", []) if why else []:
        lines.append(f"  why: {reason}")
    if result.get("search", {}).get("note"):
        lines.append(f"  {result['search']['note']}")
    c = result["compile_time"]
    lines.append(
        f"  compile time {c['total']:.1f} s: clustering {c['clustering']:.1f}, "
        f"intra-op costing {c['costing']:.1f}, DP {c['dp']:.2f}, other {c['other']:.1f}"
        + (
            f"; the baselines' own settings {c['own_settings']:.1f} more"
            if "own_settings" in c
            else ""
        )
    )
    if "micro_batch_search" in result:
        tried = ", ".join(
            f"B={t['num_micro_batches']}: {t['iteration_time']:.4g} s"
            for t in result["micro_batch_search"]
        )
        lines.append(f"  micro-batch search: {tried}")
    return "\n".join(lines)


MAX_VIEWS = 1024
"""The most logical mesh views a benchmarked cluster may have over all the
submeshes of Alpa's space: ``construct-stages`` prices every layer on each of
them and the stage DP runs over every submesh and device count, so the work
grows with the cluster (64 GPUs of 8-GPU nodes: 62 views; 1024 GPUs: 1746
views, GPT-3 350M still costing after 5 minutes on 2 cores; 100000 GPUs:
312635 views, minutes before the first progress line). Beyond it a run is
planned by the search that scales (:func:`scaled_result`) and says so."""
DEFAULT_MICRO_BATCHES = 16
DEFAULT_MAX_MICRO_BATCHES = 64
WORKERS_PER_CORE = 4


def _auto_or_positive(text: str) -> int | str:
    if text.strip() == "auto":
        return "auto"
    try:
        return positive_int(text)
    except argparse.ArgumentTypeError:
        raise argparse.ArgumentTypeError(
            f"must be 'auto' or a positive integer, got {text!r}"
        ) from None


def _micro_batches_arg(text: str) -> int | str:
    if text.strip() == "artifact":
        return "artifact"
    try:
        return _auto_or_positive(text)
    except argparse.ArgumentTypeError:
        raise argparse.ArgumentTypeError(
            f"must be a positive integer, 'artifact' or 'auto', got {text!r}"
        ) from None


def micro_batches_of(name: str, option: int | str) -> int | str:
    """``--micro-batches`` for model ``name``: ``artifact`` is the count of
    Alpa's measured plan of a suite size (``ARTIFACT_MICRO_BATCHES``), and
    :data:`DEFAULT_MICRO_BATCHES` for any other model."""
    if option != "artifact":
        return option
    from alpa_ir.models.measurements import ARTIFACT_MICRO_BATCHES

    return ARTIFACT_MICRO_BATCHES.get(name, DEFAULT_MICRO_BATCHES)


def dtype_of(name: str, option: str) -> str | None:
    """``--dtype`` for model ``name``: ``artifact`` is the suite's dtype in
    Alpa's artifact (Wide-ResNet fp32), the config's own for any other model."""
    if option != "artifact":
        return option
    from alpa_ir.models.measurements import artifact_dtype

    return artifact_dtype(name)


def _cluster_presets(name: str = "") -> Any:
    """The cluster presets: the built-in ones (without loading the plugins) where
    they have ``name``, else the plugin registry's."""
    from alpa_ir.hardware.clusters import builtin_presets

    builtin = builtin_presets()
    if name and name in builtin:
        return builtin
    from alpa_ir.plugins.registry import default_registry

    return default_registry().cluster_presets


def _divisor_count(n: int) -> int:
    count, k = 0, 1
    while k * k <= n:
        if n % k == 0:
            count += 1 if k * k == n else 2
        k += 1
    return count


def count_views(cluster: Cluster, limit: int = MAX_VIEWS) -> tuple[int, int]:
    """(submeshes, logical views) of Alpa's submesh space of ``cluster`` (every
    view of each submesh, the ``all`` space); the views are counted only up to
    just past ``limit``, without building the submeshes of a huge cluster."""
    m, nodes = cluster.devices_per_node, cluster.num_nodes
    if m & (m - 1):
        cluster.submesh_shapes()  # raises: not a power of two per node
    shapes = itertools.chain(
        ((1, 1 << k) for k in range(m.bit_length())), ((n, m) for n in range(2, nodes + 1))
    )
    views = 0
    for n, size in shapes:
        views += _divisor_count(n * size)
        if views > limit:
            break
    return m.bit_length() + nodes - 1, views


def most_gpus(devices_per_node: int, limit: int = MAX_VIEWS) -> int:
    """The largest whole-node GPU count whose cluster has at most ``limit`` views."""
    m = devices_per_node
    views = sum(_divisor_count(1 << k) for k in range(m.bit_length()))
    nodes = 1
    while views + _divisor_count((nodes + 1) * m) <= limit:
        nodes += 1
        views += _divisor_count(nodes * m)
    return nodes * m


def _gpus(count: int) -> str:
    return f"{count} GPU{'s' * (count != 1)}"


def _epilog() -> str:
    """``--help``'s list of cluster presets, suites and models."""
    from alpa_ir.hardware.clusters import Cluster
    from alpa_ir.models.registry import get_config, list_configs

    presets = []
    for name, factory in sorted(_cluster_presets().items()):
        try:
            probe = factory(None)
        except AlpaError:
            presets.append(f"  {name}")
            continue
        if isinstance(probe, Cluster):
            presets.append(
                f"  {name}: {probe.devices_per_node} {probe.device_name or 'devices'} per node, "
                f"{probe.num_nodes} node{'s' * (probe.num_nodes != 1)} by default"
            )
    suites = []
    for suite, names in SUITES.items():
        sizes = ", ".join(f"{n} ({_gpus(get_config(n).num_gpus)})" for n in names)
        suites.append(f"  {suite}: {sizes}")
    for suite, rows in PUBLISHED_SUITES.items():
        listed = ", ".join(f"{r.model} ({_gpus(r.gpus)} {r.cluster})" for r in rows)
        suites.append(f"  {suite}: {listed}; method published beside alpa")
    in_suites = {n for names in SUITES.values() for n in names}
    in_suites |= {r.model for rows in PUBLISHED_SUITES.values() for r in rows}
    others = ", ".join(n for n in list_configs() if n not in in_suites)
    return "\n".join(
        [
            "cluster presets (--cluster):",
            *presets,
            "",
            "suites (--suite) and their sizes (--models), each on its GPU count by default:",
            *suites,
            "",
            f"other models (--models only, without --suite): {others}",
            "",
            "--gpus must fit the preset (whole nodes, or a power of two below one node) and "
            f"give at most {MAX_VIEWS} logical mesh views (alpa-testbed: {most_gpus(8)} GPUs).",
        ]
    )


def build_parser() -> OneLineParser:
    parser = OneLineParser(
        prog="alpa-bench", description=__doc__.splitlines()[0], epilog_fn=_epilog
    )
    parser.add_argument(
        "--suite",
        choices=sorted({*SUITES, *PUBLISHED_SUITES}),
        default=None,
        help="the suite whose sizes to run (default: gpt3, unless --models names the models); "
        "megatron and llama3: real pre-training runs, each row's published configuration "
        "(method published) beside the planner's plan on the row's own cluster and GPUs",
    )
    parser.add_argument(
        "--models",
        default=None,
        help="comma-separated model configs (default: every size of the suite); with "
        "--suite, sizes of that suite only",
    )
    parser.add_argument("--cluster", default="alpa-testbed", help="cluster preset (see below)")
    parser.add_argument(
        "--profile",
        metavar="FILE",
        help="a device profile (JSON, written by alpa-calibrate) that prices the cluster's "
        "devices and links instead of the preset's built-in one",
    )
    parser.add_argument(
        "--gpus",
        type=positive_int,
        default=None,
        help="GPUs for every model (default: each size's GPU count in the paper)",
    )
    parser.add_argument(
        "--micro-batches",
        type=_micro_batches_arg,
        default="artifact",
        help="micro-batches per step: a positive integer dividing each model's global batch, "
        "'auto' (the best power of two up to --max-micro-batches) or 'artifact' (the "
        f"count of Alpa's measured plan of each suite size; {DEFAULT_MICRO_BATCHES} for "
        "other models)",
    )
    parser.add_argument(
        "--dtype",
        choices=("artifact", "float16", "bfloat16", "float32"),
        default="artifact",
        help="the computation dtype (artifact: as Alpa's artifact ran each suite, GPT-3 and "
        "MoE float16, Wide-ResNet float32; other models their config's)",
    )
    parser.add_argument(
        "--method-settings",
        choices=METHOD_SETTINGS,
        default="own",
        help="own: the baselines Alpa's artifact ran with settings of their own (intra-op "
        "only, inter-op only, Megatron-LM, PP-DP: their micro-batches, meshes, remat; "
        "alpa_ir.models.method_settings) simulated with them, on each suite size's own "
        "GPU count; alpa: every method with Alpa's plan's settings",
    )
    parser.add_argument(
        "--max-micro-batches",
        type=positive_int,
        default=None,
        help=f"with --micro-batches auto: the most micro-batches tried "
        f"(default: {DEFAULT_MAX_MICRO_BATCHES})",
    )
    parser.add_argument(
        "--layers",
        type=_auto_or_positive,
        default="auto",
        help="automatic layers: a positive integer, or 'auto' (one per block of the model and "
        "one more, see default_layers)",
    )
    parser.add_argument(
        "--cost-mode",
        choices=("range", "layer-sum"),
        default="layer-sum",
        help="price every layer range, or each layer once and sum",
    )
    parser.add_argument(
        "--submesh-space",
        choices=("all", "single-node-model-parallel", "one-dimensional"),
        default="all",
        help="the logical mesh views kept per submesh",
    )
    parser.add_argument(
        "--cross-stage-comm",
        action="store_true",
        help="the stage DP counts the cross-stage transfers (option 6a) for the main plan",
    )
    parser.add_argument(
        "--epsilon",
        type=nonnegative_finite_float,
        default=0.0,
        help="the stage DP's epsilon gap in seconds (0: exact)",
    )
    parser.add_argument(
        "--time-limit",
        type=positive_seconds,
        default=60.0,
        help="ILP time limit in seconds (inf: none)",
    )
    parser.add_argument(
        "--schedule",
        choices=("1f1b", "gpipe", "zb-h1", "interleaved-1f1b", "zb-v", "auto"),
        default=None,
        help="the pipeline schedule of Alpa's plan (auto: chosen with the stages among "
        "1f1b, zb-h1, interleaved-1f1b, zb-v and gpipe; the baselines keep 1F1B; "
        "default: auto for --suite llama3, else 1f1b)",
    )
    parser.add_argument(
        "--cost-model",
        default="auto",
        help="the stages' communication cost model (auto: calibrated on GPU presets; "
        "alpha-beta: Alpa's formulas; or any registered one)",
    )
    for flag, help_text in (
        ("--remat", "rematerialize every layer (the paper's setting)"),
        ("--zero", "ZeRO-2 for replicated parameters (Alpa's prefer_reduce_scatter)"),
        ("--fusion", "model XLA's operator fusion in activation memory and memory traffic"),
        ("--memory-fallback", "also price every large layer with all parameters sharded"),
    ):
        parser.add_argument(flag, action=BooleanOption, default=True, help=help_text)
    parser.add_argument(
        "--workers",
        type=positive_int,
        default=os.cpu_count() or 1,
        help=f"processes that cost the stage-mesh pairs (at most {WORKERS_PER_CORE} per core; "
        "the default is one per core)",
    )
    parser.add_argument(
        "--measured",
        action="store_true",
        help="print beside every method Alpa's measured per-GPU TFLOPS (the OSDI'22 "
        "artifact) and the ratio, and the agreement over all entries",
    )
    parser.add_argument(
        "--json",
        action="store_true",
        help="print the results as JSON (with --measured: an object with the results and "
        "the agreement)",
    )
    parser.add_argument(
        "--quiet", action="store_true", help="no progress display (shown only on a terminal)"
    )
    parser.add_argument(
        "--why",
        action="store_true",
        help="print why each stage has its logical mesh: its latency beside the runner-up's "
        "(always in --json, as 'why')",
    )
    parser.add_argument(
        "--figure",
        metavar="PATH",
        help="draw PFLOPS against GPUs for every method (the paper's Figure 7) into PATH "
        "(.png or .svg); saved --json results: python -m alpa_ir.plots.scaling",
    )
    return parser


@dataclass(frozen=True)
class BenchRun:
    """One model of the run, checked before any work starts."""

    name: str
    cluster: Cluster
    layers: int
    batch_size: int
    micro_batches: int | str
    dtype: str | None
    views: int = 0
    """Logical mesh views of Alpa's space on the cluster (counted up to just
    past :data:`MAX_VIEWS`): beyond it the run is planned by the search that scales."""

    @property
    def scaled(self) -> bool:
        return self.views > MAX_VIEWS


def _model_names(parser: OneLineParser, args: argparse.Namespace) -> list[str]:
    from alpa_ir.models.registry import list_configs

    if args.models is None:
        return list(SUITES[args.suite or "gpt3"])
    names = [n.strip() for n in args.models.split(",")]
    if not any(names):
        parser.error(f"--models must name at least one model, got {args.models!r}")
    if not all(names):
        parser.error(f"--models has an empty name in {args.models!r}")
    repeated = sorted({n for n in names if names.count(n) > 1})
    if repeated:
        parser.error(f"--models names {repeated[0]!r} twice in {args.models!r}")
    known = list_configs()
    for n in names:
        if n not in known:
            parser.error(f"--models: unknown model {n!r}; known: {', '.join(known)}")
    if args.suite is not None:
        for n in names:
            if n not in SUITES[args.suite]:
                home = [s for s, sizes in SUITES.items() if n in sizes]
                where = f"a size of suite {home[0]}" if home else "in no suite"
                parser.error(
                    f"--models {n!r} is not a size of --suite {args.suite} ({n} is {where}; "
                    f"{args.suite} has {', '.join(SUITES[args.suite])}); drop --suite to run it"
                )
    return names


def _bench_cluster_checked(
    parser: OneLineParser, args: argparse.Namespace, gpus: int, name: str
) -> tuple[Cluster, int]:
    """``bench_cluster`` for ``name`` on ``gpus`` GPUs and its logical mesh views
    (counted up to just past :data:`MAX_VIEWS`), with every reason it cannot be
    benchmarked as a usage error."""
    preset = args.cluster
    presets = _cluster_presets(preset)
    if preset not in presets:
        parser.error(
            f"--cluster: unknown cluster preset {preset!r}; known: {', '.join(sorted(presets))}"
        )
    where = (
        f"--gpus {gpus}"
        if args.gpus is not None
        else f"--cluster {preset} cannot run {name} on its {gpus} GPU{'s' * (gpus != 1)} "
        "(--gpus picks another count)"
    )
    try:
        cluster = bench_cluster(preset, gpus, presets=presets)
        _, views = count_views(cluster)
    except AlpaError as error:
        parser.error(f"{where}: {error}")
    if args.profile is not None:
        from alpa_ir.hardware.device_profile import load_profile

        try:
            cluster = cluster.with_profile(load_profile(args.profile))
        except AlpaError as error:
            parser.error(f"--profile: {error}")
    return cluster, views


def _scaled_checked(parser: OneLineParser, args: argparse.Namespace, run: BenchRun) -> None:
    """A run beyond :data:`MAX_VIEWS` views is planned by the search that scales:
    its micro-batch count must be given and leave some replica count."""
    from alpa_ir.pipeline.pipeline_replicas import planned_replica_counts

    where = f"{run.name} on {_gpus(run.cluster.num_devices)}"
    if run.micro_batches == "auto":
        parser.error(
            f"--micro-batches auto: {where} has more than {MAX_VIEWS} logical mesh views "
            f"(at most {most_gpus(run.cluster.devices_per_node)} GPUs on nodes of "
            f"{run.cluster.devices_per_node} for Alpa's full search) and is planned by the "
            "search that scales, which takes one micro-batch count"
        )
    try:
        planned_replica_counts(run.cluster, int(run.micro_batches))
    except (AlpaError, PlanError) as error:
        parser.error(
            f"--gpus {run.cluster.num_devices}: {where} has more than {MAX_VIEWS} logical "
            f"mesh views, so the search that scales plans it, and it cannot: {error}"
        )


def check_args(parser: OneLineParser, args: argparse.Namespace) -> list[BenchRun]:
    """Every option checked (and every model's cluster built) before any work:
    a bad value is a usage error that names the option and the value."""
    cores = os.cpu_count() or 1
    if args.figure is not None:
        figure = Path(args.figure)
        if figure.suffix.lower() not in (".png", ".svg"):
            parser.error(f"--figure must name a .png or .svg file, got {args.figure!r}")
        if not figure.parent.is_dir():
            parser.error(f"--figure {args.figure}: folder {figure.parent} does not exist")
    if args.workers > WORKERS_PER_CORE * cores:
        parser.error(
            f"--workers must be at most {WORKERS_PER_CORE} per CPU core "
            f"({WORKERS_PER_CORE * cores} on {cores} cores), got {args.workers}"
        )
    if args.max_micro_batches is not None and args.micro_batches != "auto":
        parser.error(
            f"--max-micro-batches {args.max_micro_batches} applies only with "
            f"--micro-batches auto, got --micro-batches {args.micro_batches}"
        )
    from alpa_ir.hardware.memory_budget import given_memory_budget
    from alpa_ir.models.registry import get_config

    try:  # the local devices' budget given by hand (read by the local-cpu preset)
        given_memory_budget()
    except AlpaError as error:
        parser.error(str(error))
    runs = []
    clusters: dict[int, tuple[Cluster, int]] = {}
    for name in _model_names(parser, args):
        config = get_config(name)
        gpus = args.gpus if args.gpus is not None else int(config.num_gpus)
        if gpus not in clusters:
            clusters[gpus] = _bench_cluster_checked(parser, args, gpus, name)
        cluster, views = clusters[gpus]
        batch = int(config.batch_size)
        micro = micro_batches_of(name, args.micro_batches)
        if micro != "auto" and batch % micro:  # type: ignore[operator]
            default = args.micro_batches == "artifact"
            parser.error(
                f"--micro-batches {micro} does not divide the global batch of "
                f"{name} ({batch}); use a divisor of {batch} or 'auto'"
                + (
                    f" ({micro}: the default for models without an artifact count)"
                    if default
                    else ""
                )
            )
        layers = default_layers(name) if args.layers == "auto" else args.layers
        run = BenchRun(name, cluster, layers, batch, micro, dtype_of(name, args.dtype), views)
        if run.scaled:
            _scaled_checked(parser, args, run)
        runs.append(run)
    return runs


def _published_runs(parser: OneLineParser, args: argparse.Namespace) -> list[PublishedRun]:
    """The rows of a published suite (``--models``: those of these models)."""
    rows = list(PUBLISHED_SUITES[args.suite])
    if args.gpus is not None:
        parser.error(f"--gpus: the rows of --suite {args.suite} run on their published GPU counts")
    if args.cluster != "alpa-testbed":
        parser.error(f"--cluster: the rows of --suite {args.suite} run on their published clusters")
    if args.models is not None:
        names = [n.strip() for n in args.models.split(",")]
        known = sorted({r.model for r in rows})
        for n in names:
            if n not in known:
                parser.error(
                    f"--models {n!r} is not a model of --suite {args.suite} ({', '.join(known)})"
                )
        rows = [r for r in rows if r.model in names]
    return rows


def scaled_result(run: BenchRun, args: argparse.Namespace) -> dict[str, Any]:
    """A run beyond :data:`MAX_VIEWS` views, planned by the search that scales
    (``tools/bench_scaled.py``: data-parallel replicas of one pipeline), as a
    result :func:`format_result` prints: the planner's plan only (no
    baselines), ``search`` says which search planned it and why."""
    from alpa_ir.tools.bench_scaled import plan_scaled

    scaled = plan_scaled(
        run.name,
        run.cluster,
        int(run.micro_batches),
        layers=run.layers,
        remat=args.remat,
        zero=args.zero,
        fusion=args.fusion,
        memory_fallback=args.memory_fallback,
        time_limit=args.time_limit,
        cost_model=args.cost_model,
        schedule=args.schedule,
        workers=args.workers,
        progress=not args.quiet,
        epsilon=args.epsilon,
        cross_stage_comm=args.cross_stage_comm,
        dtype=run.dtype,
    )
    found, times = scaled.found, scaled.times
    search = scaled.summary()
    search["kind"] = "scaled"
    search["note"] = (
        f"search: scaled (Alpa's full space has more than {MAX_VIEWS} logical mesh views): "
        f"{found.replicas} data-parallel replicas of a {found.pipeline.num_devices}-GPU "
        f"pipeline, each {found.num_micro_batches} of the {run.micro_batches} micro-batches, "
        + (
            f"ZeRO-{found.zero} across them (gradients reduce-scattered, parameters "
            f"all-gathered: {found.sync_seconds:.4g} s); no baselines"
            if found.zero
            else f"gradients all-reduced across them ({found.sync_seconds:.4g} s); no baselines"
        )
    )
    return {
        "model": run.name,
        "gpus": run.cluster.num_devices,
        "cluster": run.cluster.name,
        "num_micro_batches": int(run.micro_batches),
        "layers": found.plan.stages[-1].last + 1,
        "cost_mode": "layer-sum",
        "submesh_space": "power-of-two",
        "cross_stage_comm": args.cross_stage_comm,
        "remat": args.remat,
        "zero": args.zero,
        "fusion": args.fusion,
        "memory_fallback": args.memory_fallback,
        "workers": args.workers,
        "cache": {"hits": 0, "misses": scaled.pairs_costed},
        "search": search,
        "outcomes": [scaled.outcome.__dict__],
        "compile_time": {
            "clustering": times["trace"],
            "costing": times["costing"],
            "dp": times["dp"],
            "other": times["simulate"],
            "total": times["total"],
        },
    }


def published_row(run: PublishedRun, args: argparse.Namespace) -> dict[str, Any]:
    """A published suite's row: the published plan simulated, and the planner's
    plan at the same micro-batch count: today's stage DP where the cluster has
    at most ``FULL_SEARCH_VIEWS`` logical mesh views, else the search that
    scales (data-parallel replicas of one pipeline, ``tools/bench_scaled.py``).
    ``alpa.time`` is the planning's wall seconds, ``alpa.cpu`` its CPU seconds
    (this process and the costing workers)."""
    from alpa_ir.pipeline.pipeline_replicas import search_kind
    from alpa_ir.tools.bench_published import figures, run_published
    from alpa_ir.tools.bench_scaled import peak_rss_gib, plan_scaled

    row = run_published(
        run,
        cost_model=args.cost_model,
        time_limit=args.time_limit,
        fusion=args.fusion,
        progress=not args.quiet,
    )
    cluster = bench_cluster(run.cluster, run.gpus, presets=_cluster_presets(run.cluster))
    common = {
        "remat": args.remat,
        "zero": args.zero,
        "fusion": args.fusion,
        "memory_fallback": args.memory_fallback,
        "time_limit": args.time_limit,
        "cost_model": args.cost_model,
        "schedule": args.schedule,
        "workers": args.workers,
        "progress": not args.quiet,
        "epsilon": args.epsilon,
        "cross_stage_comm": args.cross_stage_comm,
    }
    if search_kind(cluster) == "scaled":
        # micro-batches of the published plan's per-replica size (one sequence):
        # the replica counts may then divide the step as the published data
        # parallelism does (Llama 3 on 16,384 GPUs: 16 micro-batches of 128
        # sequences leave no replica count with pipelines of at most 512 GPUs)
        micro = row["global_batch"] // (run.config.micro_batch_size or 1)
        scaled = plan_scaled(
            run.model,
            cluster,
            micro,
            layers=default_layers(run.model),
            tiled_attention=run.tiled_attention,
            **common,  # type: ignore[arg-type]
        )
        alpa, search = scaled.outcome, scaled.summary()
        search["num_micro_batches"] = micro
        wall, cpu = scaled.times["total"], scaled.times["cpu"]
        replicas = (
            f"{scaled.found.replicas} x {scaled.found.pipeline.num_devices} GPUs"
            f"{f' ZeRO-{scaled.found.zero}' if scaled.found.zero else ''}, B={micro}, "
        )
    else:  # Alpa's plan alone (alpa-bench's baselines are not the planner's time)
        full = plan_scaled(
            run.model,
            cluster,
            row["num_micro_batches"],
            layers=default_layers(run.model),
            full=True,
            submesh_space=args.submesh_space,
            cost_mode=args.cost_mode,
            **common,  # type: ignore[arg-type]
        )
        alpa, wall, cpu = full.outcome, full.times["total"], full.times["cpu"]
        planner, worker = peak_rss_gib()
        search = {
            "full": True,
            "time": dict(full.times),
            "peak_rss_gib": {"planner": planner, "worker": worker},
        }
        replicas = ""
    plan = " | ".join(
        f"L{s['layers'][0]}-{s['layers'][1]} {s['submesh'][0]}x{s['submesh'][1]}"
        f"->{s['logical_mesh'][0]}x{s['logical_mesh'][1]}"
        for s in alpa.stages
    )
    row["alpa"] = {
        **figures(alpa, run.gpus, cluster.peak_flops),
        "time": wall,
        "cpu": cpu,
        "search": search,
        "note": f"{replicas}{alpa.schedule}: {plan}",
    }
    return row


def _published_main(parser: OneLineParser, args: argparse.Namespace) -> int:
    from alpa_ir.tools.bench_published import format_row

    rows = _published_runs(parser, args)
    results = []
    failed = 0
    try:
        for run in rows:
            try:
                row = published_row(run, args)
            except (AlpaError, PlanError) as error:  # the other rows still run
                failed += 1
                print(
                    f"alpa-bench: error: {run.model} on {run.gpus} GPUs: {error}", file=sys.stderr
                )
                continue
            results.append(row)
            if not args.json:
                print(format_row(row), flush=True)
        if args.json:
            print(json.dumps(results, indent=1, default=float))
    except AlpaError as error:
        print(f"alpa-bench: error: {error}", file=sys.stderr)
        return 1
    return 1 if failed else 0


SUITE_SCHEDULES = {"llama3": "auto"}
"""``--schedule``'s default per suite (else 1F1B): the Llama 3 rows are planned
with the schedule chosen with the stages (issue #42: within the planning-time
aim there, and ahead of the published plan at 8,192 GPUs only with it)."""


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.schedule is None:
        args.schedule = SUITE_SCHEDULES.get(args.suite, "1f1b")
    if args.suite in PUBLISHED_SUITES:
        return _published_main(parser, args)
    runs = check_args(parser, args)
    max_micro_batches = args.max_micro_batches or DEFAULT_MAX_MICRO_BATCHES
    results = []
    suite = ProgressBar("alpa-bench", len(runs), enabled=not args.quiet and len(runs) > 1)
    try:
        with suite:
            for done, run in enumerate(runs):
                suite.update(done, f"alpa-bench: {run.name} on {run.cluster.num_devices} GPUs")
                common = {
                    "cluster": run.cluster,
                    "layers": run.layers,
                    "cost_mode": args.cost_mode,
                    "submesh_space": args.submesh_space,
                    "cross_stage_comm": args.cross_stage_comm,
                    "epsilon": args.epsilon,
                    "time_limit": args.time_limit,
                    "remat": args.remat,
                    "zero": args.zero,
                    "fusion": args.fusion,
                    "memory_fallback": args.memory_fallback,
                    "workers": args.workers,
                    "progress": not args.quiet,
                    "cost_model": args.cost_model,
                    "schedule": args.schedule,
                    "dtype": run.dtype,
                    "method_settings": args.method_settings,
                }
                try:
                    if run.scaled:
                        result = scaled_result(run, args)
                    elif run.micro_batches == "auto":
                        candidates = batch_divisors(run.batch_size, max_micro_batches)
                        result = auto_micro_batches(run.name, candidates, **common)
                    else:
                        result = bench_model(
                            run.name,
                            num_micro_batches=int(run.micro_batches),
                            **common,
                        )
                except AlpaError as error:
                    if args.layers != "auto" and str(error).startswith("cluster-operators:"):
                        raise AlpaError(
                            f"--layers {args.layers} for {run.name}: {error}"
                        ) from error
                    raise AlpaError(f"{run.name}: {error}") from error
                result["dtype"] = run.dtype
                if args.measured:
                    result["measured"] = entries_json(result)
                results.append(result)
                if not args.json:
                    print(format_result(result, args.why), flush=True)
                    if args.measured:
                        print(format_entries(result), flush=True)
            suite.update(len(runs))
        summary = summarize([e for r in results for e in entries(r)]) if args.measured else None
        if args.json:
            shown: Any = results
            if summary is not None:
                shown = {"results": results, "measured": summary_json(summary)}
            print(json.dumps(shown, indent=1, default=float))
        elif summary is not None:
            print(format_summary(summary), flush=True)
        if args.figure:
            from alpa_ir.plots.scaling import draw_scaling

            drawn = draw_scaling(results, args.figure).path
            print(f"figure: {drawn}", file=sys.stderr if args.json else sys.stdout)
    except AlpaError as error:
        print(f"alpa-bench: error: {error}", file=sys.stderr)
        return 1
    except BrokenPipeError:  # e.g. piped into `head`: stop quietly
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 1
    return 0


if __name__ == "__main__":
    os.environ["JAX_PLATFORMS"] = "cpu"  # before jax loads (as jax_platforms=cpu)
    sys.exit(main())
