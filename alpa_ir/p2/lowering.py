"""Lowering synthesized programs to the whole system, and checking the result (P² §3.4-3.5).

A program is synthesized on the synthesis hierarchy of one reduction group; lowering applies
each instruction's grouping pattern to every reduction group of the placed mesh, giving per
step one list of groups of *physical* device ids (ordered: member ``i`` of a group is the
``i``-th device of the synthesis group, which fixes the Reduce/Broadcast root and which part
of a ReduceScatter each member receives).

Chunk order. Figure 8 treats a device's chunks as a set, but real collectives move ordered
buffers: ReduceScatter gives member ``i`` the ``i``-th contiguous part, AllGather concatenates
in member order. A few valid programs (e.g. ReduceScatter over all, then AllGather over the
columns, then over the rows) end with every chunk present but in a permuted order. Lowering
tracks the buffer order and records the final order of such programs in ``chunk_order``
(``chunk_order[t][p]`` = the chunk at position ``p`` of synthesis device ``t``'s buffer, the
buffer being ``k`` equal chunks); executing them needs that local permutation at the end.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from alpa_ir.errors import AlpaError
from alpa_ir.p2.dsl import Program, SynthesisHierarchy
from alpa_ir.p2.placement import ReductionLayout
from alpa_ir.p2.semantics import Collective, desired_state, explain, initial_state

_COMBINING = (Collective.ALL_REDUCE, Collective.REDUCE, Collective.REDUCE_SCATTER)


@dataclass(frozen=True)
class LoweredStep:
    """One collective over device groups (physical ids) of the whole system."""

    collective: Collective
    groups: np.ndarray  # (groups, members)

    def group_lists(self) -> list[list[int]]:
        return self.groups.tolist()


@dataclass(frozen=True)
class LoweredProgram:
    program: Program
    instructions: tuple[str, ...]
    steps: tuple[LoweredStep, ...]
    layout: ReductionLayout
    chunk_order: tuple[tuple[int, ...], ...] | None  # per synthesis device; None = identity

    def to_steps(self) -> list[tuple[str, list[list[int]]]]:
        """The program as ``(collective name, device groups)`` pairs, runnable on real
        devices (e.g. as psum / psum_scatter / all_gather over these replica groups)."""
        return [(step.collective.value, step.group_lists()) for step in self.steps]

    def device_chunk_order(self) -> dict[int, tuple[int, ...]] | None:
        """Physical device -> final chunk order of its buffer (``k`` chunks), or None when
        every buffer ends in natural order."""
        if self.chunk_order is None:
            return None
        devices = self.layout.devices
        return {
            int(devices[r, t]): self.chunk_order[t]
            for r in range(devices.shape[0])
            for t in range(devices.shape[1])
        }


def lower(
    program: Program, hierarchy: SynthesisHierarchy, layout: ReductionLayout
) -> LoweredProgram:
    """Lower ``program`` (synthesized on ``hierarchy``) onto every reduction group of ``layout``."""
    if hierarchy.num_devices != layout.group_size:
        raise AlpaError("lowering: the synthesis hierarchy does not match the reduction groups")
    steps = []
    for instr in program.instructions:
        groups = hierarchy.groups(instr.slice, instr.form)
        physical = layout.devices[:, groups].reshape(-1, groups.shape[1])
        steps.append(LoweredStep(instr.collective, physical))
    return LoweredProgram(
        program,
        tuple(hierarchy.describe(i) for i in program.instructions),
        tuple(steps),
        layout,
        track_chunk_order(program, hierarchy),
    )


def track_chunk_order(
    program: Program, hierarchy: SynthesisHierarchy
) -> tuple[tuple[int, ...], ...] | None:
    """Follow the order of the chunks in every buffer through the program (see module doc).

    Only buffers holding data count: after a Reduce the non-roots are dead (what they hold is
    never used again except to be overwritten by a Broadcast). Raises AlpaError if live
    buffers combined by a reduction are in different orders (the result would be garbage)."""
    k = hierarchy.num_devices
    order: list[tuple[int, ...]] = [tuple(range(k))] * k
    live = [True] * k
    for instr in program.instructions:
        coll = instr.collective
        for group in hierarchy.groups(instr.slice, instr.form).tolist():
            orders = [order[d] for d in group if live[d]]
            if not orders:
                continue
            if coll in _COMBINING and any(o != orders[0] for o in orders):
                raise AlpaError(f"{hierarchy.describe(instr)} combines buffers in different orders")
            if coll is Collective.ALL_REDUCE:
                for d in group:
                    order[d] = orders[0]
            elif coll is Collective.REDUCE:
                order[group[0]] = orders[0]
                for d in group[1:]:
                    live[d] = False
            elif coll is Collective.REDUCE_SCATTER:
                part = len(orders[0]) // len(group)
                for i, d in enumerate(group):
                    order[d] = orders[0][i * part : (i + 1) * part]
            elif coll is Collective.ALL_GATHER:
                joined = tuple(c for d in group for c in order[d])
                for d in group:
                    order[d] = joined
            else:  # Broadcast
                for d in group:
                    order[d], live[d] = order[group[0]], True
    natural = tuple(range(k))
    return None if all(o == natural for o in order) else tuple(order)


def check_lowered(lowered: LoweredProgram, num_devices: int) -> None:
    """Re-verify a lowered program against the semantics on the whole system: every step
    valid, every device finally reduced over exactly its reduction group. Raises AlpaError
    saying which step fails."""
    state = initial_state(num_devices)
    for index, step in enumerate(lowered.steps):
        members = step.groups.reshape(-1)
        if len(np.unique(members)) != len(members) or members.max() >= num_devices:
            raise AlpaError(
                f"step {index} ({lowered.instructions[index]}): groups overlap or bad ids"
            )
        result = explain(state, step.groups, step.collective)
        if isinstance(result, str):
            raise AlpaError(f"step {index} ({lowered.instructions[index]}) is invalid: {result}")
        state = result
    if not np.array_equal(state, desired_state(lowered.layout.devices, num_devices)):
        raise AlpaError(f"program {' ; '.join(lowered.instructions)} does not end fully reduced")
