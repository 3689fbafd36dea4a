"""Lowered P² programs: valid on the whole system and numerically equal to a plain all-reduce.

Every synthesized program for small custom systems (2x4 and 2x2x2, all factorizations of the
8 devices into parallelism axes, every set of reduction axes) is (1) re-verified against the
semantics on the whole system and (2) executed with numpy following the real data movement
of the collectives on random data, and compared with a plain all-reduce over the groups.
"""

import itertools

import numpy as np
import pytest

from alpa_ir.errors import AlpaError
from alpa_ir.p2.execute import reference_allreduce, restore_chunk_order, run_steps
from alpa_ir.p2.explore import ExploreOptions, explore
from alpa_ir.p2.lowering import LoweredProgram, LoweredStep, check_lowered
from alpa_ir.p2.semantics import Collective
from alpa_ir.p2.system import custom_system

AXES = [(8,), (2, 4), (4, 2), (2, 2, 2)]
CASES = [
    (cards, axes, red)
    for cards in [(2, 4), (2, 2, 2)]
    for axes in AXES
    for n in range(1, len(axes) + 1)
    for red in itertools.combinations(range(len(axes)), n)
]


def _programs(cards: tuple, axes: tuple, red: tuple) -> list[LoweredProgram]:
    results = explore(custom_system(cards), axes, red, ExploreOptions(simulate=False))
    return [p.lowered for r in results for p in r.programs]


@pytest.mark.parametrize(("cards", "axes", "red"), CASES)
def test_every_program_is_valid_and_computes_an_allreduce(
    cards: tuple, axes: tuple, red: tuple
) -> None:
    rng = np.random.default_rng(len(CASES))
    programs = _programs(cards, axes, red)
    assert programs
    for lowered in programs:
        check_lowered(lowered, 8)
        chunks = lowered.layout.group_size
        buffers = [rng.standard_normal(chunks * 3) for _ in range(8)]
        out = restore_chunk_order(
            run_steps(lowered.to_steps(), buffers), lowered.device_chunk_order()
        )
        expected = reference_allreduce(lowered.layout.reduction_groups(), buffers)
        for device in range(8):
            np.testing.assert_allclose(
                out[device], expected[device], err_msg=" ; ".join(lowered.instructions)
            )


def test_chunk_order_matters_for_permuted_programs() -> None:
    permuted = [p for p in _programs((2, 4), (8,), (0,)) if p.chunk_order is not None]
    assert permuted  # e.g. ReduceScatter over all, AllGather across nodes, then inside nodes
    rng = np.random.default_rng(0)
    buffers = [rng.standard_normal(16) for _ in range(8)]
    expected = reference_allreduce(permuted[0].layout.reduction_groups(), buffers)
    raw = run_steps(permuted[0].to_steps(), buffers)
    assert not np.allclose(raw[0], expected[0])
    fixed = restore_chunk_order(raw, permuted[0].device_chunk_order())
    assert np.allclose(fixed[0], expected[0])


def test_to_steps_lists_every_group_of_physical_devices() -> None:
    results = explore(custom_system((2, 4)), (2, 4), (1,), ExploreOptions(simulate=False))
    two_level = next(r for r in results if len(r.layout.levels) == 2)
    rs_ar_ag = next(
        p.lowered
        for p in two_level.programs
        if len(p.lowered.steps) == 3
        and [s.collective for s in p.lowered.steps]
        == [Collective.REDUCE_SCATTER, Collective.ALL_REDUCE, Collective.ALL_GATHER]
    )
    steps = rs_ar_ag.to_steps()
    assert [name for name, _ in steps] == ["ReduceScatter", "AllReduce", "AllGather"]
    for _, groups in steps:
        members = [d for g in groups for d in g]
        assert len(members) == len(set(members)) == 8


def test_checker_rejects_broken_programs() -> None:
    lowered = next(p for p in _programs((2, 4), (8,), (0,)) if len(p.steps) == 3)
    truncated = LoweredProgram(
        lowered.program,
        lowered.instructions[:2],
        lowered.steps[:2],
        lowered.layout,
        lowered.chunk_order,
    )
    with pytest.raises(AlpaError, match="does not end fully reduced"):
        check_lowered(truncated, 8)
    doubled = LoweredProgram(
        lowered.program,
        ("AllReduce", "AllReduce"),
        (LoweredStep(Collective.ALL_REDUCE, lowered.layout.devices),) * 2,
        lowered.layout,
        None,
    )
    with pytest.raises(AlpaError, match="step 1"):
        check_lowered(doubled, 8)


def test_lowered_programs_check_on_a_64_device_system() -> None:
    results = explore(custom_system((4, 16)), (8, 2, 4), (0, 2), ExploreOptions(simulate=False))
    for r in results[:2]:
        for p in r.programs:
            check_lowered(p.lowered, 64)
