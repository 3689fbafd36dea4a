"""Syntax-guided synthesis of reduction programs (P² §3.5).

Programs are enumerated depth-first over the DSL's candidate instructions under a size budget;
each step must be valid per the semantics (§3.2) and a program is kept when its final state is
the desired one (every device reduced over its whole group). Two facts prune exactly:

* a program stops at the desired state: no collective is valid from it (every group's members
  hold identical full data, so the disjointness, row-count or information-increase
  precondition fails), so no longer program can pass through it;
* the suffixes found from a (state, remaining budget) pair are memoized, since different
  prefixes often reach the same state (e.g. AllReduce over rows then columns, or columns then
  rows).

Results depend only on the synthesis hierarchy's cardinalities, so they are cached per
hierarchy shape (level names are only used when printing).
"""

from __future__ import annotations

from functools import cache

import numpy as np

from alpa_ir.errors import AlpaError
from alpa_ir.p2.dsl import Instruction, Program, SynthesisHierarchy
from alpa_ir.p2.semantics import apply, desired_state, initial_state

DEFAULT_MAX_SIZE = 5
MAX_SIZE_LIMIT = 10


def synthesize(
    hierarchy: SynthesisHierarchy, max_size: int = DEFAULT_MAX_SIZE
) -> tuple[Program, ...]:
    """All valid programs of size <= ``max_size`` reducing over the whole hierarchy, in
    increasing order of size (ties: order of discovery)."""
    if not 1 <= max_size <= MAX_SIZE_LIMIT:
        raise AlpaError(f"program size limit {max_size} must be between 1 and {MAX_SIZE_LIMIT}")
    return _synthesize(tuple(hierarchy.cardinalities), max_size)


@cache
def _synthesize(cardinalities: tuple[int, ...], max_size: int) -> tuple[Program, ...]:
    hierarchy = SynthesisHierarchy(tuple(f"l{j}" for j in range(len(cardinalities))), cardinalities)
    k = hierarchy.num_devices
    if k == 1:
        return (Program(()),)  # nothing to reduce: the empty program
    start = initial_state(k)
    final = desired_state(np.arange(k)[None, :], k).tobytes()
    steps = [
        (cand.cost, cand.groups, Instruction(cand.slice, cand.form, coll))
        for cand, coll in hierarchy.instructions()
    ]
    memo: dict[tuple[bytes, int], list[tuple[Instruction, ...]]] = {}

    def suffixes(state: np.ndarray, key: bytes, budget: int) -> list[tuple[Instruction, ...]]:
        memo_key = (key, budget)
        if memo_key in memo:
            return memo[memo_key]
        found: list[tuple[Instruction, ...]] = []
        for cost, groups, instr in steps:
            if cost > budget:
                continue
            nxt = apply(state, groups, instr.collective)
            if nxt is None:
                continue
            nxt_key = nxt.tobytes()
            if nxt_key == final:
                found.append((instr,))
            else:
                found.extend((instr, *rest) for rest in suffixes(nxt, nxt_key, budget - cost))
        memo[memo_key] = found
        return found

    programs = [Program(p) for p in suffixes(start, start.tobytes(), max_size)]
    programs.sort(key=lambda p: p.size)
    return tuple(programs)
