"""The reduction DSL of P² (§3.3): programs are lists of (slice, form, collective).

A synthesis hierarchy has an implicit root level 0 of cardinality 1 above its levels
``1 .. L``; the devices are numbered in mixed radix over the levels (level 1 outermost).
An instruction's *slice* is a level ``s``: its nodes split the devices into blocks (all the
devices below one node). Its *form* picks the groups from the blocks (Table 2):

* ``InsideGroup``: every block is a group;
* ``Parallel(e)``, ``e`` a strict ancestor of ``s``: inside every node of level ``e``, the
  ``r``-th devices of its blocks form a group, for every ``r``;
* ``Master(e)``: as Parallel(e), for ``r = 0`` only.

Program size: an InsideGroup instruction counts 1, a Parallel or Master one counts 2. Different
(slice, form) pairs may derive the same device groups (e.g. a leaf slice with Parallel(e) is
the InsideGroup of the level below ``e``): such a set of groups is one candidate, named by its
cheapest derivation. Sets made of single-device groups do nothing and are not candidates.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import cached_property

import numpy as np

from alpa_ir.p2.semantics import COLLECTIVES, Collective

INSIDE, PARALLEL, MASTER = "InsideGroup", "Parallel", "Master"


@dataclass(frozen=True)
class Form:
    kind: str  # InsideGroup | Parallel | Master
    ancestor: int = 0  # level index of e for Parallel / Master

    @property
    def cost(self) -> int:
        return 1 if self.kind == INSIDE else 2


@dataclass(frozen=True)
class Instruction:
    slice: int
    form: Form
    collective: Collective

    @property
    def cost(self) -> int:
        return self.form.cost


@dataclass(frozen=True)
class Program:
    instructions: tuple[Instruction, ...]

    @property
    def size(self) -> int:
        return sum(i.cost for i in self.instructions)

    def __len__(self) -> int:
        return len(self.instructions)


@dataclass(frozen=True)
class Candidate:
    """One distinct set of device groups with the instruction naming it and its groups
    (``groups[g, i]`` = synthesis index of member ``i`` of group ``g``)."""

    slice: int
    form: Form
    groups: np.ndarray

    @property
    def cost(self) -> int:
        return self.form.cost


@dataclass(frozen=True)
class SynthesisHierarchy:
    """Level names and cardinalities below the implicit root (root excluded here)."""

    names: tuple[str, ...]
    cardinalities: tuple[int, ...]

    @property
    def num_devices(self) -> int:
        return math.prod(self.cardinalities)

    def level_name(self, level: int) -> str:
        return "root" if level == 0 else self.names[level - 1]

    def groups(self, slice_: int, form: Form) -> np.ndarray:
        """The device groups (synthesis indices) that ``slice_`` and ``form`` derive."""
        cards = self.cardinalities
        ids = np.arange(self.num_devices)
        if form.kind == INSIDE:
            return ids.reshape(math.prod(cards[:slice_]), -1)
        e = form.ancestor
        if not 0 <= e < slice_:
            raise ValueError(f"form ancestor {e} is not above slice {slice_}")
        blocks = ids.reshape(math.prod(cards[:e]), math.prod(cards[e:slice_]), -1)
        if form.kind == PARALLEL:
            return blocks.transpose(0, 2, 1).reshape(-1, blocks.shape[1])
        return blocks[:, :, 0]

    @cached_property
    def candidates(self) -> tuple[Candidate, ...]:
        """Every distinct non-trivial set of device groups, named by its cheapest derivation
        (ties: the first found, slices from the root down, InsideGroup then Parallel then Master)."""
        best: dict[bytes, Candidate] = {}
        for s in range(len(self.cardinalities) + 1):
            forms = [Form(INSIDE)]
            forms += [Form(kind, e) for e in range(s) for kind in (PARALLEL, MASTER)]
            for form in forms:
                groups = self.groups(s, form)
                if groups.shape[1] < 2:
                    continue
                key = groups.shape[1].to_bytes(4, "little") + groups.tobytes()
                if key not in best or form.cost < best[key].cost:
                    best[key] = Candidate(s, form, groups)
        return tuple(sorted(best.values(), key=lambda c: c.cost))

    def instructions(self) -> list[tuple[Candidate, Collective]]:
        return [(c, coll) for c in self.candidates for coll in COLLECTIVES]

    def describe(self, instruction: Instruction) -> str:
        """Readable form, e.g. ``AllReduce(gpu, Parallel(root))``."""
        form = instruction.form
        form_text = (
            form.kind if form.kind == INSIDE else f"{form.kind}({self.level_name(form.ancestor)})"
        )
        return f"{instruction.collective}({self.level_name(instruction.slice)}, {form_text})"
