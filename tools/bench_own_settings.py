"""``alpa-bench --method-settings own``: the baselines with the artifact's own
settings of each method (:mod:`alpa_ir.models.method_settings`), not Alpa's plan's.

For each method the artifact ran with a setting of its own, the step is traced
again at that method's micro-batch shape and priced with its own options
(micro-batch count, so the gradients' synchronization is amortised over its
own count; remat), on the views the method runs on only:

- ``intra-op``: one stage of every layer on the script's logical mesh of all devices;
- ``inter-op``: a 1x1 mesh per GPU, 1F1B, the step's automatic layers (one
  per block, remat per block as the scripts' models; at least one per GPU)
  priced on one device; equal layers per stage where the script ran
  ``uniform_layer_gpipe`` (GPT-3, MoE), the stage DP's slicing where the
  artifact's plan came from its search (Wide-ResNet);
- ``megatron``: the published ``(dp, tp)`` view on every stage of ``pp``
  equal stages (:func:`~alpa_ir.tools.bench_baselines.uniform_grid` on that one view);
- ``pp-dp``: the stage DP over every submesh with data-parallel-only views.

A row the artifact measured with a manual plan (Wide-ResNet's inter-op-only
and PP-DP rows: :attr:`MethodSetting.stage_layer_ids`) is that plan,
simulated as :mod:`alpa_ir.tools.bench_alpa_plans` simulates Alpa's own
(its stages scaled onto the traced layers, each priced on its own logical
mesh), not a plan searched again.

Where a method ran several micro-batch counts, each is simulated and the
fastest kept, as the artifact kept its best run.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from alpa_ir.errors import AlpaError, PlanError
from alpa_ir.models.method_settings import MethodSetting, method_setting

if TYPE_CHECKING:
    from xdsl.dialects.builtin import ModuleOp

    from alpa_ir.costs.stage_table import StageCostTable
    from alpa_ir.hardware.clusters import Cluster
    from alpa_ir.hardware.device_mesh import LogicalDeviceMesh
    from alpa_ir.tools.published_plan import AlpaPlan
from alpa_ir.tools.bench_outcome import Outcome

TraceStep = Callable[[int, int], "ModuleOp"]
"""The step imported again at ``(micro-batches, automatic layers)``
(:func:`alpa_ir.tools.bench_suite.trace` of the model, injected)."""
OWN_METHODS = ("intra-op", "inter-op", "megatron", "pp-dp")
"""The baselines whose settings the artifact chose per method."""


def describe(setting: MethodSetting, micro_batches: int) -> str:
    """One line: the setting a method's row was simulated with."""
    parts = [f"B={micro_batches}"]
    if setting.logical_mesh is not None:
        mesh = "x".join(map(str, setting.logical_mesh))
        parts.append(f"(dp, tp) {mesh}, pp {setting.stages}" if setting.stages else f"mesh {mesh}")
    if setting.stage_layer_ids is not None:
        parts.append(f"the artifact's manual plan of {len(setting.stage_layer_ids)} stages")
    if setting.data_parallel_only:
        parts.append("dp-only views")
    parts.append("remat" if setting.remat else "no remat")
    return f"{', '.join(parts)} ({setting.source})"


