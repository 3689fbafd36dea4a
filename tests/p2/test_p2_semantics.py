"""State-matrix semantics of collectives (P² Fig. 8) and the paper's Fig. 3 / Fig. 4 examples."""

import numpy as np

from alpa_ir.p2.dsl import INSIDE, MASTER, PARALLEL, Form, SynthesisHierarchy
from alpa_ir.p2.semantics import Collective, apply, desired_state, explain, initial_state, to_bool

AR, RS, AG = Collective.ALL_REDUCE, Collective.REDUCE_SCATTER, Collective.ALL_GATHER
RED, BC = Collective.REDUCE, Collective.BROADCAST

# Fig. 2d reduced along the shards: 2 servers x 2 GPUs; level 1 = server, level 2 = GPU.
FIG3 = SynthesisHierarchy(("server", "gpu"), (2, 2))
LOCAL = FIG3.groups(1, Form(INSIDE))  # {A0, A1}: GPUs of one CPU
ACROSS = FIG3.groups(1, Form(PARALLEL, 0))  # {A0, C0}, {A1, C1}
MASTERS = FIG3.groups(1, Form(MASTER, 0))  # {A0, C0}
ALL = FIG3.groups(0, Form(INSIDE))


def run(steps: list) -> np.ndarray | None:
    state = initial_state(4)
    for groups, coll in steps:
        state = apply(state, groups, coll)
        if state is None:
            return None
    return state


def fully_reduced(state: np.ndarray | None) -> bool:
    return state is not None and np.array_equal(state, desired_state(ALL, 4))


def test_groups_of_table_2() -> None:
    assert LOCAL.tolist() == [[0, 1], [2, 3]]
    assert ACROSS.tolist() == [[0, 2], [1, 3]]
    assert MASTERS.tolist() == [[0, 2]]
    h = SynthesisHierarchy(("server", "cpu", "gpu"), (2, 2, 4))  # Figure 2a below the rack
    assert h.groups(2, Form(PARALLEL, 1)).tolist()[:2] == [[0, 4], [1, 5]]  # {A0,B0}, {A1,B1}
    assert h.groups(2, Form(PARALLEL, 0)).tolist()[0] == [0, 4, 8, 12]  # {A0,B0,C0,D0}
    assert h.groups(2, Form(MASTER, 1)).tolist() == [[0, 4], [8, 12]]
    assert h.groups(1, Form(INSIDE)).tolist()[1] == list(range(8, 16))


def test_figure_3_programs_are_valid() -> None:
    assert fully_reduced(run([(ALL, AR)]))  # 3a
    assert fully_reduced(run([(LOCAL, AR), (ACROSS, AR)]))  # 3b
    assert fully_reduced(run([(LOCAL, RED), (MASTERS, AR), (LOCAL, BC)]))  # 3c


def test_figure_4a_reducescatter_then_allreduce_is_invalid() -> None:
    state = apply(initial_state(4), LOCAL, RS)
    assert state is not None
    assert "different chunks" in explain(state, LOCAL, AR)


def test_figure_4b_reducing_twice_is_invalid() -> None:
    state = apply(initial_state(4), LOCAL, AR)
    assert "reduced twice" in explain(state, ALL, AR)
    assert run([(LOCAL, AR), (ALL, AR)]) is None


def test_reducescatter_splits_rows_and_reduce_empties_non_roots() -> None:
    s = to_bool(apply(initial_state(4), LOCAL, RS))
    assert s[0, :2, :2].all() and not s[0, 2:].any()  # device 0: chunks 0-1 from devices 0, 1
    assert s[1, 2:, :2].all() and not s[1, :2].any()
    r = to_bool(apply(initial_state(4), LOCAL, RED))
    assert r[0, :, :2].all() and not r[1].any()


def test_reducescatter_needs_divisible_chunks() -> None:
    state = initial_state(4)
    state[:, 1:] = 0  # every device holds chunk 0 only
    assert "divide" in explain(state, LOCAL, RS)
    assert apply(state, LOCAL, AR) is not None


def test_allgather_needs_disjoint_equal_rows() -> None:
    after = apply(initial_state(4), ALL, RS)
    assert fully_reduced(apply(after, ALL, AG))
    assert "common chunk" in explain(initial_state(4), LOCAL, AG)
    uneven = apply(apply(after, LOCAL, AG), MASTERS, AG)  # devices 0, 2 now hold 4 chunks
    assert "different numbers" in explain(uneven, LOCAL, AG)


def test_broadcast_needs_information_increase() -> None:
    reduced = apply(initial_state(4), ALL, RED)
    assert fully_reduced(apply(reduced, ALL, BC))
    assert "lacks" in explain(initial_state(4), ALL, BC)
    assert "no information" in explain(apply(reduced, ALL, BC), ALL, BC)


def test_devices_outside_the_groups_keep_their_state() -> None:
    state = apply(initial_state(4), MASTERS, AR)
    assert np.array_equal(state[[1, 3]], initial_state(4)[[1, 3]])


def test_states_beyond_64_devices() -> None:
    groups = np.arange(100).reshape(1, -1)
    assert fully_reduced_n(apply(initial_state(100), groups, AR), groups, 100)
    half = np.arange(100).reshape(2, 50)
    state = apply(apply(initial_state(100), half, RS), half.T.copy(), AR)
    assert fully_reduced_n(apply(state, half, AG), groups, 100)


def fully_reduced_n(state: np.ndarray | None, groups: np.ndarray, n: int) -> bool:
    return state is not None and np.array_equal(state, desired_state(groups, n))
