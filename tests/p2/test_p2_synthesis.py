"""P² reduction synthesis: program totals of the paper's Appendix A and properties of programs."""

import numpy as np
import pytest

from alpa_ir.errors import AlpaError
from alpa_ir.p2.dsl import SynthesisHierarchy
from alpa_ir.p2.explore import ExploreOptions, explore
from alpa_ir.p2.paper_data import APPENDIX_A
from alpa_ir.p2.semantics import apply, desired_state, initial_state
from alpa_ir.p2.synthesis import synthesize
from alpa_ir.p2.system import get_system

NO_SIM = ExploreOptions(simulate=False)


def total_programs(system: str, axes: tuple, reduce: tuple) -> int:
    return sum(len(r.programs) for r in explore(get_system(system), axes, reduce, NO_SIM))


def test_required_totals() -> None:
    assert total_programs("gcp-a100-16x2", (2, 16), (1,)) == 50
    per_matrix = [
        len(r.programs) for r in explore(get_system("gcp-a100-16x4"), (4, 16), (1,), NO_SIM)
    ]
    assert sorted(per_matrix) == [3, 47, 47]
    assert total_programs("gcp-a100-16x4", (8, 2, 4), (0, 2)) == 235


# Table 4's "[2 2 16] ... 235" cannot be right: only 4 matrices exist for those axes (4 x 47).
APPENDIX = [c for c in APPENDIX_A if c.axes != (2, 2, 16)]


@pytest.mark.parametrize("config", APPENDIX, ids=lambda c: f"{c.system}-{c.axes}-{c.reduce}")
def test_appendix_a_totals(config) -> None:
    assert total_programs(config.system, config.axes, config.reduce) == config.total_programs


def test_two_two_sixteen_has_four_matrices() -> None:
    assert total_programs("gcp-a100-16x4", (2, 2, 16), (0, 2)) == 4 * 47


@pytest.mark.parametrize(
    ("cards", "count"), [((16,), 3), ((2, 8), 47), ((3, 4), 47), ((2, 2, 2), 107)]
)
def test_counts_by_hierarchy_shape(cards: tuple, count: int) -> None:
    assert len(synthesize(SynthesisHierarchy(tuple("abc"[: len(cards)]), cards))) == count


def _replay(h: SynthesisHierarchy, program) -> bool:
    state = initial_state(h.num_devices)
    for instr in program.instructions:
        state = apply(state, h.groups(instr.slice, instr.form), instr.collective)
        if state is None:
            return False
    return np.array_equal(state, desired_state(np.arange(h.num_devices)[None], h.num_devices))


@pytest.mark.parametrize("cards", [(2, 8), (2, 2, 2)])
def test_programs_are_valid_distinct_and_sized(cards: tuple) -> None:
    h = SynthesisHierarchy(tuple("abc"[: len(cards)]), cards)
    programs = synthesize(h, 5)
    assert all(_replay(h, p) for p in programs)
    assert len({p.instructions for p in programs}) == len(programs)
    sizes = [p.size for p in programs]
    assert sizes == sorted(sizes) and max(sizes) <= 5 and min(sizes) == 1


def test_size_limit_grows_the_set() -> None:
    h = SynthesisHierarchy(("node", "gpu"), (4, 16))
    small, large = synthesize(h, 3), synthesize(h, 7)
    assert set(small) < set(synthesize(h, 5)) < set(large)
    assert all(p.size <= 3 for p in small)


def test_figure_10_programs_are_found() -> None:
    h = SynthesisHierarchy(("node", "gpu"), (4, 8))
    texts = {" ; ".join(h.describe(i) for i in p.instructions) for p in synthesize(h)}
    assert (
        "Reduce(node, InsideGroup) ; AllReduce(node, Master(root)) ; Broadcast(node, InsideGroup)"
        in texts
    )
    assert (
        "ReduceScatter(node, InsideGroup) ; AllReduce(node, Parallel(root)) ; AllGather(node, InsideGroup)"
        in texts
    )


def test_size_limit_is_checked() -> None:
    h = SynthesisHierarchy(("gpu",), (4,))
    with pytest.raises(AlpaError):
        synthesize(h, 0)
    with pytest.raises(AlpaError):
        synthesize(h, 11)


def test_nothing_to_reduce_gives_the_empty_program() -> None:
    results = explore(get_system("gcp-a100-16x2"), (1, 32), (0,))
    assert [len(p.lowered.steps) for r in results for p in r.programs] == [0]
    assert results[0].allreduce_time == 0.0