def setting_views(
    setting: MethodSetting, cluster: Cluster, space: str
) -> dict[tuple[int, int], tuple[LogicalDeviceMesh, ...]]:
    """The submeshes and views ``setting``'s method runs on (intra-op, megatron,
    pp-dp; inter-op prices 1x1 meshes of its own)."""
    from alpa_ir.costs.stage_table import submesh_views

    views = submesh_views(cluster, space)
    if setting.stage_layer_ids is not None:  # a manual plan: its stages' meshes only
        wanted: dict[tuple[int, int], set[tuple[int, ...]]] = {}
        for physical, logical in zip(setting.submeshes, setting.logical_meshes, strict=True):
            wanted.setdefault(physical, set()).add(tuple(logical))
        missing = [p for p in wanted if p not in views]
        if missing:
            raise AlpaError(
                f"{setting.model} {setting.method}: submesh {missing[0]} is not among the "
                f"submeshes of {cluster.num_devices} devices"
            )
        return {p: tuple(v for v in views[p] if tuple(v.shape) in wanted[p]) for p in wanted}
    if setting.method == "pp-dp":
        kept = {s: tuple(v for v in vs if v.shape[-1] == 1) for s, vs in views.items()}
        return {s: vs for s, vs in kept.items() if vs}
    if setting.logical_mesh is None:
        raise AlpaError(f"{setting.model} {setting.method}: the setting names no logical mesh")
    shape = setting.logical_mesh
    size = shape[0] * shape[1]
    if setting.method == "intra-op" and size != cluster.num_devices:
        raise AlpaError(
            f"{setting.model} intra-op: mesh {shape} is not all {cluster.num_devices} devices"
        )
    for submesh, vs in views.items():
        if submesh[0] * submesh[1] != size:
            continue
        match = tuple(v for v in vs if tuple(v.shape) == shape)
        if match:
            return {submesh: match}
    raise AlpaError(
        f"{setting.model} {setting.method}: no view {shape} among the submeshes of "
        f"{cluster.num_devices} devices"
    )


def manual_plan(setting: MethodSetting, micro_batches: int) -> AlpaPlan:
    """``setting``'s manual plan (:attr:`MethodSetting.stage_layer_ids`) at
    ``micro_batches``, as :mod:`alpa_ir.tools.bench_alpa_plans` gives Alpa's own."""
    from alpa_ir.api.pipeshard import ManualStageOption
    from alpa_ir.tools.published_plan import AlpaPlan

    assert setting.stage_layer_ids is not None
    stages = ManualStageOption(
        [list(ids) for ids in setting.stage_layer_ids],
        [tuple(m) for m in setting.logical_meshes],
    )
    return AlpaPlan(
        setting.artifact_layers,
        micro_batches,
        stages,
        setting.submeshes,
        (None,) * len(setting.submeshes),
        setting.source,
    )


def on_one_device(setting: MethodSetting) -> bool:
    """Whether ``setting``'s method runs on 1x1 meshes only (inter-op), so its
    layers are priced on one device."""
    if setting.stage_layer_ids is not None:
        return all(s == (1, 1) for s in setting.submeshes)
    return setting.method == "inter-op"


def _simulated(
    setting: MethodSetting,
    micro_batches: int,
    table: StageCostTable,
    flops: float,
) -> Outcome:
    from alpa_ir.tools.bench_baselines import restricted, uniform_grid
    from alpa_ir.tools.published_plan import published_outcome

    if setting.stage_layer_ids is not None:
        return replace(
            published_outcome(manual_plan(setting, micro_batches), table, flops, setting.remat),
            method=setting.method,
        )
    if setting.method == "inter-op" and setting.uniform_layers:
        # equal layers on a 1x1 mesh per device: the grid's one point of op = 1, pp = devices
        return replace(
            uniform_grid(table, micro_batches, flops, 1, setting.remat), method="inter-op"
        )
    if setting.method == "megatron":
        out = uniform_grid(table, micro_batches, flops, None, setting.remat)
        if out.stages and len(out.stages) != setting.stages:
            return Outcome("megatron", error=f"the grid has {len(out.stages)} stages, not pp")
        return out
    return restricted(
        setting.method, table, list(table.submeshes), micro_batches, flops, setting.remat
    )


