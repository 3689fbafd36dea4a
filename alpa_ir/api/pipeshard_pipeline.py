"""A :class:`~alpa_ir.api.pipeshard.PipeshardParallel` resolved once into what
planning needs: the backend and devices it runs on, the passes that draw the
step's layers, the passes that plan the stages, the cluster automatic stages
plan on, and how many costing workers to start ahead.

:func:`resolve_pipeshard` reads the method (and the session's backend) at one
place; :func:`~alpa_ir.api.pipeshard_executable.plan_pipeshard` then asks the
resolved :class:`PipeshardPipeline` for each piece, never the method again.
"""

from __future__ import annotations

import logging
import warnings
from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any

from alpa_ir.api.pipeshard import (
    AutoLayerOption,
    AutoStageOption,
    ManualLayerOption,
    ManualStageOption,
    PipeshardParallel,
    _device_ids,
    manual_placements,
    uniform_placements,
)
from alpa_ir.errors import AlpaError
from alpa_ir.frontend.arguments import check_micro_batches
from alpa_ir.hardware.memory_budget import MemoryBudget
from alpa_ir.pipeline.schedule_kinds import SPLIT_SCHEDULES

LOG = logging.getLogger(__name__)


@dataclass(frozen=True)
class PipeshardPipeline:
    """A method's planning, resolved (:func:`resolve_pipeshard`)."""

    method: PipeshardParallel
    """The method, its ``backend`` resolved (``xla`` or ``ray``)."""
    backend: str
    devices: tuple[int, ...]
    """The device ids the plan may use (of the Ray cluster on ``ray``)."""
    num_micro_batches: int
    local_all_gather: bool = True
    """``cross-mesh-resharding``'s send-once + local all-gather (Alpa's
    ``global_config.use_local_allgather``)."""

    def layer_passes(self, marked: bool) -> list[str]:
        """The passes that draw the imported step's layers: with
        :class:`AutoLayerOption` ``cluster-operators`` cuts its forward pass; the
        user's boundaries (``mark_pipeline_boundary``, ``marked``) otherwise.
        Boundaries JAX did not mirror into the backward pass are mirrored."""
        b = self.num_micro_batches
        passes = [f"draw-micro-batch-rows{{num-micro-batches={b}}}"] if b > 1 else []
        passes += ["merge-backward-runs", "split-conditionals"]
        option = self.method.layer_option
        if option is None:  # the step's own boundaries, else Alpa's default
            option = ManualLayerOption() if marked else AutoLayerOption(layer_num=2)
        if isinstance(option, AutoLayerOption):
            if marked:  # Alpa's automatic layers ignore the step's own boundaries too
                warnings.warn(
                    "PipeshardParallel: the step marks its own layer boundaries "
                    "(mark_pipeline_boundary) but asks for AutoLayerOption: they are replaced "
                    f"by {option.layer_num} automatic layers; use ManualLayerOption to keep them",
                    UserWarning,
                    stacklevel=4,
                )
            replace_markers = " replace-markers=true" if marked else ""
            passes.append(
                f"cluster-operators{{layers={option.layer_num} delta={option.eps}{replace_markers}}}"
            )
        return [*passes, "mirror-layers"]

    def plan_passes(self, num_layers: int, schedules: Mapping[str, Any] | None = None) -> list[str]:
        """The passes that plan the stages of a step of ``num_layers`` layers:
        the stage pass, ``shard-stages`` with the method's auto-sharding,
        ``split-backward`` where the schedule needs it, the cross-mesh plan
        and the instructions."""
        inner = self.method.auto_sharding_option.pipeline(1).removeprefix("builtin.module(")[:-1]
        propagate = ""
        if not self.method.auto_sharding_option.enable_auto_sharding:
            propagate = " propagate=true"
            LOG.info(
                "PipeshardParallel: enable_auto_sharding=False: no ILP; each stage keeps "
                "the given specs and XLA's sharding propagation lays out the rest"
            )
        crossing = "cross-mesh-resharding"
        if not self.local_all_gather:
            crossing += "{local-all-gather=false}"
        given = self.method.stage_input_shardings
        forced = ""
        if given is not None:
            from alpa_ir.pipeline.stage_specs import format_stage_specs

            forced = f' input-specs="{format_stage_specs(given)}"'  # type: ignore[arg-type]
        return [
            self._stage_pass(num_layers, schedules),
            f'shard-stages{{stage-pipeline="{inner}"{self._stage_pipelines()}{forced}'
            f"{self._manual_axes()}{propagate}}}",
            *self._split_pass(),
            crossing,
            "emit-instructions",
        ]

    def _manual_axes(self) -> str:
        """``shard-stages``' ``mesh-axis-names`` and ``intermediate-axes`` from
        the method's ``ManualShardingOption`` ('' without one)."""
        manual = self.method.manual_sharding_option
        if manual is None:
            return ""
        from alpa_ir.pipeline.manual_stage_specs import (
            format_intermediate_axes,
            format_mesh_axis_names,
        )

        names = manual.submesh_axis_names or (manual.mesh_axis_names,)
        text = f' mesh-axis-names="{format_mesh_axis_names(names)}"'  # type: ignore[arg-type]
        if manual.pipeline_intermediate_axes:
            axes = format_intermediate_axes(manual.pipeline_intermediate_axes)
            text += f' intermediate-axes="{axes}"'
        return text

    def _stage_pipelines(self) -> str:
        """``shard-stages``' ``stage-pipelines`` option where a
        ``ManualStageOption`` changes a stage's auto-sharding option, else ''."""
        import dataclasses

        option = self.method.stage_option
        if not isinstance(option, ManualStageOption):
            return ""
        changes = option.stage_option_changes()
        if not any(changes):
            return ""
        base = self.method.auto_sharding_option
        texts = []
        for k, change in enumerate(changes):
            if not change:
                texts.append("")
                continue
            try:
                changed = dataclasses.replace(base, **change)
            except TypeError:
                names = ", ".join(sorted(change))
                raise AlpaError(
                    f"ManualStageOption: stage {k}'s submesh_autosharding_option_dicts names "
                    f"{names}; AutoShardingOption has no such field"
                ) from None
            texts.append(changed.pipeline(1).removeprefix("builtin.module(")[:-1])
        return f' stage-pipelines="{";".join(texts)}"'

    def _split_pass(self) -> list[str]:
        """``split-backward`` where the schedule runs B and W apart, or may."""
        method = self.method
        if method.pipeline_schedule in SPLIT_SCHEDULES or method.is_plugin_schedule:
            return ["split-backward"]  # a plugin's order may run W apart from B
        if method.pipeline_schedule == "auto" and isinstance(method.stage_option, AutoStageOption):
            return ["split-backward{zero-bubble-only=true}"]
        return []

    def _stage_pass(self, num_layers: int, schedules: Mapping[str, Any] | None) -> str:
        """``outline-stages`` with the uniform or manual slicing, or ``construct-stages``."""
        method, devices = self.method, self.devices
        option = method.stage_option
        b, schedule = self.num_micro_batches, method.pipeline_schedule
        if schedule == "auto" and not isinstance(option, AutoStageOption):
            schedule = "1f1b"  # given stages: nothing to choose the schedule with
        remat = "true" if method.remat_layer else "false"
        if isinstance(option, AutoStageOption):
            ids = ",".join(str(d) for d in devices)
            space = option.submesh_logical_shape_space.replace("_", "-")
            physical = option.submesh_physical_shape_space.replace("_", "-")
            if option.manually_specified_submeshes:
                shapes = ",".join(f"{n}x{m}" for n, m in option.manually_specified_submeshes)
                physical += f" submeshes={shapes}"
            comm = option.cross_stage_comm
            comm_text = comm if isinstance(comm, str) else str(comm).lower()
            return (
                f"construct-stages{{num-micro-batches={b} schedule={schedule} "
                f"submesh-space={space} physical-space={physical} "
                f"stage-cost-model={option.stage_cost_model} "
                f"progress=false remat={remat} cost-mode={option.cost_mode} "
                f"workers={option.worker_count()} repeated-layers={option.repeated_layers} "
                f"cross-stage-comm={comm_text} devices={ids}}}"
            )
        if isinstance(option, ManualStageOption):
            if method.chunks_per_mesh > 1:
                raise AlpaError(
                    f"pipeline_schedule {schedule!r} cuts the layers into chunks per mesh; give "
                    "the stages as UniformStageOption, not ManualStageOption"
                )
            placements = manual_placements(num_layers, devices, option)
        else:
            placements = uniform_placements(num_layers, devices, option)
        meshes = ",".join("x".join(str(n) for n in p.mesh.shape) for p in placements)
        ids = ",".join(str(d) for p in placements for d in p.mesh.devices or ())  # those used
        if method.chunks_per_mesh == 1:
            layers = ",".join(f"{p.first}-{p.last}" for p in placements)
            mesh_of = ""
        else:
            layers, mesh_of = self._chunks(num_layers, len(placements), schedules)
        return (
            f"outline-stages{{layers={layers} meshes={meshes}{mesh_of} devices={ids} "
            f"num-micro-batches={b} schedule={schedule} remat={remat}}}"
        )

    def _chunks(
        self, num_layers: int, meshes: int, schedules: Mapping[str, Any] | None
    ) -> tuple[str, str]:
        """The layers cut into ``meshes × v`` chunks and each chunk's mesh, as the
        schedule places them (``outline-stages``' ``layers`` and `` mesh-of=``)."""
        from alpa_ir.pipeline.schedule_kinds import build_schedule

        method = self.method
        v = method.chunks_per_mesh
        count = meshes * v
        if count > num_layers:
            raise AlpaError(
                f"pipeline_schedule {method.pipeline_schedule!r}: {meshes} stages x {v} chunks "
                f"need {count} layers, the step has {num_layers}"
            )
        order = build_schedule(
            method.pipeline_schedule, meshes, self.num_micro_batches, v, schedules=schedules
        )
        bounds = [round(k * num_layers / count) for k in range(count + 1)]
        layers = ",".join(f"{bounds[k]}-{bounds[k + 1] - 1}" for k in range(count))
        return layers, " mesh-of=" + ",".join(str(m) for m in order.mesh_of)

    def planning_cluster(self, budget: MemoryBudget) -> Any:
        """The cluster automatic stages plan on (None for given stages): the
        devices the plan may use as one node, each with ``budget`` bytes; on
        the ray backend with several hosts of equal devices, those hosts joined
        by their link (probed at ``init``, else a default), so ``(1, 2^m)``
        submeshes stay inside a host and ``(n, M)`` ones span hosts."""
        if not isinstance(self.method.stage_option, AutoStageOption):
            return None
        from alpa_ir.hardware.clusters import local_cpu

        num_devices = len(self.devices)
        node = local_cpu(budget=budget).one_node(num_devices)
        if self.backend != "ray":
            return node
        from alpa_ir.runtime.ray_cluster import cluster_hosts, host_link

        hosts = cluster_hosts()
        per_host = {h.num_devices for h in hosts}
        if len(hosts) < 2 or len(per_host) != 1:
            return node
        (m,) = per_host
        if num_devices % m:
            return node
        link = host_link(hosts[0].resource)
        node = local_cpu(budget=budget).one_node(m)
        return node.across_hosts(num_devices // m, link.bandwidth, link.latency)

    def early_workers(self, num_ops: int) -> int:
        """How many costing workers to start before the layers are found: those
        ``construct-stages`` will want besides this process, for a step of
        ``num_ops`` ops large enough that its cost table will
        (:data:`~alpa_ir.costs.stage_table.WORKERS_FROM_OPS`)."""
        from alpa_ir.costs.stage_table import WORKERS_FROM_OPS

        option = self.method.stage_option
        if not isinstance(option, AutoStageOption) or option.stage_cost_model != "analytical":
            return 0  # a model that measures on the local devices costs in this process
        return option.worker_count() - 1 if num_ops >= WORKERS_FROM_OPS else 0


def resolve_pipeshard(
    method: PipeshardParallel, local_all_gather: bool = True
) -> PipeshardPipeline:
    """``method`` resolved for planning: its backend (the session's when it
    names none), its device ids (the session's virtual mesh when it names
    none and the session has one) and its micro-batch count, checked."""
    from alpa_ir.api.runtime_api import session_backend

    backend = session_backend(method.backend)
    method = replace(method, backend=backend)
    if method.devices is None:  # the session's mesh (set_global_virtual_physical_mesh), if any
        from alpa_ir.api.session_meshes import session_virtual_mesh

        kept = session_virtual_mesh()
        if kept is not None:
            method = replace(method, devices=kept.logical_mesh())
    devices = _device_ids(method.devices, backend)
    b = check_micro_batches(method.num_micro_batches)
    return PipeshardPipeline(method, backend, devices, b, local_all_gather)


__all__ = ["PipeshardPipeline", "resolve_pipeshard"]
