"""Alpa's parallel plans: what a compiled step chose, kept (it pickles) and
turned back into a method that compiles the same plan.

A :class:`ParallelPlan` is the method the step was parallelized with, its
choices fixed: for a one-mesh step the mesh and the input specs the ILP chose
(kept by the ILP when the plan is compiled again); for a pipelined step the
stages it chose (layers and logical submeshes, as a ``ManualStageOption``).
:func:`plan_to_method` returns that method (Alpa's ``plan_to_method``).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

import jax

from alpa_ir.errors import AlpaError


@dataclass(frozen=True)
class DevicePlacement:
    """Where an input of a pipelined plan lives: the ids of its devices (in
    the mesh's order) and its spec over their mesh (a ``NamedSharding``
    without the device objects, so that a plan pickles)."""

    device_ids: tuple[int, ...]
    spec: Any


@dataclass(frozen=True)
class PlacementSpec:
    """Alpa's description of where a tensor is stored: its aval (shape and
    dtype), the ids of the meshes holding it and its ``ShardingSpec`` on
    each (``jax.interpreters.pxla``'s form). The data loaders take it
    (:mod:`alpa_ir.api.data_loader`)."""

    aval: Any
    mesh_ids: tuple[int, ...]
    sharding_specs: tuple[Any, ...]


@dataclass(frozen=True)
class ParallelPlan:
    """A compiled step's method with its choices fixed, and where the step
    reads its inputs (``input_placement_specs``, one per input array, as
    Alpa's: without the arguments' tree, whose static fields need not pickle)."""

    method: Any
    input_placement_specs: Any


def parallel_plan(executable: Any) -> ParallelPlan:
    """The plan of ``executable`` (a step ``parallelize`` compiled)."""
    from alpa_ir.api.manual_sharding import LeafSpecs, ManualShardingOption
    from alpa_ir.api.pipeshard import ManualStageOption

    method = getattr(executable, "method", None)
    if method is None:
        raise AlpaError(
            "get_parallel_plan: the executable does not know its method (compile it "
            "with parallelize)"
        )
    if hasattr(executable, "placements"):  # pipelined: the stages it chose
        placements = executable.placements
        stages = ManualStageOption(
            [list(range(p.first, p.last + 1)) for p in placements],
            [tuple(p.mesh.shape) for p in placements],
        )
        fixed = dataclasses.replace(method, stage_option=stages)
        placed = tuple(
            DevicePlacement(tuple(int(d.id) for d in s.mesh.devices.flat), s.spec)
            for s in jax.tree.leaves(
                executable.get_input_shardings(),
                is_leaf=lambda x: isinstance(x, jax.sharding.Sharding),
            )
        )
        return ParallelPlan(fixed, placed)
    # one spec per input array: the arguments' own None subtrees (a TrainState's
    # dynamic_scale=None) are no arrays, and a spec may itself be None
    specs = tuple(executable.in_tree.flatten_up_to(executable.get_input_placement_specs()))
    mesh = executable.mesh
    manual = ManualShardingOption(mesh.axis_names, in_axis_resources=LeafSpecs(specs))
    fixed = dataclasses.replace(method, devices=mesh, manual_sharding_option=manual)
    return ParallelPlan(fixed, specs)


def plan_to_method(plan: ParallelPlan) -> Any:
    """The method that compiles ``plan`` again (Alpa's ``plan_to_method``)."""
    if not isinstance(plan, ParallelPlan):
        raise AlpaError(f"plan_to_method needs a ParallelPlan, got {type(plan).__name__}")
    return plan.method


__all__ = ["DevicePlacement", "ParallelPlan", "PlacementSpec", "parallel_plan", "plan_to_method"]
