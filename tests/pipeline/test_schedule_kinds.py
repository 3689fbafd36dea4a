"""Schedules as data: every kind builds a checked task order for any size it
accepts, interleaved 1F1B follows Megatron's order, the checker rejects broken
orders, bad sizes and names are one-line errors, and a plugin may add a schedule."""

from __future__ import annotations

from dataclasses import replace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from alpa_ir.errors import AlpaError
from alpa_ir.pipeline.schedule import Task
from alpa_ir.pipeline.schedule_kinds import BUILTIN_SCHEDULES, build_schedule
from alpa_ir.pipeline.task_order import (
    TaskOrder,
    check_task_order,
    expected_tasks,
    linear_order,
    peak_stage_in_flight,
)
from alpa_ir.plugins.builtin import alpa_ir_schedules
from alpa_ir.plugins.hookspecs import hookimpl
from alpa_ir.plugins.registry import load_registry


def _virtual(kind: str, v: int) -> int:
    return {"zb-v": 2, "interleaved-1f1b": v}.get(kind, 1)


@settings(max_examples=120, deadline=None)
@given(
    kind=st.sampled_from(sorted(BUILTIN_SCHEDULES)),
    meshes=st.integers(1, 5),
    rounds=st.integers(1, 4),
    v=st.integers(2, 3),
    slack=st.integers(0, 4),
)
def test_every_kind_builds_a_checked_order(
    kind: str, meshes: int, rounds: int, v: int, slack: int
) -> None:
    """Also with in-flight caps: 1F1B's need on each stage plus some slack."""
    virtual = _virtual(kind, v)
    micro_batches = meshes * rounds + slack  # also a count the meshes do not divide
    caps = [max(1, meshes - s % meshes) + slack for s in range(meshes * virtual)]
    order = build_schedule(kind, meshes, micro_batches, virtual, caps)
    assert order.num_meshes == meshes and order.num_stages == meshes * virtual
    tasks = [t for o in order.orders for t in o]
    assert sorted(map(str, tasks)) == sorted(map(str, expected_tasks(order)))
    assert len(linear_order(order)) == len(tasks)


def test_interleaved_follows_megatron() -> None:
    """p = 2 meshes, v = 2 chunks (stages 0 and 2 on mesh 0), m = 4: mesh 0 warms
    up with 2(p−1) + (v−1)p = 4 forwards, groups of p micro-batches per chunk."""
    order = build_schedule("interleaved-1f1b", 2, 4, 2)
    assert order.mesh_of == (0, 1, 0, 1)

    def f(s: int, b: int) -> Task:
        return Task(s, b, "forward")

    def b_(s: int, b: int) -> Task:
        return Task(s, b, "backward")

    assert order.orders[0][:-2] == (
        f(0, 0), f(0, 1), f(2, 0), f(2, 1),
        f(0, 2), b_(2, 0), f(0, 3), b_(2, 1), f(2, 2), b_(0, 0), f(2, 3), b_(0, 1),
        b_(2, 2), b_(2, 3), b_(0, 2), b_(0, 3),
    )  # fmt: skip
    assert order.orders[0][-2:] == (Task(0, None, "apply_grad"), Task(2, None, "apply_grad"))


def test_zb_h1_keeps_1f1b_memory_and_splits_the_backward() -> None:
    order = build_schedule("zb-h1", 4, 8)
    assert order.split_backward
    assert peak_stage_in_flight(order) == [4, 4, 4, 4]  # 1F1B's peak p on every mesh
    one_f_one_b = build_schedule("1f1b", 4, 8)
    assert peak_stage_in_flight(one_f_one_b) == [4, 3, 2, 1]
    for k in range(4):  # forwards and B's in 1F1B's order
        fb = [t for t in order.orders[k] if t.phase in ("forward", "backward")]
        assert fb == [t for t in one_f_one_b.orders[k] if t.phase in ("forward", "backward")]


def test_zb_h1_defers_w_within_each_stage_cap() -> None:
    """A cap between 1F1B's need (p − k) and p: the stage defers fewer W's."""
    order = build_schedule("zb-h1", 4, 8, 1, [4, 3, 3, 2])
    assert peak_stage_in_flight(order) == [4, 3, 3, 2]
    with pytest.raises(AlpaError, match=r"stage 1 may hold 2 micro-batches in flight; it needs 3"):
        build_schedule("zb-h1", 4, 8, 1, [4, 2, 3, 2])


def test_zb_v_under_uneven_caps_keeps_a_slot_for_the_second_chunk() -> None:
    """Mesh 0 may hold 4 chunks, mesh 1 only 2: mesh 0 must not fill all 4 with
    first chunks while mesh 1 delays the second chunk's forward (a deadlock
    found by the planner on MoE-10B's memory caps)."""
    order = build_schedule("zb-v", 2, 8, 2, [1, 1, 1, 3])
    assert order.mesh_of == (0, 1, 1, 0)


def test_zb_v_holds_what_the_caps_allow_not_only_2p() -> None:
    """Without caps a mesh holds at most 2p chunk activations (ZB-V's p·M_B);
    with caps it may hold their sum, which the planner derives from memory."""
    from alpa_ir.pipeline.task_order import peak_mesh_activations

    times = ((1.0, 2.0, 1.0),) * 6
    own = build_schedule("zb-v", 3, 12, 2, None, times)
    assert peak_mesh_activations(own, [1.0] * 6) == [6.0, 6.0, 6.0]
    capped = build_schedule("zb-v", 3, 12, 2, [2, 5, 5, 5, 5, 2], times)
    held = peak_mesh_activations(capped, [1.0] * 6)
    assert held[0] <= 4 and max(held) > 6 and max(held) <= 10
    with pytest.raises(AlpaError, match=r"phase times need a forward, B and W time"):
        build_schedule("zb-v", 3, 12, 2, None, ((1.0, 2.0, 1.0, 0.1),) * 6)


