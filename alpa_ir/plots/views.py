"""The pictures of a planned module: which views apply and what each draws.

A pipeline plan (``pipeline.plan``: stages on meshes) has all four views, the
timeline and memory simulated on a cluster (the module's ``mesh.cluster``,
else the one given, else the local devices); a single-mesh plan has the
devices and shardings views.
"""

from __future__ import annotations

import dataclasses
import os
import warnings
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from xdsl.dialects import func
from xdsl.dialects.builtin import ModuleOp

from alpa_ir.dialects.mesh import LogicalMeshOp
from alpa_ir.dialects.pipeline import plan_of, plan_stages
from alpa_ir.dialects.sharding import spec_of_value
from alpa_ir.dialects.types import nbytes_of, shape_of
from alpa_ir.errors import AlpaError
from alpa_ir.hardware.clusters import Cluster
from alpa_ir.hardware.device_mesh import function_mesh
from alpa_ir.ir.module_utils import main_function, symbol_op
from alpa_ir.plots.devices import StageMesh, draw_devices
from alpa_ir.plots.shardings import ShardedTensor, draw_shardings

KINDS = ("timeline", "memory", "devices", "shardings")
PIPELINE_ONLY = ("timeline", "memory")


def _stages(module: ModuleOp) -> list[tuple[StageMesh, func.FuncOp]]:
    """Each stage's mesh and the function whose inputs show its shardings."""
    plan = plan_of(module)
    if plan is None:
        main = main_function(module)
        mesh = function_mesh(module, main)
        if mesh is None:
            raise AlpaError("plot: the module has no plan (no pipeline.plan, no mesh on @main)")
        return [(StageMesh("mesh", tuple(mesh.shape), tuple(mesh.devices or ())), main)]
    out = []
    for stage in plan_stages(module):
        mesh = symbol_op(module, stage.mesh.root_reference.data, LogicalMeshOp)
        assert isinstance(mesh, LogicalMeshOp)
        name = dict(stage.phase_functions()).get("forward") or stage.phase_functions()[0][1]
        function = symbol_op(module, name, func.FuncOp)
        assert isinstance(function, func.FuncOp)
        out.append(
            (
                StageMesh(stage.sym_name.data, tuple(mesh.mesh_shape), tuple(mesh.device_ids)),
                function,
            )
        )
    return out


def module_cluster(module: ModuleOp, cluster: Cluster | None) -> Cluster:
    """The module's ``mesh.cluster``, else ``cluster``, else the local devices
    (one host holding at least every device id the meshes name)."""
    own = Cluster.of_module(module) or cluster
    if own is not None:
        return own
    from alpa_ir.hardware.clusters import ClusterLevel, local_cpu

    base = local_cpu()
    named = max((d for m, _ in _stages(module) for d in m.devices), default=-1) + 1
    level = base.levels[-1]
    if named <= level.cardinality:
        return base
    wider = ClusterLevel(level.name, named, level.bandwidth, level.latency)
    return dataclasses.replace(base, levels=(*base.levels[:-1], wider))


def largest_tensors(module: ModuleOp, per_stage: int = 3) -> list[ShardedTensor]:
    """The ``per_stage`` largest inputs of each stage's function, with their
    specs and the function's costliest communication term (why)."""
    from alpa_ir.autosharding.comm_terms import sharding_terms

    tensors = []
    for s, (mesh, function) in enumerate(_stages(module)):
        terms = sharding_terms(function, tuple(mesh.shape), top=1)
        why = "no communication"
        if terms:  # kind, bytes and where: the op's source line, else the op
            term = terms[0]
            cause = term.cause.rsplit(" at ", 1)[-1] if " at " in term.cause else term.cause
            why = f"costliest: {term.kind} of {term.wire_bytes:,.0f} B per device: {cause}"
        args = sorted(
            (a for a in function.args if shape_of(a.type)), key=lambda a: -nbytes_of(a.type)
        )
        for a in args[:per_stage]:
            name = f"{function.sym_name.data} %{a.name_hint or a.index}"
            spec = spec_of_value(a, function)
            tensors.append(ShardedTensor(name, tuple(shape_of(a.type)), spec, mesh.shape, s, why))
    return tensors


def available_kinds(module: ModuleOp) -> tuple[str, ...]:
    return (
        KINDS if plan_of(module) is not None else tuple(k for k in KINDS if k not in PIPELINE_ONLY)
    )


def plot_module(
    module: ModuleOp,
    kind: str,
    path: str | os.PathLike[str],
    *,
    cluster: Cluster | None = None,
    measured: Any = None,
    title: str = "",
) -> Any:
    """Draw view ``kind`` of the planned ``module`` into ``path``; returns the drawing."""
    if kind == "communication":
        raise AlpaError("plot: a 'communication' picture needs a compiled executable")
    if kind not in KINDS:
        known = ", ".join((*KINDS, "communication"))
        raise AlpaError(f"plot: unknown picture '{kind}'; known: {known}")
    if kind not in available_kinds(module):
        raise AlpaError(f"plot: a '{kind}' picture needs a pipeline plan (PipeshardParallel)")
    hardware = module_cluster(module, cluster)
    stages = _stages(module)
    if kind == "devices":
        per_host = hardware.levels[-1].cardinality
        hosts = max(hardware.num_devices // per_host, 1)
        return draw_devices(hosts, per_host, [m for m, _ in stages], path,
                            title=title or f"devices of {hardware.name}")  # fmt: skip
    if kind == "shardings":
        return draw_shardings(largest_tensors(module), path, title=title or "largest inputs")
    from alpa_ir.backends.simulate import plan_from_module, simulate

    with warnings.catch_warnings():  # pricing planned stages: their collectives have no rule
        warnings.simplefilter("ignore", UserWarning)
        plan = plan_from_module(module, hardware)
    result = simulate(plan, check_memory=False)
    if kind == "memory":
        from alpa_ir.plots.memory import draw_memory

        return draw_memory(
            plan, result, path, title=title or f"memory per device ({hardware.name})"
        )
    from alpa_ir.plots.timeline import draw_timeline

    labels = [f"{m.name}\nmesh {list(m.shape)}" for m, _ in stages]
    return draw_timeline(result, path, stage_labels=labels, measured=measured,
                         title=title or f"{plan.schedule}, {plan.num_micro_batches} micro-batches")  # fmt: skip


def plot_all(
    module: ModuleOp,
    folder: str | os.PathLike[str],
    *,
    kinds: Sequence[str] = (),
    cluster: Cluster | None = None,
    suffix: str = ".png",
) -> list[Path]:
    """Every applicable view of ``module`` into ``folder`` (``KIND.png``)."""
    where = Path(folder)
    where.mkdir(parents=True, exist_ok=True)
    return [
        plot_module(module, kind, where / f"{kind}{suffix}", cluster=cluster).path
        for kind in (kinds or available_kinds(module))
    ]
