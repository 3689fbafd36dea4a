"""One model of ``alpa-bench`` (see :mod:`alpa_ir.tools.alpa_bench`): the
suites' sizes, the benchmarked cluster, the abstract trace, Alpa's plan and
the baselines from one cost table (:func:`bench_module`)."""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from alpa_ir.errors import AlpaError, PlanError
from alpa_ir.ir.collection import rare_full_collections

if TYPE_CHECKING:  # imported where used: a bad option is rejected before jax loads
    from xdsl.dialects.builtin import ModuleOp

    from alpa_ir.costs.costing_workers import StartedWorkers
    from alpa_ir.costs.stage_cost import StageCostOptions
    from alpa_ir.costs.stage_table import StageCostTable
    from alpa_ir.hardware.clusters import Cluster
    from alpa_ir.pipeline.layer_ranges import LayerRanges
    from alpa_ir.pipeline.repeated_layers import RepeatedLayers
from alpa_ir.tools.bench_baselines import deepspeed, inter_op, restricted, uniform_grid
from alpa_ir.tools.bench_outcome import Breakdown, Outcome, outcome

SUITES = {
    "gpt3": ("gpt3-350m", "gpt3-1.3b", "gpt3-2.6b", "gpt3-6.7b", "gpt3-15b", "gpt3-39b"),
    "moe": ("moe-380m", "moe-1.3b", "moe-2.4b", "moe-10b", "moe-27b", "moe-70b"),
    "wresnet": (
        "wresnet-250m",
        "wresnet-1b",
        "wresnet-2b",
        "wresnet-4b",
        "wresnet-6.8b",
        "wresnet-13b",
    ),
}


def bench_cluster(preset: str, gpus: int, presets: Any = None) -> Cluster:
    """The preset with ``gpus`` devices; fewer than a node: one node of ``gpus``.
    ``presets``: where to find ``preset`` (default: the built-in presets)."""
    from alpa_ir.hardware.clusters import get_cluster

    base = get_cluster(preset, presets=presets)
    if gpus >= base.devices_per_node:
        return get_cluster(preset, num_devices=gpus, presets=presets)
    return base.one_node(gpus)


def default_layers(name: str) -> int:
    """``--layers auto``: one automatic layer per block of the model (transformer
    layer, bottleneck block) and one more, where operator clustering then
    cuts at the block boundaries: the first layer holds the embedding (the
    stem), the last the head, and the layers between are identical blocks
    that are costed once (GPT-3 39B: 49 layers of 3 kinds). The stage DP gets
    the finest slicing, and rematerialization is per block."""
    from alpa_ir.models.registry import get_config

    config = get_config(name)
    stages = getattr(config, "stage_sizes", None)  # a ResNet: its bottleneck blocks
    blocks = sum(stages) if stages else getattr(config, "num_layers", 0)
    return int(blocks) + 1 if blocks else 8


def bench_optimizer(name: str) -> tuple[str, float]:
    """The optimizer a suite trains with, and its state per parameter byte for
    the cost model: Adam (m and v: 2) for GPT-3; SGD with Nesterov momentum 0.9
    (one momentum: 1) for Wide-ResNet, as Alpa's Wide-ResNet benchmark trains
    (``optax.sgd(..., momentum=0.9, nesterov=True)`` in
    benchmark/alpa/benchmark_{2d,3d}_one_case_wresnet.py, branch osdi22_artifact,
    commit e0ae8bf8); Adafactor for MoE, as Alpa's MoE benchmark trains (its
    second moments are factored into a row and a column per matrix: next to
    nothing). Without that, MoE-70B's 16 bytes per parameter exceed 64 GPUs of
    16 GB whatever the plan."""
    if name.startswith("moe"):
        return ("adafactor", 0.0)
    if name.startswith("wresnet"):
        return ("sgd-momentum", 1.0)
    return ("adam", 2.0)


EARLY_WORKERS_FROM_FLOPS = 1e12
"""A zoo step of at least this many FLOPs (every model of the suites; the
``-tiny`` test models have under 1e8) gets its costing workers started before
it is traced: they import the compiler while the step is traced and clustered,
as ``PipeshardParallel`` does for a large step (GPT-3 39B: 0.5 s less)."""


