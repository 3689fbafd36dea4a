"""``outline-stages``: the pipeline IR of a given slicing of the layers into stages.

Input: a marked training step (layers from ``mark_pipeline_boundary`` or
``cluster-operators``, mirrored into the backward pass). The options give
each stage's layers and logical mesh shape; the meshes take the device ids
in order. With ``mesh-of``, several stages share a mesh (virtual stages, as
interleaved and V schedules place them): ``meshes`` then lists the meshes and
``mesh-of`` gives each stage's. The pass writes one ``mesh.logical_mesh @meshK``
per mesh and
outlines the step (:func:`alpa_ir.pipeline.stage_outline.outline_stages`): per-stage
forward, backward and apply-grad functions, ``pipeline.plan`` and
``pipeline.stage`` ops, and ``@main`` as the driver. ``construct-stages``
produces the same form from its own plan; this pass is what
``UniformStageOption`` and ``ManualStageOption`` stand for.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from xdsl.context import Context
from xdsl.dialects.builtin import ModuleOp
from xdsl.passes import ModulePass

from alpa_ir.dialects.pipeline import SCHEDULES
from alpa_ir.errors import AlpaError
from alpa_ir.hardware.device_mesh import LogicalDeviceMesh
from alpa_ir.ir.module_utils import main_function
from alpa_ir.pipeline.stage_assignment import StageSlice, fresh_mesh_names
from alpa_ir.pipeline.stage_outline import outline_stages
from alpa_ir.plugins.registry import registry_of


def _pair(text: str, sep: str, what: str) -> tuple[int, int]:
    parts = text.split(sep)
    if len(parts) != 2 or not all(p.strip().isdigit() for p in parts):
        raise AlpaError(f"outline-stages: {what} '{text}' is not of the form N{sep}M")
    return int(parts[0]), int(parts[1])


@dataclass(frozen=True)
class OutlineStages(ModulePass):
    """Outline ``@main`` into the given stages on the given meshes (module docstring)."""

    name = "outline-stages"

    layers: tuple[str, ...] = ()
    """Each stage's layers as ``first-last``, in order and covering every layer
    (``0-1,2-3``)."""
    meshes: tuple[str, ...] = ()
    """Each stage's logical mesh shape as ``NxM`` (``1x2,1x2``); with ``mesh-of``,
    each mesh's."""
    mesh_of: tuple[int, ...] = ()
    """The mesh of each stage, as an index into ``meshes``; empty: stage k on mesh k."""
    devices: tuple[int, ...] = ()
    """The device ids the meshes take, in order; empty: ``0..n-1``."""
    num_micro_batches: int = 1
    """Micro-batches per step."""
    schedule: str = "1f1b"
    """The pipeline schedule recorded in the plan (gpipe, 1f1b, zb-h1, ...)."""
    remat: bool = False
    """Each stage's backward recomputes its forward values (Alpa's ``remat_layer``)."""

    def stage_mesh_indices(self) -> list[int]:
        if not self.mesh_of:
            if len(self.layers) != len(self.meshes):
                raise AlpaError(
                    f"outline-stages: {len(self.layers)} layer ranges but {len(self.meshes)} meshes"
                )
            return list(range(len(self.meshes)))
        if len(self.mesh_of) != len(self.layers):
            raise AlpaError(
                f"outline-stages: mesh-of names {len(self.mesh_of)} meshes for "
                f"{len(self.layers)} layer ranges"
            )
        if sorted(set(self.mesh_of)) != list(range(len(self.meshes))):
            raise AlpaError(
                f"outline-stages: mesh-of must use each of the {len(self.meshes)} meshes "
                f"(0..{len(self.meshes) - 1}), got {','.join(map(str, self.mesh_of))}"
            )
        return list(self.mesh_of)

    def stage_meshes(self) -> list[LogicalDeviceMesh]:
        """The meshes (one per entry of ``meshes``), on the device ids in order."""
        self.stage_mesh_indices()
        shapes = [_pair(m, "x", "mesh shape") for m in self.meshes]
        need = sum(math.prod(s) for s in shapes)
        devices = self.devices or tuple(range(need))
        if need != len(devices):
            raise AlpaError(f"outline-stages: the meshes hold {need} devices, {len(devices)} given")
        out, start = [], 0
        for shape in shapes:
            size = math.prod(shape)
            out.append(LogicalDeviceMesh(shape, devices=tuple(devices[start : start + size])))
            start += size
        return out

    def apply(self, ctx: Context, op: ModuleOp) -> None:
        known = dict.fromkeys((*SCHEDULES, *registry_of(ctx).schedules))
        meshes = self.stage_meshes()
        ranges = [_pair(r, "-", "layer range") for r in self.layers]
        names = fresh_mesh_names(op, len(meshes))
        main = main_function(op)
        for mesh, name in zip(meshes, names, strict=True):
            op.body.block.insert_op_before(mesh.to_op(name), main)
        of = self.stage_mesh_indices()
        slices = [StageSlice(a, b, names[of[k]]) for k, (a, b) in enumerate(ranges)]
        outline_stages(op, slices, self.num_micro_batches, self.schedule, self.remat, tuple(known))
