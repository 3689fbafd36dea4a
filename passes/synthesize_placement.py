"""``synthesize-placement`` (P² §3.1): choose where the logical mesh's axes land on the
hardware hierarchy.

Every parallelism matrix of the mesh's axes on the system's hierarchy is one device order of
the mesh. Each is priced by the predicted time of the module's explicit collectives over
mesh axes, with their bytes per device: an all-reduce by its best synthesized program (the
simulator picks, as ``synthesize-reductions`` will), a reduce-scatter or all-gather as one
collective over its groups. A module without such collectives is priced by a plain
all-reduce over each mesh axis alone, of the paper's data size. The fastest matrix wins; on
a tie the mesh keeps its current order.

With ``objective=plan`` (beyond P²) the pass places *and plans*: it runs on a module not
yet auto-sharded and, for every matrix, plans a copy of the module with ``auto-sharding``
under the placement-aware ``p2`` cost model (``alpa_ir.p2.cost_model``: ring, max-size 5;
options ``solver`` and ``time-limit``), so each placement gets the plan that suits it; the
placement whose plan's explicit collectives have the least predicted time by the same model
wins (on a tie, the current order), and its planned module replaces the input. The time of
the collectives the plan inserts decides, not the ILP objective: that is the solver's
estimate of them, the two can disagree, and the former is what runs. So the mesh's shape
stays the user's, and the choice weighs all of the plan's communication (all-gathers,
all-to-alls, resharding), not only the reductions of a plan made for another placement.
``p2.predicted_time`` is then the p2 model's time of the winning plan's collectives.

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

from alpa_ir.autosharding.planner import OBJECTIVE_ATTR, ShardingOptions, ShardingPlanner
from alpa_ir.dialects.attrs import TIME_ATTR
from alpa_ir.dialects.sharding import AllReduceProgramOp
from alpa_ir.errors import AlpaError
from alpa_ir.hardware.device_mesh import LogicalDeviceMesh
from alpa_ir.ir.module_utils import main_function
from alpa_ir.p2.choice import ChoiceOptions, ReductionPricer, axis_groups
from alpa_ir.p2.cost_model import P2CostModel
from alpa_ir.p2.ir_collectives import MeshCollective, mesh_collectives
from alpa_ir.p2.ir_system import (
    SYSTEM_ATTR,
    check_mesh_fits,
    logical_mesh,
    mesh_system,
    place_mesh,
)
from alpa_ir.p2.placement import ParallelismMatrix, device_array, enumerate_matrices
from alpa_ir.p2.plan_time import plan_comm_seconds
from alpa_ir.p2.simulator import default_bytes
from alpa_ir.p2.synthesis import DEFAULT_MAX_SIZE
from alpa_ir.p2.system import System


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
    objective: Literal["collectives", "plan"] = field(
        default="collectives",
        metadata={
            "help": "collectives: price the module's collectives; plan: auto-shard a copy "
            "per placement with cost model p2 and keep the cheapest plan"
        },
    )
    solver: str = field(default="cbc", metadata={"help": "objective=plan: ILP solver"})
    time_limit: float = field(default=600.0, metadata={"help": "objective=plan: ILP seconds"})

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
        from_cluster = not self.system and SYSTEM_ATTR not in mesh.attributes
        if self.objective == "plan":
            self._place_and_plan(ctx, op, system, None if from_cluster else system.name)
            return
        collectives = mesh_collectives(function, mesh.mesh_shape, self.name)
        ranked = rank_placements(system, mesh.mesh_shape, collectives, options)
        fastest = min(time for _, time in ranked)
        tied = [(m, t) for m, t in ranked if t <= fastest * (1 + 1e-9)]
        current = np.array(mesh.device_ids)
        matrix, time = next(
            ((m, t) for m, t in tied if np.array_equal(device_array(m).reshape(-1), current)),
            tied[0],
        )
        place_mesh(mesh, matrix, None if from_cluster else system.name)
        mesh.attributes[TIME_ATTR] = FloatAttr(time, f64)

    def _place_and_plan(
        self, ctx: Context, op: ModuleOp, system: System, system_name: str | None
    ) -> None:
        """``objective=plan`` (see the module doc)."""
        if (self.algorithm, self.max_size) != ("ring", DEFAULT_MAX_SIZE):
            raise AlpaError(
                f"{self.name}: objective=plan prices with the cost model p2 (ring, max-size "
                f"{DEFAULT_MAX_SIZE}); algorithm and max-size cannot be changed with it"
            )
        if OBJECTIVE_ATTR in main_function(op).attributes:
            raise AlpaError(
                f"{self.name}: objective=plan auto-shards @main itself; run it in place of "
                "auto-sharding, on a module not yet planned"
            )
        mesh_op = logical_mesh(op, main_function(op), self.name)
        current = np.array(mesh_op.device_ids)
        model = P2CostModel(system)
        best: tuple[float, ModuleOp] | None = None
        for matrix in enumerate_matrices(system.hierarchy, mesh_op.mesh_shape):
            candidate = op.clone()
            function = main_function(candidate)
            placed = logical_mesh(candidate, function, self.name)
            place_mesh(placed, matrix, system_name)
            options = ShardingOptions(
                solver=self.solver, time_limit=self.time_limit, cost_model="p2", system=self.system
            )
            ShardingPlanner(options).plan(ctx, candidate)
            mesh = LogicalDeviceMesh.from_op(placed)
            seconds = sum(plan_comm_seconds(function, mesh, model).values())
            placed.attributes[TIME_ATTR] = FloatAttr(seconds, f64)
            is_current = np.array_equal(device_array(matrix).reshape(-1), current)
            if (
                best is None
                or seconds < best[0] * (1 - 1e-9)
                or (is_current and seconds <= best[0] * (1 + 1e-9))
            ):
                best = (seconds, candidate)
        assert best is not None
        for old in list(op.body.block.ops):
            old.detach()
            old.erase(safe_erase=False)
        for new in list(best[1].body.block.ops):
            new.detach()
            op.body.block.add_op(new)