def early_workers(step_flops: float, workers: int) -> int:
    """Costing workers to start before a zoo step of ``step_flops`` FLOPs is
    traced: those the cost table will want besides this process, for a step
    large enough."""
    return workers - 1 if step_flops >= EARLY_WORKERS_FROM_FLOPS else 0


def trace(
    name: str,
    num_micro_batches: int,
    layers: int,
    dtype: str | None = None,
    blocks: int | None = None,
) -> Any:
    """The zoo step ``name`` traced abstractly at the micro-batch shape with
    ``layers`` automatic layers; ``dtype``: its computation dtype (None: the
    config's); ``blocks``: that many of its blocks (``num_layers``) instead of
    the config's (a shortened model, :mod:`alpa_ir.pipeline.repeated_layers`)."""
    import dataclasses

    from alpa_ir.frontend.arguments import micro_batch_args
    from alpa_ir.frontend.jaxpr_import import import_jax
    from alpa_ir.frontend.markers import AutomaticLayers, automatic_layers
    from alpa_ir.models.registry import get_config
    from alpa_ir.models.train_step import make_train_step

    config = get_config(name)
    if dtype is not None:
        config = dataclasses.replace(config, dtype=jnp_dtype(dtype))
    if blocks is not None:
        config = dataclasses.replace(config, num_layers=blocks)
    step, args = make_train_step(config, abstract=True, optimizer=bench_optimizer(name)[0])
    micro = micro_batch_args(tuple(args), (1,), num_micro_batches)
    with automatic_layers(AutomaticLayers(layers, 0.5, fit_delta=True)):
        # a fresh function object: JAX's trace cache must not reuse an unmarked trace
        return import_jax(lambda *a: step(*a), *micro, batch_argnums=(1,))


def shortened_trace(
    name: str,
    num_micro_batches: int,
    layers: int,
    dtype: str | None = None,
    cost_mode: str = "layer-sum",
) -> tuple[ModuleOp, RepeatedLayers | None]:
    """The zoo step ``name`` traced as :func:`trace` does, or, for a model of
    repeated blocks with a layer per block in ``layer-sum`` mode, traced with
    a few blocks and how its layers stand for the whole model's
    (:mod:`alpa_ir.pipeline.repeated_layers`; None: the whole model was
    traced). MoE steps are traced whole: DeepSpeed's baseline reads every layer."""
    from alpa_ir.ir.module_utils import main_function
    from alpa_ir.models.registry import get_config
    from alpa_ir.pipeline.layer_ranges import LayerRanges
    from alpa_ir.pipeline.repeated_layers import RepeatedLayers, short_blocks

    blocks = short_blocks(get_config(name), layers) if cost_mode == "layer-sum" else None
    if blocks is not None and not name.startswith("moe"):
        short = trace(name, num_micro_batches, blocks + 1, dtype, blocks)
        repeated = RepeatedLayers.of(LayerRanges(main_function(short)), layers)
        if repeated is not None:
            return short, repeated
    return trace(name, num_micro_batches, layers, dtype), None


def jnp_dtype(name: str) -> Any:
    """The JAX dtype named ``name`` (``float16``, ``float32``, ``bfloat16``)."""
    import jax.numpy as jnp

    return jnp.dtype(name).type


Baselines = Callable[["LayerRanges", "StageCostTable", "StageCostOptions"], list[Outcome]]
"""Model-specific baselines of :func:`bench_module`: given the step's layer
ranges, the cost table and the cost options, their outcomes."""


