"""``alpa-bench``'s suites of real pre-training runs (``--suite megatron``,
``--suite llama3``): each row's published configuration as a manual plan
(method ``published``), simulated beside the planner's plan (``alpa``).

**The rows.** ``megatron``: the ten rows of Megatron-LM's Table 1 (Narayanan
et al., SC'21), each model on its GPU count of ``dgx-a100`` with its global
batch, tensor and pipeline degrees as published, data parallelism the rest
of the GPUs. The published runs used the interleaved schedule and full
recomputation; the table does not give the chunks per stage, so a stage of
``L`` layers gets the fewest chunks (at least 2) that divide ``L`` (1T: 2
layers per stage, 2 chunks of 1; 530B: 3 layers, 3 chunks); micro-batches
of one sequence per replica. ``llama3``: Llama 3 405B (Dubey et al. 2024,
Table 4) on 8,192 and 16,384 ``dgx-h100`` GPUs at sequence 8,192 (TP 8 ·
PP 16 · DP 64 / 128) and on 16,384 at sequence 131,072 (TP 8 · CP 16 · PP 16 ·
DP 8), global batch 16M tokens, the interleaved schedule (2 chunks per stage
here), FSDP as ZeRO-2 (gradients and optimizer state sharded, weights not).
Recomputation is on for these rows too: the zoo's attention materialises its
scores (no flash attention), which at sequence 8,192 would not fit otherwise.

**How a published plan is simulated.** The step is traced abstractly at the
micro-batch shape with the suite's automatic layers (one per block and the
embedding, as ``alpa-bench``), every layer is priced on the stage's logical
mesh (``(data, tensor)``, or ``(data, context, tensor)``) on the first
stage's devices by the same analytical stage cost model and device model as
the planner's (identical layers priced once), the chunks are laid out as
Megatron interleaves them (chunk ``c`` on stage ``c mod PP``) and simulated
by the same simulator (:func:`alpa_ir.tools.bench_outcome.outcome`). Each
layer's sharding is Megatron's own (:mod:`alpa_ir.autosharding.megatron_specs`):
the attention's query, key and value projections and the MLP's first
projections column-parallel over the tensor axis, the attention's output and
the MLP's last projection row-parallel, the embedding vocabulary-parallel,
norms and biases replicated, and every activation argument split over the data
axis (and its sequence over the context axis, and inside the layer the
attention's scores by their queries: :mod:`alpa_ir.autosharding.context_hints`);
the ILP keeps these (``keep_argument_specs``, hints) and only routes the
activations between them. The
data-parallel replicas all-reduce their gradients (Megatron-LM's Table 1 runs
kept the optimizer state whole on every replica); with ``zero_stage`` 1 or 2
(Llama 3's FSDP) the cost model's ``zero`` partitions the gradients and the
optimizer state over the data axis, the weights stay whole per replica.

**The figures.** Per-GPU TFLOPS and MFU count the model's FLOPs (no
recomputation: ``train_step_flops``) over the simulated iteration time;
Megatron's own Table 1 counts the recomputed forward too (its
``96·B·s·l·h²`` formula), so its published TFLOPS are 4/3 of an MFU figure.

**The planner at these sizes.** ``alpa-bench`` plans the ``alpa`` row with
today's stage DP where the cluster has at most 256 logical mesh views, and
beyond that with the search that scales (:mod:`alpa_ir.tools.bench_scaled`:
data-parallel replicas of one pipeline), at micro-batches of the published
per-replica size.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

from alpa_ir.api.parallel_config import ParallelConfig, chunk_layers, interleaved_mesh_of
from alpa_ir.errors import AlpaError, PlanError

if TYPE_CHECKING:
    from alpa_ir.costs.stage_cost import StageCost, StageCostOptions
    from alpa_ir.costs.stage_table import StageCostTable, ViewCost
    from alpa_ir.hardware.clusters import Cluster
from alpa_ir.tools.bench_outcome import Outcome


@dataclass(frozen=True)
class PublishedRun:
    """One row: a zoo model on ``gpus`` GPUs of ``cluster`` under ``config``,
    and the per-GPU TFLOPS its authors reported (their own FLOP count)."""

    model: str
    gpus: int
    cluster: str
    config: ParallelConfig
    reported_tflops: float
    source: str
    tiled_attention: bool = False
    """Price the attention as one tiled kernel (FlashAttention, as the run did;
    :attr:`~alpa_ir.costs.stage_cost.StageCostOptions.tiled_attention`): the
    128K-sequence row, where no plan of materialized scores fits (the 8K rows
    keep the zoo's materialized attention)."""


def _chunks_per_stage(layers: int, pipeline: int) -> int:
    """The fewest chunks (at least 2) that divide a stage's layers (1: no pipeline)."""
    if pipeline == 1:
        return 1
    per_stage = layers // pipeline
    return next((v for v in range(2, per_stage + 1) if per_stage % v == 0), 1)


# Megatron-LM Table 1: (model, layers, tensor, pipeline, GPUs, reported TFLOPS per GPU)
_MEGATRON = (
    ("megatron-1.7b", 24, 1, 1, 32, 137.0),
    ("megatron-3.6b", 30, 2, 1, 64, 138.0),
    ("megatron-7.5b", 36, 4, 1, 128, 142.0),
    ("megatron-18b", 40, 8, 1, 256, 135.0),
    ("megatron-39b", 48, 8, 2, 512, 138.0),
    ("megatron-76b", 60, 8, 4, 1024, 140.0),
    ("megatron-145b", 80, 8, 8, 1536, 148.0),
    ("megatron-310b", 96, 8, 16, 1920, 155.0),
    ("megatron-530b", 105, 8, 35, 2520, 163.0),
    ("megatron-1t", 128, 8, 64, 3072, 163.0),
)

MEGATRON_RUNS = tuple(
    PublishedRun(
        model,
        gpus,
        "dgx-a100",
        ParallelConfig(
            tensor=tp,
            pipeline=pp,
            data=gpus // (tp * pp),
            virtual_stages=_chunks_per_stage(layers, pp),
            recompute="full",
            micro_batch_size=1,
        ),
        tflops,
        "Megatron-LM (SC'21) Table 1",
    )
    for model, layers, tp, pp, gpus, tflops in _MEGATRON
)

LLAMA3_RUNS = (
    PublishedRun(
        "llama3-405b",
        8192,
        "dgx-h100",
        ParallelConfig(
            tensor=8, pipeline=16, data=64, virtual_stages=2, zero_stage=2, recompute="full",
            micro_batch_size=1,
        ),
        430.0,
        "Llama 3 (2024) Table 4",
    ),
    PublishedRun(
        "llama3-405b",
        16384,
        "dgx-h100",
        ParallelConfig(
            tensor=8, pipeline=16, data=128, virtual_stages=2, zero_stage=2, recompute="full",
            micro_batch_size=1,
        ),
        400.0,
        "Llama 3 (2024) Table 4",
    ),
    PublishedRun(
        "llama3-405b-128k",
        16384,
        "dgx-h100",
        ParallelConfig(
            tensor=8, pipeline=16, data=8, context=16, virtual_stages=2, zero_stage=2,
            recompute="full", micro_batch_size=1,
        ),
        380.0,
        "Llama 3 (2024) Table 4",
        tiled_attention=True,
    ),
)  # fmt: skip

PUBLISHED_SUITES: dict[str, tuple[PublishedRun, ...]] = {
    "megatron": MEGATRON_RUNS,
    "llama3": LLAMA3_RUNS,
}


def _view_cost(cost: StageCost, cross_bytes: float, backward_bytes: float) -> ViewCost:
    """A layer's cost as the stage table keeps it (as ``cost_table`` stores it)."""
    from alpa_ir.costs.stage_table import ViewCost

    m = cost.memory
    saving = cost.memory_saving
    return ViewCost(
        cost.latency,
        m.persistent,
        m.activations,
        cross_bytes,
        m.transient,
        backward_bytes,
        None if saving is None else _view_cost(saving, cross_bytes, backward_bytes),
        m.gradients,
        m.optimizer_state,
    )


def stage_devices(cluster: Cluster, config: ParallelConfig, stage: int) -> tuple[int, ...]:
    """Stage ``stage``'s devices: ``pipeline`` outermost, so a stage is a block of
    consecutive devices (whole nodes), tensor parallelism innermost."""
    size = cluster.num_devices // config.pipeline
    return tuple(range(stage * size, (stage + 1) * size))


def published_table(
    ranges: Any,
    cluster: Cluster,
    config: ParallelConfig,
    model: Any,
    rows: int | None = None,
    seq_len: int | None = None,
) -> tuple[StageCostTable, tuple[int, int]]:
    """Every layer priced on the stage mesh of ``config`` (first stage's devices),
    its arguments sharded as :func:`layer_specs` says (``rows``: the micro-batch's
    sequences, ``seq_len``: their length): a stage cost table of one submesh and
    one view."""
    from alpa_ir.costs.stage_table import StageCostTable
    from alpa_ir.pipeline.layer_phases import layer_phase_flops

    view = cluster.logical_mesh(config.stage_mesh_shape, stage_devices(cluster, config, 0))
    size = view.size
    m = cluster.devices_per_node
    submesh = (size // m, m) if size >= m else (1, size)
    table = StageCostTable(cluster, (submesh,), {submesh: (view,)}, ranges.num_layers)
    table.phase_flops = layer_phase_flops(ranges)
    for k in range(ranges.num_layers):
        extracted = ranges.function(k, k)
        function = layer_specs(extracted.function, extracted.param_args, config, rows, seq_len)
        try:
            cost = model.stage_cost(function, view, cluster, extracted.param_args)
        except AlpaError as error:
            raise AlpaError(f"layer {k} on mesh {list(view.shape)}: {error}") from error
        table.costs[(k, k, view.shape)] = _view_cost(
            cost, extracted.cross_bytes, extracted.backward_bytes
        )
        table.pairs_costed += 1
    table.internal = (ranges.internal_bytes_table(), ranges.internal_bytes_table(backward=True))
    return table, submesh


def simulate_published(
    ranges: Any,
    cluster: Cluster,
    config: ParallelConfig,
    model: Any,
    num_micro_batches: int,
    model_flops: float,
    rows: int | None = None,
    seq_len: int | None = None,
) -> Outcome:
    """The published plan ``config`` of the step ``ranges`` on ``cluster``, simulated
    (module docstring); ``rows``: the micro-batch's sequences (None: the
    activations' sharding is the ILP's), ``seq_len``: their length (context
    parallelism's hints)."""
    from alpa_ir.pipeline.stage_construction import StageChoice
    from alpa_ir.tools.bench_outcome import outcome

    config.check_cluster(cluster.num_devices, cluster.devices_per_node, "published")
    table, submesh = published_table(ranges, cluster, config, model, rows, seq_len)
    shape = config.stage_mesh_shape
    meshes = [
        cluster.logical_mesh(shape, stage_devices(cluster, config, s))
        for s in range(config.pipeline)
    ]
    mesh_of = interleaved_mesh_of(config.pipeline, config.virtual_stages)
    stages = []
    for c, (first, last) in enumerate(chunk_layers(ranges.num_layers, config.num_chunks)):
        cost = table.cost(first, last, shape).fitting(cluster.device_memory)
        stages.append(StageChoice(first, last, submesh, meshes[mesh_of[c]], cost, cost.latency))
    try:
        return outcome(
            "published",
            table,
            stages,
            num_micro_batches,
            model_flops,
            config.recompute == "full",
            config.schedule,
            mesh_of if config.virtual_stages > 1 else None,
        )
    except (AlpaError, PlanError) as error:
        return Outcome("published", error=str(error).split(";")[0])


def published_options(options: StageCostOptions) -> StageCostOptions:
    """The stage cost options of a published plan: every layer's argument
    shardings kept (:func:`layer_specs`: Megatron's tensor-parallel weights, the
    batch on the data axis), so the ILP only routes the activations between
    them; no second, memory-saving plan (the weights' sharding is given)."""
    return replace(options, keep_argument_specs=True, memory_fallback=False)


def layer_specs(
    function: Any,
    param_args: Any,
    config: ParallelConfig,
    rows: int | None,
    seq_len: int | None = None,
) -> Any:
    """``function`` with Megatron's sharding of its parameters on the stage mesh
    of ``config`` (tensor axis last) and, given the micro-batch's ``rows``, its
    activations split over the data axis (0) and, with context parallelism, their
    sequence over the context axis (1); with context parallelism and ``seq_len``,
    its attention's scores split by their queries over the context axis (hints,
    :mod:`alpa_ir.autosharding.context_hints`: Llama 3's context parallelism)."""
    from alpa_ir.autosharding.context_hints import with_context_hints
    from alpa_ir.autosharding.megatron_specs import batch_specs, megatron_specs
    from alpa_ir.costs.function_plan import with_argument_specs

    shape = config.stage_mesh_shape
    specs = megatron_specs(function, param_args, shape, len(shape) - 1)
    if rows is not None:
        split = [(0, 0), (1, 1)] if config.context > 1 else [(0, 0)]
        specs.update(batch_specs(function, param_args, rows, shape, split))
    function = with_argument_specs(function, specs)
    if config.context > 1 and seq_len is not None:
        function, _ = with_context_hints(function, shape, seq_len)
    return function


def run_published(
    run: PublishedRun,
    *,
    cost_model: str = "auto",
    time_limit: float = 60.0,
    fusion: bool = True,
    progress: bool = False,
) -> dict[str, Any]:
    """One row's ``published`` outcome and its figures (``run_row`` adds ``alpa``)."""
    from alpa_ir.costs.analytical_stage_cost import AnalyticalStageCostModel
    from alpa_ir.ir.module_utils import main_function
    from alpa_ir.models.registry import get_config
    from alpa_ir.models.train_step import train_step_flops
    from alpa_ir.pipeline.layer_ranges import LayerRanges
    from alpa_ir.plugins.registry import default_registry
    from alpa_ir.tools.bench_suite import bench_cluster, bench_optimizer, default_layers, trace

    config = run.config
    cluster = bench_cluster(run.cluster, run.gpus)
    batch = int(get_config(run.model).batch_size)
    micro = config.micro_batches(batch)
    flops = train_step_flops(run.model)
    t0 = time.perf_counter()
    module = trace(run.model, micro, default_layers(run.model))
    traced = time.perf_counter() - t0
    ranges = LayerRanges(main_function(module))
    stage_pass = default_registry().get_pass("construct-stages")(
        cluster=cluster.name,
        num_devices=cluster.num_devices,
        num_micro_batches=micro,
        remat=config.recompute == "full",
        zero=config.zero_stage >= 1,
        memory_fallback=True,  # the plan that shards every parameter (TP's or ZeRO-3's)
        fusion=fusion,
        optimizer_state_factor=bench_optimizer(run.model)[1],
        time_limit=time_limit,
        cost_model=cost_model,
        progress=progress,
    )
    options = replace(stage_pass.cost_options(), tiled_attention=run.tiled_attention)
    model = AnalyticalStageCostModel(published_options(options))
    seq_len = int(get_config(run.model).seq_len)
    result = simulate_published(
        ranges, cluster, config, model, micro, flops, batch // micro, seq_len
    )
    total = time.perf_counter() - t0
    return {
        "model": run.model,
        "gpus": run.gpus,
        "cluster": cluster.name,
        "seq_len": int(get_config(run.model).seq_len),
        "global_batch": batch,
        "num_micro_batches": micro,
        "config": config.describe(),
        "reported_tflops": run.reported_tflops,
        "source": run.source,
        "published": {**figures(result, run.gpus, cluster.peak_flops), "time": total},
        "trace_time": traced,
    }


def figures(result: Outcome, gpus: int, peak_flops: float) -> dict[str, Any]:
    """An outcome's iteration time, per-GPU TFLOPS and MFU (0 where it has no time)."""
    ok = not result.error and math.isfinite(result.iteration_time)
    tflops = result.pflops * 1e3 / gpus if ok else 0.0
    return {
        "iteration_time": result.iteration_time,
        "tflops_per_gpu": tflops,
        "mfu": tflops * 1e12 / peak_flops,
        "peak_memory_gib": result.peak_memory_gib,
        "error": result.error,
        "stages": len(result.stages),
    }


def format_row(row: dict[str, Any]) -> str:
    """A row as text: the published plan beside the planner's."""
    head = (
        f"{row['model']} on {row['gpus']} GPUs ({row['cluster']}), seq {row['seq_len']}, "
        f"batch {row['global_batch']}, B={row['num_micro_batches']}: published {row['config']} "
        f"({row['source']}: {row['reported_tflops']:g} TFLOPS/GPU reported)"
    )
    lines = [
        head,
        f"  {'method':<10} {'plan s':>7} {'cpu s':>7} {'iter s':>9} {'TFLOPS':>7} {'MFU':>6}  note",
    ]
    for method in ("alpa", "published"):
        r = row.get(method)
        if r is None:
            continue
        note = r.get("error") or r.get("note", "")
        cpu = f"{r['cpu']:7.1f}" if "cpu" in r else f"{'-':>7}"
        lines.append(
            f"  {method:<10} {r.get('time', 0.0):7.1f} {cpu} {r['iteration_time']:9.4g} "
            f"{r['tflops_per_gpu']:7.1f} {100 * r['mfu']:5.1f}%  {note}"[:300]
        )
    return "\n".join(lines)


__all__ = [
    "LLAMA3_RUNS",
    "MEGATRON_RUNS",
    "PUBLISHED_SUITES",
    "PublishedRun",
    "figures",
    "format_row",
    "run_published",
    "simulate_published",
]
