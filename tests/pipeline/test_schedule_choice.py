"""Choosing the schedule with the stages: phase FLOPs per layer, the DP's
generalised latency, in-flight caps from memory, and construct-stages{schedule=auto}
picking the fastest schedule that fits, never slower than 1F1B."""

from __future__ import annotations

import numpy as np
import pytest
from stage_fixtures import _deep_module, _small_cluster

from alpa_ir.costs.flops import op_flops
from alpa_ir.costs.stage_table import StageCostTable, ViewCost, range_phase_shares
from alpa_ir.dialects.pipeline import PlanOp
from alpa_ir.errors import AlpaError
from alpa_ir.ir.module_utils import main_function, top_level_ops
from alpa_ir.pipeline.layer_phases import layer_phase_flops
from alpa_ir.pipeline.layer_ranges import LayerRanges
from alpa_ir.pipeline.schedule_choice import dp_latencies, phase_times
from alpa_ir.pipeline.stage_construction import (
    SCHEDULES_ATTR,
    construct_stages,
    plan_stages,
)


def test_each_layer_splits_its_backward_into_input_and_weight_gradients() -> None:
    """Four tanh(h @ w) layers of a 8x16 batch: each backward has one 8x16x16
    matmul for w's gradient (W) and, but for the first layer, one for the
    gradient of h (B); the forward has the layer's matmul. The last layer's
    backward is apart from its forward (as its stage's functions are)."""
    ranges = LayerRanges(main_function(_deep_module()))
    flops = layer_phase_flops(ranges)
    matmul = 2.0 * 8 * 16 * 16
    assert flops.shape == (4, 3)
    assert flops[0, 1] == 0  # nothing before the first layer needs a gradient
    assert all(matmul <= flops[k, 1] < 2 * matmul for k in (1, 2, 3))
    assert all(matmul <= flops[k, 2] < 2 * matmul for k in range(4))
    assert all(matmul <= flops[k, 0] < 2 * matmul for k in range(4))
    forward, backward = ranges.layer_ops()[2]
    assert flops[2, 0] == sum(op_flops(op) for op in forward)
    assert flops[2, 1] + flops[2, 2] == sum(op_flops(op) for op in backward)
    shares = range_phase_shares(flops)
    assert shares[1, 3].sum() == pytest.approx(1.0)
    assert shares[1, 3] == pytest.approx(flops[1:4].sum(0) / flops[1:4].sum())
    assert (shares[3, 1] == 0).all()  # below the diagonal: no range


def test_phase_times_put_the_recomputed_forward_into_b() -> None:
    cluster = _small_cluster(devices=1)
    table = StageCostTable(cluster, ((1, 1),), {(1, 1): (cluster.logical_mesh((1, 1)),)}, 2)
    f, b, w = phase_times(table, 0, 1, 3.0, remat=False)  # no FLOPs: F a third, B = W
    assert (f, b, w) == pytest.approx((1.0, 1.0, 1.0))
    f, b, w = phase_times(table, 0, 1, 4.0, remat=True)  # F + (F + B) + W
    assert (f, b, w) == pytest.approx((1.0, 2.0, 1.0))


def test_the_zero_bubble_dp_sums_what_the_bubble_cannot_hide() -> None:
    latency = np.full((1, 1, 1), 3.0)
    shares = np.array([[[1 / 3, 1 / 3, 1 / 3]]])
    assert dp_latencies("1f1b", latency, latency, shares)[0, 0, 0] == 3.0
    assert dp_latencies("zb-h1", latency, latency, shares)[0, 0, 0] == pytest.approx(1.0)
    # an embedding-like stage (W twice its forward, no B): never below its forward
    heavy = np.array([[[1 / 3, 0.0, 2 / 3]]])
    assert dp_latencies("zb-h1", latency, latency, heavy)[0, 0, 0] == pytest.approx(1.0)


def _uniform_table(
    num_layers: int, devices: int, memory: float, activations: list[float] | None = None
) -> StageCostTable:
    """Equal layers, each 1 s per micro-batch on one device, 1 byte of
    parameters and ``activations[i]`` bytes (default 1) of activations; a range
    costs the sum of its layers."""
    cluster = _small_cluster(devices=devices, memory=memory)
    views = {(1, 1): (cluster.logical_mesh((1, 1)),)}
    table = StageCostTable(cluster, ((1, 1),), views, num_layers)
    acts = activations or [1.0] * num_layers
    for i in range(num_layers):
        for j in range(i, num_layers):
            n = j - i + 1
            table.costs[(i, j, (1, 1))] = ViewCost(float(n), float(n), sum(acts[i : j + 1]), 0.0)
    table.phase_flops = np.ones((num_layers, 3))
    return table


def test_auto_picks_zb_h1_when_memory_allows_and_never_loses_to_1f1b() -> None:
    table = _uniform_table(4, 4, memory=100.0)
    auto = plan_stages(table, 8, "auto")
    names = [c.schedule for c in auto.candidates]
    assert set(names) == {"1f1b", "zb-h1", "interleaved-1f1b", "zb-v", "gpipe"}
    times = {c.schedule: c.iteration_time for c in auto.candidates}
    assert times["zb-h1"] < times["1f1b"] <= times["gpipe"]
    # one layer per stage: no mesh can hold two chunks
    assert not any(c.fits for c in auto.candidates if c.schedule in ("interleaved-1f1b", "zb-v"))
    assert auto.schedule == names[0] == "zb-h1"
    assert auto.in_flight == (4, 4, 4, 4)  # p on every stage: 4 + 4 bytes fit in 100
    # 4 stages of 1 s (F = B = W = 1/3 s), 8 micro-batches: 1F1B's bubble is 3 s,
    # ZB-H1's (p − 1)(T_F + T_B − T_W) = 1 s, plus apply-grad on both
    assert times["1f1b"] - times["zb-h1"] == pytest.approx(2.0, rel=1e-6)