@rare_full_collections()  # tracing and costing allocate millions of objects
def bench_model(
    name: str,
    cluster: Cluster,
    *,
    num_micro_batches: int,
    layers: int,
    cost_mode: str,
    submesh_space: str,
    cross_stage_comm: bool,
    epsilon: float,
    time_limit: float,
    remat: bool = True,
    zero: bool = True,
    fusion: bool = True,
    memory_fallback: bool = True,
    workers: int = 1,
    progress: bool = True,
    cost_model: str = "auto",
    schedule: str = "1f1b",
    dtype: str | None = None,
    method_settings: str = "alpa",
    shorten: bool = True,
) -> dict[str, Any]:
    """:func:`bench_module` for the zoo model ``name``: traced abstractly with
    ``layers`` automatic layers (``dtype``: its computation dtype, None: the
    config's), its analytic FLOPs, its suite's baselines. ``method_settings``:
    ``own``: the baselines the artifact ran with settings of their own are
    simulated again with them (:mod:`alpa_ir.tools.bench_own_settings`);
    ``alpa``: every method with Alpa's plan's settings. ``shorten``: a model
    of repeated blocks is traced with a few of them (:func:`shortened_trace`:
    the same table and plans); off: traced whole."""
    from alpa_ir.costs.costing_workers import StartedWorkers
    from alpa_ir.models.train_step import train_step_flops

    flops = train_step_flops(name)

    def baselines(
        ranges: LayerRanges, table: StageCostTable, options: StageCostOptions
    ) -> list[Outcome]:
        return zoo_baselines(name, ranges, table, options, num_micro_batches, flops)

    if method_settings not in METHOD_SETTINGS:
        raise AlpaError(
            f"method settings must be one of {', '.join(METHOD_SETTINGS)}, got {method_settings!r}"
        )
    with StartedWorkers(early_workers(flops, workers)) as started:
        t0 = time.perf_counter()
        mode = cost_mode if shorten else "range"  # range: traced whole
        module, repeated = shortened_trace(name, num_micro_batches, layers, dtype, mode)
        clustering = time.perf_counter() - t0
        result = bench_module(
            module,
            cluster,
            name=name,
            model_flops=flops,
            num_micro_batches=num_micro_batches,
            cost_mode=cost_mode,
            submesh_space=submesh_space,
            cross_stage_comm=cross_stage_comm,
            epsilon=epsilon,
            time_limit=time_limit,
            remat=remat,
            zero=zero,
            fusion=fusion,
            memory_fallback=memory_fallback,
            workers=workers,
            progress=progress,
            cost_model=cost_model,
            schedule=schedule,
            optimizer_state_factor=bench_optimizer(name)[1],
            clustering_time=clustering,
            retrace=lambda count: trace(name, num_micro_batches, count, dtype),
            baselines=baselines,
            started=started,
            repeated=repeated,
        )
    if method_settings == "own":
        with_own_settings(
            result,
            name,
            cluster,
            layers=layers,
            trace_step=lambda micro, count: trace(name, micro, count, dtype),
            flops=flops,
            stage_options={
                "cluster": cluster.name,
                "num_devices": cluster.num_devices,
                "epsilon": epsilon,
                "progress": progress,
                "workers": workers,
                "zero": zero,
                "fusion": fusion,
                "memory_fallback": memory_fallback,
                "optimizer_state_factor": bench_optimizer(name)[1],
                "time_limit": time_limit,
                "cost_model": cost_model,
            },
            cost_mode=cost_mode,
            submesh_space=submesh_space,
            workers=workers,
            progress=progress,
        )
    result["method_settings"] = method_settings
    return result


METHOD_SETTINGS = ("own", "alpa")
"""``alpa-bench --method-settings``: each baseline with the artifact's own
settings of it, or every method with Alpa's plan's settings."""


def with_own_settings(
    result: dict[str, Any], name: str, cluster: Cluster, **kwargs: Any
) -> dict[str, Any]:
    """``result`` with every baseline that has a setting of its own
    (:func:`~alpa_ir.tools.bench_own_settings.own_settings_outcomes`) simulated
    again with it, in place of the one at Alpa's settings."""
    from alpa_ir.models.registry import get_config
    from alpa_ir.tools.bench_own_settings import own_settings_outcomes

    config = get_config(name)
    if cluster.num_devices != int(getattr(config, "num_gpus", 0)):
        return result  # the settings are of the size's own GPU count
    t0 = time.perf_counter()
    batch = int(config.batch_size)
    own = own_settings_outcomes(name, cluster, batch_size=batch, **kwargs)
    result["outcomes"] = [own.get(o["method"], o) for o in result["outcomes"]]
    result["compile_time"]["own_settings"] = time.perf_counter() - t0
    return result