def test_zb_v_places_the_stages_in_a_v() -> None:
    order = build_schedule("zb-v", 3, 6, 2)
    assert order.mesh_of == (0, 1, 2, 2, 1, 0)
    assert order.stages_of(0) == (0, 5)


def _swap(order: TaskOrder, mesh: int, i: int, j: int) -> TaskOrder:
    tasks = list(order.orders[mesh])
    tasks[i], tasks[j] = tasks[j], tasks[i]
    orders = list(order.orders)
    orders[mesh] = tuple(tasks)
    return replace(order, orders=tuple(orders))


def test_checker_rejects_broken_orders() -> None:
    good = build_schedule("1f1b", 2, 2)
    check_task_order(good)
    # mesh 1 (the last stage) runs B before its F: waits on itself
    with pytest.raises(AlpaError, match=r"schedule '1f1b' deadlocks: the next tasks"):
        check_task_order(_swap(good, 1, 0, 1))
    twice = replace(good, orders=(good.orders[0] + (good.orders[0][0],), good.orders[1]))
    with pytest.raises(AlpaError, match=r"runs forward\[0\]@stage0 twice"):
        check_task_order(twice)
    moved = replace(good, orders=(good.orders[0][:-1], good.orders[1] + good.orders[0][-1:]))
    with pytest.raises(AlpaError, match=r"runs apply_grad@stage0 on mesh 1, not its stage's"):
        check_task_order(moved)
    late = _swap(good, 0, len(good.orders[0]) - 1, len(good.orders[0]) - 2)
    with pytest.raises(AlpaError, match=r"mesh 0 runs a task after its apply-grad"):
        check_task_order(late)
    missing = replace(good, orders=(good.orders[0][1:], good.orders[1]))
    with pytest.raises(AlpaError, match=r"misses \['forward\[0\]@stage0'\]"):
        check_task_order(missing)


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (("zigzag", 2, 4), "unknown schedule 'zigzag'; known: gpipe, 1f1b, interleaved-1f1b, "
                           "zb-h1, zb-v, inference"),
        (("inference", 2, 4, 2), "schedule 'inference' runs one stage per mesh; got "
                                 "virtual-stages=2"),
        (("1f1b", 2, 4, 2), "schedule '1f1b' runs one stage per mesh; virtual-stages=2 needs "
                            "interleaved-1f1b or zb-v"),
        (("zb-v", 2, 4, 3), "schedule 'zb-v' places 2 stages per mesh; got virtual-stages=3"),
        (("zb-h1", 2, 0), "schedule 'zb-h1' needs a positive number of micro-batches, got 0"),
        (("zb-h1", 2, 4, 0), "schedule 'zb-h1': virtual-stages must be an int >= 1, got 0"),
    ],
)  # fmt: skip
def test_bad_sizes_are_one_line_errors(args: tuple, message: str) -> None:
    with pytest.raises(AlpaError) as info:
        build_schedule(*args)
    assert str(info.value) == message


def test_inference_runs_forwards_only() -> None:
    """Alpa's inference schedule: each mesh runs its stage's forwards in
    micro-batch order, nothing else; one micro-batch in flight per stage."""
    order = build_schedule("inference", 3, 4)
    assert order.forward_only
    assert order.orders[1] == tuple(Task(1, b, "forward") for b in range(4))
    assert expected_tasks(order) == {Task(s, b, "forward") for s in range(3) for b in range(4)}
    assert peak_stage_in_flight(order) == [1, 1, 1]
    with_backward = replace(
        order, orders=(*order.orders[:2], (*order.orders[2], Task(2, 0, "backward")))
    )
    with pytest.raises(AlpaError, match=r"has extra \['backward\[0\]@stage2'\]"):
        check_task_order(with_backward)


def test_a_plugin_schedule_is_built_and_checked() -> None:
    """A user's schedule (here: 1F1B's order under another name) reaches
    build_schedule through the plugin table; a broken one is rejected."""

    class Plugin:
        @staticmethod
        @hookimpl
        def alpa_ir_schedules() -> dict:
            def mine(meshes: int, mb: int, v: int, caps: object) -> TaskOrder:
                return replace(BUILTIN_SCHEDULES["1f1b"](meshes, mb, v, caps), kind="mine")

            def broken(meshes: int, mb: int, v: int, caps: object) -> TaskOrder:
                order = BUILTIN_SCHEDULES["gpipe"](meshes, mb, v, caps)
                return replace(order, kind="broken", orders=order.orders[:1] + ((),) * (meshes - 1))

            return {"mine": mine, "broken": broken}

    registry = load_registry(extra_plugins=[Plugin()])
    assert set(alpa_ir_schedules()) <= set(registry.schedules)
    order = build_schedule("mine", 3, 4, schedules=registry.schedules)
    assert order.kind == "mine"
    with pytest.raises(AlpaError, match="schedule 'broken' misses"):
        build_schedule("broken", 3, 4, schedules=registry.schedules)