def test_tight_memory_caps_zb_h1_at_1f1b_memory() -> None:
    """Stage i has room for exactly 1F1B's p − i micro-batches (2 bytes, 1 of
    parameters): ZB-H1 defers no W in the steady state, holds 1F1B's memory,
    and still gains the cool-down, where its B's pass down without their W's
    (1 of 1F1B's 3 s bubble)."""
    table = _uniform_table(4, 4, memory=2.0, activations=[0.25, 0.3, 0.45, 0.9])
    auto = plan_stages(table, 8, "auto")
    by_name = {c.schedule: c for c in auto.candidates}
    assert by_name["zb-h1"].in_flight == (4, 3, 2, 1)
    assert by_name["zb-h1"].peak_memory == pytest.approx(by_name["1f1b"].peak_memory)
    gain = by_name["1f1b"].iteration_time - by_name["zb-h1"].iteration_time
    assert gain == pytest.approx(1.0, rel=1e-6)
    assert auto.schedule == "zb-h1" and auto.in_flight == (4, 3, 2, 1)
    assert not by_name["gpipe"].fits  # 8 in flight
    with pytest.raises(AlpaError):  # 1F1B's own need does not fit
        plan_stages(_uniform_table(4, 4, memory=2.0, activations=[0.3] * 4), 8, "auto")


def test_a_tie_goes_to_1f1b() -> None:
    """One stage: no bubble to fill, every schedule takes the same time."""
    auto = plan_stages(_uniform_table(2, 1, memory=100.0), 4, "auto")
    assert auto.schedule == "1f1b"
    assert len({round(c.iteration_time, 9) for c in auto.candidates}) == 1


def test_construct_stages_writes_the_chosen_schedule_and_the_candidates() -> None:
    module = _deep_module()
    cluster = _small_cluster(devices=4)
    plan = construct_stages(module, cluster, num_micro_batches=8, schedule="auto", progress=False)
    (op,) = top_level_ops(module, PlanOp)
    assert isinstance(op, PlanOp)
    assert op.schedule.data == plan.schedule
    written = op.attributes[SCHEDULES_ATTR].data  # type: ignore[attr-defined]
    assert set(written) == {c.schedule for c in plan.candidates if c.fits}
    first = plan.candidates[0]
    assert written[plan.schedule].value.data == pytest.approx(first.iteration_time)
    assert all(first.iteration_time <= c.iteration_time for c in plan.candidates)
    if plan.schedule == "zb-h1":
        assert op.in_flight_caps() == plan.in_flight


def test_unplannable_schedule_is_a_one_line_error() -> None:
    table = _uniform_table(2, 2, memory=100.0)
    with pytest.raises(AlpaError, match=r"schedule must be one of auto, 1f1b, zb-h1, .*, got 'zz'"):
        plan_stages(table, 4, "zz")


def test_virtual_stages_deal_each_mesh_its_layers_in_the_schedules_order() -> None:
    """8 equal layers on 4 one-device meshes: the DP gives each mesh 2 layers;
    interleaved deals them round-robin, V there and back; with ample memory
    ZB-V wins, and every schedule beats 1F1B."""
    table = _uniform_table(8, 4, memory=100.0)
    inter = plan_stages(table, 8, "interleaved-1f1b")
    assert inter.mesh_of == (0, 1, 2, 3, 0, 1, 2, 3)
    assert [(s.first, s.last) for s in inter.stages] == [(k, k) for k in range(8)]
    v = plan_stages(table, 8, "zb-v")
    assert v.mesh_of == (0, 1, 2, 3, 3, 2, 1, 0)
    assert {s.mesh.devices for s in v.stages[:4]} == {s.mesh.devices for s in v.stages[4:]}
    auto = plan_stages(table, 8, "auto")
    times = {c.schedule: c.iteration_time for c in auto.candidates}
    assert auto.schedule == "zb-v"
    assert times["zb-v"] < times["zb-h1"] < times["1f1b"]
    assert times["interleaved-1f1b"] < times["1f1b"]


def test_a_virtual_plan_is_written_with_shared_meshes() -> None:
    from alpa_ir.dialects.mesh import LogicalMeshOp
    from alpa_ir.dialects.pipeline import plan_stages as stages_of

    module = _deep_module()  # 4 layers
    plan = construct_stages(
        module, _small_cluster(devices=2), num_micro_batches=4, schedule="zb-v", progress=False
    )
    assert plan.schedule == "zb-v" and plan.mesh_of == (0, 1, 1, 0)
    meshes = [op for op in top_level_ops(module, LogicalMeshOp)]
    assert len(meshes) == 2
    assert [s.mesh.root_reference.data for s in stages_of(module)] == [
        meshes[0].sym_name.data,  # type: ignore[attr-defined]
        meshes[1].sym_name.data,  # type: ignore[attr-defined]
        meshes[1].sym_name.data,  # type: ignore[attr-defined]
        meshes[0].sym_name.data,  # type: ignore[attr-defined]
    ]