def zoo_baselines(
    name: str,
    ranges: LayerRanges,
    table: StageCostTable,
    options: StageCostOptions,
    num_micro_batches: int,
    flops: float,
) -> list[Outcome]:
    """The suite's own baseline of zoo model ``name`` (module docstring):
    Megatron's grid for GPT, PP-DP for Wide-ResNet, DeepSpeed for MoE."""
    if name.startswith("gpt"):
        return [uniform_grid(table, num_micro_batches, flops, None, options.remat)]
    if name.startswith("wresnet"):
        return [uniform_grid(table, num_micro_batches, flops, 1, options.remat)]
    if name.startswith("moe"):
        from alpa_ir.models.registry import get_config

        experts = get_config(name).num_experts
        return [deepspeed(ranges, table, options, experts, num_micro_batches, flops)]
    return []


@rare_full_collections()
def bench_module(
    module: ModuleOp,
    cluster: Cluster,
    *,
    name: str,
    model_flops: float,
    num_micro_batches: int,
    cost_mode: str,
    submesh_space: str,
    cross_stage_comm: bool,
    epsilon: float,
    time_limit: float,
    remat: bool = True,
    zero: bool = True,
    fusion: bool = True,
    memory_fallback: bool = True,
    workers: int = 1,
    progress: bool = True,
    cost_model: str = "auto",
    optimizer_state_factor: float = 2.0,
    clustering_time: float = 0.0,
    retrace: Callable[[int], ModuleOp] | None = None,
    baselines: Baselines | None = None,
    schedule: str = "1f1b",
    started: StartedWorkers | None = None,
    repeated: RepeatedLayers | None = None,
) -> dict[str, Any]:
    """Alpa's plan and the baselines of a step already imported at the
    micro-batch shape with its automatic layers (``module``; ``name`` labels
    the result): every layer priced on every view, the stage DP, the plans
    simulated. ``model_flops``: FLOPs of one training step (the PFLOPS
    figures); ``clustering_time``: seconds the import and clustering took
    (Table 5's first column); ``retrace(layers)``: the step imported again
    with that many automatic layers, for the inter-op baseline (None: it
    plans on the layers ``module`` has); ``baselines``: more baselines;
    ``schedule``: Alpa's plan's pipeline schedule (``auto``: chosen with the
    stages, every candidate's time in ``schedules``); ``started``: costing
    workers started ahead, taken first; ``repeated``: ``module`` is a
    shortened trace whose table this expands to the whole model
    (:func:`shortened_trace`; the plan is then not written into ``module``)."""
    from alpa_ir.api.why_plan import stage_reasons
    from alpa_ir.costs.analytical_stage_cost import AnalyticalStageCostModel
    from alpa_ir.costs.stage_table import cost_table
    from alpa_ir.ir.module_utils import main_function
    from alpa_ir.passmanager.pipeline_syntax import format_pipeline
    from alpa_ir.pipeline.layer_phases import layer_phase_flops
    from alpa_ir.pipeline.layer_ranges import LayerRanges
    from alpa_ir.pipeline.stage_construction import StagePlan, plan_stages, write_plan
    from alpa_ir.plugins.registry import default_registry

    times = Breakdown(clustering=clustering_time)
    t1 = time.perf_counter()
    ranges = LayerRanges(main_function(module))
    t2 = time.perf_counter()
    stage_pass = default_registry().get_pass("construct-stages")(
        cluster=cluster.name,
        num_devices=cluster.num_devices,
        num_micro_batches=num_micro_batches,
        submesh_space=submesh_space,  # type: ignore[arg-type]
        epsilon=epsilon,
        cost_mode=cost_mode,  # type: ignore[arg-type]
        cross_stage_comm=cross_stage_comm,
        progress=progress,
        workers=workers,
        remat=remat,
        zero=zero,
        fusion=fusion,
        memory_fallback=memory_fallback,
        optimizer_state_factor=optimizer_state_factor,
        time_limit=time_limit,
        cost_model=cost_model,
        schedule=schedule,
    )
    options = stage_pass.cost_options()
    model = AnalyticalStageCostModel(options)

    def costed(ranges: LayerRanges) -> StageCostTable:
        return cost_table(
            ranges,
            cluster,
            model,
            space=submesh_space,
            cost_mode=cost_mode,
            workers=workers,
            progress=progress,
            phase_flops=layer_phase_flops(ranges),
            started=started,
        )

    table = costed(ranges)
    if repeated is not None:
        expanded = repeated.expand_table(table)
        if expanded is None:  # interior layers priced apart: the whole step after all
            if retrace is None:
                raise AlpaError(f"{name}: a shortened trace needs retrace for the whole step")
            module, repeated = retrace(repeated.num_layers), None
            ranges = LayerRanges(main_function(module))
            expanded = costed(ranges)
        table = expanded
    t3 = time.perf_counter()
    times.costing = t3 - t2
    flops = model_flops
    result: dict[str, Any] = {
        "model": name,
        "gpus": cluster.num_devices,
        "cluster": cluster.name,
        "num_micro_batches": num_micro_batches,
        "layers": table.num_layers,
        "cost_mode": cost_mode,
        "submesh_space": submesh_space,
        "cross_stage_comm": cross_stage_comm,
        "remat": remat,
        "zero": zero,
        "fusion": fusion,
        "memory_fallback": memory_fallback,
        "workers": workers,
        "pass_pipeline": format_pipeline([stage_pass]),
        "cache": {"hits": model.stats.hits, "misses": model.stats.misses},
    }
    plan: StagePlan | None = None
    plan_options = {"epsilon": epsilon, "remat": remat}
    try:
        plan = plan_stages(
            table,
            num_micro_batches,
            schedule,
            cross_stage_comm=cross_stage_comm,
            **plan_options,  # type: ignore[arg-type]
        )
        alpa = outcome(
            "alpa",
            table,
            plan.stages,
            num_micro_batches,
            flops,
            remat,
            plan.schedule,
            plan.mesh_of,
            plan.phase_times,
        )
        result["why"] = [r.text() for r in stage_reasons(table, plan)]
        if plan.candidates:
            result["schedules"] = {
                c.schedule: {
                    "iteration_time": c.iteration_time,
                    "stages": len(c.plan.stages) if c.plan is not None else 0,  # type: ignore[attr-defined]
                    "meshes": len(set(c.plan.mesh_of or c.plan.stages)) if c.plan else 0,  # type: ignore[attr-defined]
                    "note": c.note.split(";")[0],
                }
                for c in plan.candidates
            }
    except (AlpaError, PlanError) as error:
        alpa = Outcome("alpa", error=str(error))
    t4 = time.perf_counter()
    times.dp = t4 - t3
    if plan is not None and repeated is None:
        write_plan(module, plan, num_micro_batches)
    times.other = (t2 - t1) + (time.perf_counter() - t4)
    whole = max(table.submeshes, key=lambda s: s[0] * s[1])
    outcomes = [alpa]
    if not cross_stage_comm:
        # option 6a on the same table: the DP also counts the cross-stage transfers
        try:
            with_comm = plan_stages(
                table,
                num_micro_batches,
                schedule,
                cross_stage_comm=True,
                **plan_options,  # type: ignore[arg-type]
            )
            outcomes.append(
                outcome(
                    "alpa+comm",
                    table,
                    with_comm.stages,
                    num_micro_batches,
                    flops,
                    remat,
                    with_comm.schedule,
                    with_comm.mesh_of,
                    with_comm.phase_times,
                )
            )
        except (AlpaError, PlanError) as error:
            outcomes.append(Outcome("alpa+comm", error=str(error).split(";")[0]))
    outcomes += [
        restricted("intra-op", table, [whole], num_micro_batches, flops, remat),
        inter_op(retrace, table, model, num_micro_batches, flops, cost_mode, remat),
    ]
    if baselines is not None:
        outcomes += baselines(ranges, table, options)
    result["outcomes"] = [o.__dict__ for o in outcomes]
    result["compile_time"] = {**times.__dict__, "total": times.total}
    return result


def auto_micro_batches(name: str, candidates: Sequence[int], **kwargs: Any) -> dict[str, Any]:
    """Option ``micro-batches=auto``: the best simulated Alpa plan over ``candidates``."""
    best: dict[str, Any] | None = None
    tried = []
    for b in candidates:
        result = bench_model(name, num_micro_batches=b, **kwargs)
        time_b = result["outcomes"][0]["iteration_time"]
        tried.append({"num_micro_batches": b, "iteration_time": time_b})
        if best is None or time_b < best["outcomes"][0]["iteration_time"]:
            best = result
    assert best is not None
    best["micro_batch_search"] = tried
    return best


def batch_divisors(batch: int, limit: int) -> list[int]:
    return [
        1 << k for k in range(limit.bit_length()) if (1 << k) <= limit and batch % (1 << k) == 0
    ]
