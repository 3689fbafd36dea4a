"""``construct-stages``: Alpa's stage construction (OSDI'22 §5.2, AutoStageOption).

Input: a module whose ``@main`` is a marked training step with ``L`` layers
(:func:`alpa_ir.pipeline.stage_assignment.count_layers`), traced at the micro-batch
shape. The pass prices every layer range on every submesh view
(:mod:`alpa_ir.costs.stage_table`), slices the layers into stages by Alpa's DP,
places them on the devices and chooses the pipeline schedule
(:mod:`alpa_ir.pipeline.stage_construction`), and writes the outlined pipeline
IR. Progress (stage-mesh pairs costed) goes to stderr; ``pipeline.plan`` gets
the plan's latency (``construct_stages.latency``, seconds per iteration) and,
with ``schedule=auto``, every candidate schedule's simulated time
(``construct_stages.schedules``).
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Literal

from xdsl.context import Context
from xdsl.dialects.builtin import ModuleOp
from xdsl.passes import ModulePass

from alpa_ir.costs.stage_cost import StageCostOptions
from alpa_ir.errors import AlpaError
from alpa_ir.pipeline.stage_construction import construct_stages, module_cluster


@dataclass(frozen=True)
class ConstructStages(ModulePass):
    """Slice the layers into stages on submeshes (module docstring)."""

    name = "construct-stages"

    cluster: str = ""
    """Cluster preset; empty: the module's ``mesh.cluster``."""
    num_micro_batches: int = 1
    """Micro-batches per step (B of the pipeline latency (B - 1) max t + sum t)."""
    schedule: str = "1f1b"
    """The pipeline schedule: ``1f1b``, ``gpipe``, ``zb-h1`` (the stages are planned
    for it), or ``auto``: the fastest of them that fits, chosen with the stages
    (each candidate's simulated time goes into ``construct_stages.schedules``)."""
    submesh_space: str = "all"
    """Logical meshes costed per submesh (Alpa's ``submesh_logical_shape_space``,
    :data:`~alpa_ir.costs.stage_table.SUBMESH_SPACES`): ``all`` 2-d shapes,
    ``single-node-model-parallel`` (the node's devices on the model-parallel
    axis), ``one-dimensional``, ``same-as-physical``, ``data-parallel-only``,
    ``model-parallel-only``."""
    physical_space: str = "all"
    """The submeshes searched (Alpa's ``submesh_physical_shape_space``,
    :data:`~alpa_ir.costs.stage_table.PHYSICAL_SPACES`): ``all``,
    ``power-of-two``, ``small-power-of-two`` or ``manual`` (``submeshes``)."""
    submeshes: str = ""
    """With ``physical-space=manual``: the submeshes, e.g. ``1x2,1x4`` (Alpa's
    ``manually_specified_submeshes``)."""
    epsilon: float = 0.0
    """Alpa's ε: skip stage-mesh pairs whose cost exceeds (1 + ε) times the best
    pair's for the same layers; 0 keeps all."""
    cost_mode: Literal["range", "layer-sum"] = "range"
    """Cost a stage as its whole layer range planned at once, or as the sum of its
    layers' costs (faster, less exact)."""
    cross_stage_comm: bool | Literal["auto"] = False
    """Add the transfers between consecutive stages to the DP's objective; ``auto``:
    plan without and with them and keep the plan the simulator times faster."""
    progress: bool = True
    """Report the costing of stage-mesh pairs on stderr."""
    stage_cost_model: str = "analytical"
    """A registered stage cost model (``analytical``, ``profile``: measured on
    the local devices, for the ``local-cpu`` cluster)."""
    workers: int = 1
    """Processes that cost the stage-mesh pairs (``alpa_ir.costs.costing_workers``;
    a model that measures on the local devices always costs in this one). Those
    the context carries, started ahead (``AlpaContext.costing_workers``), are
    taken first."""
    remat: bool = False
    """Each stage's backward recomputes its forward values (Alpa's
    ``remat_layer``); the stage cost model prices the recomputation."""
    zero: bool = False
    """Cost stages with ZeRO-2: gradients and optimizer state partitioned where
    parameters are replicated."""
    fusion: bool = False
    """Model XLA's fusion in the stages' activation memory and memory traffic."""
    repeated_layers: Literal["auto", "share", "separate"] = "auto"
    """The stage-mesh pairs' auto-sharding of repeated blocks (``auto-sharding``'s
    option): ``share`` prices each block's copies planned alike, a smaller ILP
    (GPT-2 small's automatic layers of four blocks: 1.7x faster costing, latencies
    within 4 %); the stages chosen are then planned exactly by ``shard-stages``."""
    memory_fallback: bool = False
    """Also cost each stage with every parameter sharded where the first plan
    holds much of the device memory, and keep the fastest plan that fits."""
    optimizer_state_factor: float = 2.0
    """Optimizer state per parameter byte (Adam: 2, SGD: 0)."""
    cost_model: str = "auto"
    """The communication cost model of the stages' inner auto-sharding and their
    communication time (``auto``: ``calibrated`` on GPU clusters, Alpa's
    ``alpha-beta`` elsewhere)."""
    solver: str = "cbc"
    """The registered ILP solver of the stages' inner auto-sharding."""
    time_limit: float = 60.0
    """Seconds per inner auto-sharding solve."""
    num_devices: int = 0
    """With ``cluster``: as many of the preset's nodes as hold this many devices
    (``alpa-bench --gpus``); 0: the preset's default size."""
    devices: tuple[int, ...] = ()
    """The device ids the cluster's devices stand for, in order (the planned
    meshes take these); empty: ``0..n-1``."""

    def cost_options(self) -> StageCostOptions:
        """The stage cost model's options: the pass's fields of the same names
        (solver, time limit, remat, ZeRO, fusion, ...), the model's defaults for the rest."""
        shared = {f.name for f in fields(self)} & {f.name for f in fields(StageCostOptions)}
        return StageCostOptions(**{name: getattr(self, name) for name in shared})

    def apply(self, ctx: Context, op: ModuleOp) -> None:
        from alpa_ir.plugins.registry import registry_of

        registry = registry_of(ctx)  # the caller's: presets from --load-plugin are seen
        model = registry.get("stage_cost_models", self.stage_cost_model)(self.cost_options())
        construct_stages(
            op,
            module_cluster(op, self.cluster, registry.cluster_presets, self.num_devices),
            num_micro_batches=self.num_micro_batches,
            schedule=self.schedule,
            submesh_space=self.submesh_space,
            physical_space=self.physical_space,
            submeshes=parse_submeshes(self.submeshes),
            epsilon=self.epsilon,
            cost_mode=self.cost_mode,
            cross_stage_comm=self.cross_stage_comm,
            model=model,
            progress=self.progress,
            workers=self.workers,
            remat=self.remat,
            devices=self.devices,
            started_workers=getattr(ctx, "costing_workers", None),  # AlpaContext's
        )


def parse_submeshes(text: str) -> tuple[tuple[int, int], ...]:
    """``1x2,2x8`` as ``((1, 2), (2, 8))``; a malformed entry is named."""
    out = []
    for entry in filter(None, text.split(",")):
        n, sep, m = entry.partition("x")
        if not sep or not n.isdigit() or not m.isdigit():
            raise AlpaError(f"construct-stages: submesh '{entry}' is not NxM (e.g. 1x4)")
        out.append((int(n), int(m)))
    return tuple(out)


__all__ = ["ConstructStages", "parse_submeshes"]