def own_setting_outcome(
    name: str,
    cluster: Cluster,
    setting: MethodSetting,
    micro_batches: int,
    *,
    trace_step: TraceStep,
    layers: int,
    flops: float,
    stage_options: dict[str, Any],
    cost_mode: str,
    submesh_space: str,
    workers: int,
    progress: bool,
) -> Outcome:
    """``setting``'s method simulated at ``micro_batches``: the step traced at its
    micro-batch shape (``trace_step``), priced with its options on its views
    (module docstring).
    ``stage_options``: ``construct-stages``' options of the run (the setting's
    micro-batches and remat replace its own)."""
    from alpa_ir.costs.analytical_stage_cost import AnalyticalStageCostModel
    from alpa_ir.costs.stage_table import cost_table
    from alpa_ir.ir.module_utils import main_function
    from alpa_ir.pipeline.layer_phases import layer_phase_flops
    from alpa_ir.pipeline.layer_ranges import LayerRanges
    from alpa_ir.plugins.registry import default_registry
    from alpa_ir.tools.bench_baselines import one_device

    stage_pass = default_registry().get_pass("construct-stages")(
        **{
            **stage_options,
            "num_micro_batches": micro_batches,
            "remat": setting.remat,
            "cost_mode": cost_mode,
            "submesh_space": submesh_space,
        }
    )
    options = stage_pass.cost_options()
    if setting.force_batch_dim_to_mesh_dim >= 0:
        options = replace(options, force_batch_dim_to_mesh_dim=setting.force_batch_dim_to_mesh_dim)
    model = AnalyticalStageCostModel(options)
    inter = on_one_device(setting)
    # inter-op: at least a layer per device (remat stays per layer), priced on one device
    count = max(layers, cluster.num_devices) if inter else layers
    module = trace_step(micro_batches, count)
    ranges = LayerRanges(main_function(module))
    table = cost_table(
        ranges,
        one_device(cluster) if inter else cluster,
        model,
        cost_mode=cost_mode,
        workers=workers,
        progress=progress,
        phase_flops=layer_phase_flops(ranges),
        views=None if inter else setting_views(setting, cluster, submesh_space),
    )
    if inter:
        table = replace(table, cluster=cluster)  # its 1x1 prices hold on the whole cluster
    return _simulated(setting, micro_batches, table, flops)


def own_settings_outcomes(
    name: str,
    cluster: Cluster,
    *,
    batch_size: int,
    trace_step: TraceStep,
    layers: int,
    flops: float,
    stage_options: dict[str, Any],
    cost_mode: str,
    submesh_space: str,
    workers: int = 1,
    progress: bool = False,
) -> dict[str, dict[str, Any]]:
    """Every method of :data:`OWN_METHODS` with a setting of its own for
    ``name``: the fastest of its micro-batch counts that divide ``batch_size``,
    as an outcome dict with ``setting`` (what it ran with) and ``tried`` (each
    count's iteration time); ``seconds``: the CPU-side time it took."""
    out: dict[str, dict[str, Any]] = {}
    for method in OWN_METHODS:
        setting = method_setting(name, method)
        if setting is None:
            continue
        t0 = time.perf_counter()
        best: tuple[Outcome, int] | None = None
        tried: list[dict[str, Any]] = []
        for count in setting.micro_batches:
            if batch_size % count:
                continue
            try:
                o = own_setting_outcome(
                    name,
                    cluster,
                    setting,
                    count,
                    trace_step=trace_step,
                    layers=layers,
                    flops=flops,
                    stage_options=stage_options,
                    cost_mode=cost_mode,
                    submesh_space=submesh_space,
                    workers=workers,
                    progress=progress,
                )
            except (AlpaError, PlanError) as error:
                o = Outcome(method, error=str(error).split(";")[0])
            tried.append({"num_micro_batches": count, "iteration_time": o.iteration_time})
            if best is None or o.iteration_time < best[0].iteration_time:
                best = (o, count)
        if best is None:
            continue
        outcome, count = best
        out[method] = {
            **outcome.__dict__,
            "setting": describe(setting, count),
            "tried": tried,
            "seconds": time.perf_counter() - t0,
        }
    return out
