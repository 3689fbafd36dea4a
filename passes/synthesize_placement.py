"""``synthesize-placement`` (P² §3.1): choose where the logical mesh's axes land on the
hardware hierarchy.

Every parallelism matrix of the mesh's axes on the system's hierarchy is one device order of
the mesh. Each is priced by the predicted time of the module's explicit collectives over
mesh axes, with their bytes per device: an all-reduce by its best synthesized program (the
simulator picks, as ``synthesize-reductions`` will), a reduce-scatter or all-gather as one
collective over its groups. A module without such collectives is priced by a plain
all-reduce over each mesh axis alone, of the paper's data size. The fastest matrix wins; on
a tie the mesh keeps its current order.

The result is written into the ``mesh.logical_mesh`` that @main runs on: ``devices`` in the
chosen order, ``placement`` = the matrix (rows = mesh axes, columns = hardware levels),
``p2.system`` = the system's name and ``p2.predicted_time`` = the chosen matrix's time (s).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

import numpy as np
from xdsl.context import Context
from xdsl.dialects.builtin import FloatAttr, ModuleOp, f64
from xdsl.passes import ModulePass

from alpa_ir.dialects.sharding import AllReduceProgramOp
from alpa_ir.errors import AlpaError
from alpa_ir.module_utils import main_function
from alpa_ir.p2.choice import ChoiceOptions, ReductionPricer, axis_groups
from alpa_ir.p2.ir_collectives import MeshCollective, mesh_collectives
from alpa_ir.p2.ir_system import (
    SYSTEM_ATTR,
    check_mesh_fits,
    logical_mesh,
    mesh_system,
    place_mesh,
)
from alpa_ir.p2.placement import ParallelismMatrix, device_array, enumerate_matrices
from alpa_ir.p2.simulator import default_bytes
from alpa_ir.p2.system import System

TIME_ATTR = "p2.predicted_time"
"""Logical mesh attribute: predicted seconds of the module's collectives on its placement."""


def placement_time(
    matrix: ParallelismMatrix, collectives: list[MeshCollective], pricer: ReductionPricer
) -> float:
    """Predicted seconds of ``collectives`` on ``matrix``; without any, a plain all-reduce
    of the paper's data size over each mesh axis alone."""
    if not collectives:
        nbytes = default_bytes(pricer.system)
        groups = [axis_groups(matrix, (a,)) for a in range(len(matrix.rows))]
        return sum(pricer.sim.allreduce_time(g, nbytes) for g in groups)
    return sum(pricer.collective_time(matrix, c) for c in collectives)


def rank_placements(
    system: System,
    mesh_shape: tuple[int, ...],
    collectives: list[MeshCollective],
    options: ChoiceOptions,
) -> list[tuple[ParallelismMatrix, float]]:
    """Every matrix with its predicted time, in enumeration order."""
    pricer = ReductionPricer(system, options.algorithm, options.max_size)
    return [
        (matrix, placement_time(matrix, collectives, pricer))
        for matrix in enumerate_matrices(system.hierarchy, mesh_shape)
    ]


@dataclass(frozen=True)
class SynthesizePlacement(ModulePass):
    """Place the logical mesh on the system: the parallelism matrix of least predicted time."""

    name = "synthesize-placement"

    system: str = field(
        default="",
        metadata={
            "help": "preset (gcp-a100-16x4, custom-2x4, ..); empty: mesh's p2.system or cluster"
        },
    )
    max_size: int = field(default=5, metadata={"help": "largest synthesized program size"})
    algorithm: Literal["ring", "tree"] = field(
        default="ring", metadata={"help": "NCCL algorithm the simulator assumes for AllReduce"}
    )

    def apply(self, ctx: Context, op: ModuleOp) -> None:
        options = ChoiceOptions(self.max_size, self.algorithm)
        options.check(self.name)
        function = main_function(op)
        if any(isinstance(o, AllReduceProgramOp) for o in function.body.walk()):
            raise AlpaError(
                f"{self.name}: @main already has synthesized reductions, whose device groups "
                "fix the placement; run synthesize-placement before synthesize-reductions"
            )
        mesh = logical_mesh(op, function, self.name)
        system = mesh_system(op, mesh, self.system, self.name)
        check_mesh_fits(mesh, system, self.name)
        collectives = mesh_collectives(function, mesh.mesh_shape, self.name)
        ranked = rank_placements(system, mesh.mesh_shape, collectives, options)
        fastest = min(time for _, time in ranked)
        tied = [(m, t) for m, t in ranked if t <= fastest * (1 + 1e-9)]
        current = np.array(mesh.device_ids)
        matrix, time = next(
            ((m, t) for m, t in tied if np.array_equal(device_array(m).reshape(-1), current)),
            tied[0],
        )
        from_cluster = not self.system and SYSTEM_ATTR not in mesh.attributes
        place_mesh(mesh, matrix, None if from_cluster else system.name)
        mesh.attributes[TIME_ATTR] = FloatAttr(time, f64)
