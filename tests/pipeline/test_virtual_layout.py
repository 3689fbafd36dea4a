"""Chunks for the schedules with several stages per mesh: cut anew per mesh
(a V's first mesh holds the first and the last layers), priced together
(memory once per mesh for the recomputed stash), and zero-bubble orders
built with the plan's phase times."""

from __future__ import annotations

import numpy as np
import pytest
from stage_fixtures import _small_cluster

from alpa_ir.costs.stage_table import StageCostTable, ViewCost
from alpa_ir.pipeline.pipeline_simulation import SimPlan, SimStage, simulate
from alpa_ir.pipeline.schedule_choice import in_flight_caps
from alpa_ir.pipeline.stage_construction import StageChoice, plan_stages
from alpa_ir.pipeline.virtual_layout import VirtualMesh, balance_chunks, chunk_layout


def _table(latencies: list[float], devices: int, memory: float = 100.0) -> StageCostTable:
    """One-device views; layer ``k`` takes ``latencies[k]`` seconds, holds 1 byte
    of parameters and 1 of activations; a range costs the sum of its layers."""
    cluster = _small_cluster(devices=devices, memory=memory)
    views = {(1, 1): (cluster.logical_mesh((1, 1)),)}
    num = len(latencies)
    table = StageCostTable(cluster, ((1, 1),), views, num)
    for i in range(num):
        for j in range(i, num):
            n = j - i + 1
            table.costs[(i, j, (1, 1))] = ViewCost(sum(latencies[i : j + 1]), n, n, 0.0)
    table.phase_flops = np.ones((num, 3))
    return table


def test_layouts() -> None:
    assert chunk_layout("zb-v", 3, 2) == (0, 1, 2, 2, 1, 0)
    assert chunk_layout("interleaved-1f1b", 3, 2) == (0, 1, 2, 0, 1, 2)


def test_a_v_gives_the_mesh_with_the_embedding_and_the_head_fewer_layers() -> None:
    """8 layers, the first and the last 3 s (an embedding, a head), the rest 1 s,
    on 2 meshes: mesh 0 holds chunks 0 and 3 of the V. Equal meshes take 6 s
    each: mesh 0 the two heavy layers alone, mesh 1 the six light ones. The
    DP's contiguous halves, re-dealt, would give mesh 0 9 s."""
    table = _table([3.0, 1, 1, 1, 1, 1, 1, 3.0], devices=2)
    cluster = table.cluster
    meshes = [VirtualMesh((1, 1), cluster.logical_mesh((1, 1), (d,))) for d in (0, 1)]
    chunks = balance_chunks(table, meshes, chunk_layout("zb-v", 2, 2), "zb-v", 8).chunks
    assert [(c.first, c.last, c.mesh) for c in chunks][::3] == [(0, 0, 0), (7, 7, 0)]
    assert {c.mesh for c in chunks[1:3]} == {1} and chunks[1].last + 1 == chunks[2].first
    plan = plan_stages(table, 8, "zb-v")
    assert [(s.first, s.last) for s in plan.stages][::3] == [(0, 0), (7, 7)]
    loads = [sum(s.latency for s, m in zip(plan.stages, plan.mesh_of or (), strict=True) if m == k)
             for k in (0, 1)]  # fmt: skip
    assert loads == [6.0, 6.0]


def test_a_mesh_holds_the_largest_recomputed_stash_once() -> None:
    """Two stages on one mesh, each with a stash used only while it runs (5 and
    3 bytes): the mesh's peak grows by 5, not 8."""

    def peak(stashes: tuple[float, float]) -> float:
        stages = tuple(
            SimStage(1.0, 1.0, persistent_memory=1.0, activation_memory=1.0,
                     transient_memory=t, backward_weight=1.0)
            for t in stashes
        )  # fmt: skip
        plan = SimPlan(stages, 4, "interleaved-1f1b", virtual_stages=2)
        return max(simulate(plan, check_memory=False).peak_memory)

    assert peak((5.0, 3.0)) - peak((0.0, 0.0)) == pytest.approx(5.0)
    alone = SimStage(1.0, 1.0, persistent_memory=1.0, activation_memory=1.0, transient_memory=5.0)
    assert max(simulate(SimPlan((alone,) * 2, 4, "1f1b")).peak_memory) == pytest.approx(1 + 5 + 2)


def test_zb_v_caps_leave_room_for_the_larger_chunk() -> None:
    """Chunks of 1 and 3 bytes of activations share a mesh with 13 bytes free:
    the schedule counts chunk activations against the sum of the caps, so
    they must fit even if all are of the 3-byte chunk: 4 slots, 2 each."""
    table = _table([1.0, 1.0], devices=1, memory=15.0)
    mesh = table.cluster.logical_mesh((1, 1), (0,))
    costs = [ViewCost(1.0, 1.0, 1.0, 0.0), ViewCost(1.0, 1.0, 3.0, 0.0)]
    stages = [StageChoice(k, k, (1, 1), mesh, c, 1.0) for k, c in enumerate(costs)]
    assert in_flight_caps(table, stages, "zb-v", (0, 0)) == (2, 2)


@pytest.mark.parametrize(("f", "b", "w"), [(1.0, 2.0, 1.0), (0.342, 0.695, 0.331)])
def test_a_zero_bubble_order_built_with_the_phase_times_keeps_the_meshes_busy(
    f: float, b: float, w: float
) -> None:
    """B twice F (remat): the ZB-V order built for unit times idles a third of
    the step; built with the times, the step is within 5 % of the work."""
    p, m = 4, 32
    stage = SimStage(f, b, activation_memory=1.0, backward_weight=w)
    unit = SimPlan((stage,) * (2 * p), m, "zb-v", virtual_stages=2)
    timed = SimPlan((stage,) * (2 * p), m, "zb-v", virtual_stages=2,
                    phase_times=((f, b, w),) * (2 * p))  # fmt: skip
    work = m * 2 * (f + b + w)
    assert simulate(unit).iteration_time > 1.2 * work
    assert simulate(timed).iteration_time <= 1.05 * work


def test_a_zb_v_order_built_with_transfer_times_and_memory_caps_keeps_the_slowest_mesh_busy() -> (
    None
):
    """GPT-3 15B's chunks at 32 micro-batches on 4 meshes (the first mesh holds
    the embedding and the head), 0.107 s per transfer: built with the transfer
    times and the memory's caps (more than ZB-V's own 2p chunks per mesh), the
    step is the first mesh's work; without the transfer times, or held to 2p
    chunks, it idles."""
    p, m, t = 4, 32, 0.107
    times = [(0.343, 0.637, 0.39)] + [(0.342, 0.695, 0.331)] * 6 + [(0.416, 0.754, 0.361)]
    stages = tuple(SimStage(f, b, activation_memory=1.0, backward_weight=w) for f, b, w in times)
    transfers = tuple(0.0 if k == p - 1 else t for k in range(2 * p - 1))  # mesh 3 holds 3 and 4
    arrivals = [
        (transfers[s - 1] if s else 0.0, transfers[s] if s < 2 * p - 1 else 0.0)
        for s in range(2 * p)
    ]
    with_transfers = tuple((*x, *a) for x, a in zip(times, arrivals, strict=True))

    def step(phase_times: tuple[tuple[float, ...], ...], caps: tuple[int, ...] | None) -> float:
        plan = SimPlan(stages, m, "zb-v", transfers, virtual_stages=2, in_flight_caps=caps,
                       phase_times=phase_times)  # fmt: skip
        return simulate(plan).iteration_time

    caps = (6, 9, 9, 9, 9, 9, 9, 6)
    work = m * (sum(times[0]) + sum(times[-1]))
    assert step(with_transfers, caps) == pytest.approx(work, rel=1e-3)
    assert step(tuple(times), caps) > 1.01 * work
    assert step(with_transfers, None) > 1.03 * work


def test_the_plan_carries_the_phase_times_its_order_is_built_with() -> None:
    from stage_fixtures import _deep_module
    from xdsl.dialects.builtin import DenseArrayBase, f64
    from xdsl.utils.exceptions import VerifyException

    from alpa_ir.dialects.pipeline import PlanOp
    from alpa_ir.ir.module_utils import top_level_ops
    from alpa_ir.pipeline.stage_construction import construct_stages

    module = _deep_module()  # 4 layers
    plan = construct_stages(
        module, _small_cluster(devices=2), num_micro_batches=4, schedule="zb-v", progress=False
    )
    (op,) = top_level_ops(module, PlanOp)
    assert isinstance(op, PlanOp)
    assert plan.phase_times is not None and len(plan.phase_times) == 4
    written = op.stage_phase_times()
    assert written is not None
    flat = [t for times in plan.phase_times for t in times]
    assert [t for times in written for t in times] == pytest.approx(flat)
    assert all(len(times) == 5 for times in written)  # F, B, W and the two arrivals
    op.verify()
    op.properties["phase_times"] = DenseArrayBase.from_list(f64, [1.0, 2.0, 3.0] * 4)
    op.verify()  # three per stage: no transfer times
    assert op.stage_phase_times() == ((1.0, 2.0, 3.0),) * 4
    op.properties["phase_times"] = DenseArrayBase.from_list(f64, [1.0, 2.0])
    with pytest.raises(VerifyException, match=r"phase_times needs a forward, B and W time"):
        op.verify()


def _reference_score(prices, layout, cuts, num_layers, memory, demand):  # type: ignore[no-untyped-def]
    """_score as first written: every value read by its own four-level lookup."""
    from alpa_ir.pipeline.virtual_layout import CAP_SLOWDOWN

    meshes = max(layout) + 1
    load = [[0.0, 0.0] for _ in range(meshes)]
    fixed = [[0.0, 0.0] for _ in range(meshes)]
    running = [[0.0, 0.0] for _ in range(meshes)]
    transient = [[0.0, 0.0] for _ in range(meshes)]
    edges = [0, *cuts, num_layers]
    for pos, k in enumerate(layout):
        first, last = edges[pos], edges[pos + 1] - 1
        for c in (0, 1):
            load[k][c] += prices.latency[k][c][first][last]
            fixed[k][c] += prices.persistent[k][c][first][last]
            transient[k][c] = max(transient[k][c], prices.transient[k][c][first][last])
            per = prices.activations[k][c][first][last]
            if demand.held is None:
                running[k][c] = max(running[k][c], 2 * per)
            else:
                running[k][c] += demand.held[pos] * per
    choices, need_of, times, overflow = [], [], [], 0.0
    wanted = 2 * min(meshes, demand.micro_batches)
    for k in range(meshes):
        held = [fixed[k][c] + transient[k][c] for c in (0, 1)]
        need = [held[c] + running[k][c] for c in (0, 1)]
        c = 0 if need[0] <= memory else int(need[1] < need[0])
        choices.append(c)
        need_of.append(need[c])
        overflow += max(0.0, need[c] - memory)
        seconds = load[k][c]
        if demand.held is None and running[k][c] > 0:
            slots = max(2.0, 2 * (memory - held[c]) / running[k][c])
            seconds *= max(1.0, wanted / slots) ** CAP_SLOWDOWN
        times.append(seconds)
    slowest = max(range(meshes), key=times.__getitem__)
    hot = {slowest} | {k for k in range(meshes) if need_of[k] > memory}
    return overflow, tuple(sorted(times, reverse=True)), choices, hot


@pytest.mark.parametrize("seed", range(3))
def test_the_score_reads_each_range_once_and_sums_as_before(seed: int) -> None:
    """_score (a range's eight values in one tuple) gives the first version's
    floats exactly, on both schedules' demands, meshes of two views, and
    ranges with a memory-saving plan."""
    from alpa_ir.pipeline.virtual_layout import _demand, _Prices, _score

    rng = np.random.default_rng(seed)
    num = 11
    cluster = _small_cluster(devices=4, memory=60.0)
    shapes = ((1, 2), (2, 1))
    views = {(1, 2): tuple(cluster.logical_mesh(s) for s in shapes)}
    table = StageCostTable(cluster, ((1, 2),), views, num)
    for i in range(num):
        for j in range(i, num):
            for shape in shapes:
                n = j - i + 1
                lat, per, act, tra = rng.uniform(0.1, 3.0, 4) * n
                saving = ViewCost(1.3 * lat, 0.4 * per, act, 0.0, 0.7 * tra)
                table.costs[(i, j, shape)] = ViewCost(
                    lat, per, act, 0.0, tra, memory_saving=saving if rng.random() < 0.5 else None
                )
    meshes = [VirtualMesh((1, 2), cluster.logical_mesh(shapes[d % 2], (2 * d, 2 * d + 1)))
              for d in (0, 1)]  # fmt: skip
    prices = _Prices(table, meshes)
    for schedule in ("zb-v", "interleaved-1f1b"):
        layout = chunk_layout(schedule, 2, 2)
        demand = _demand(schedule, 2, 8, 2)
        for _ in range(40):
            cuts = sorted(rng.choice(np.arange(1, num), len(layout) - 1, replace=False).tolist())
            found = _score(prices, layout, cuts, num, 60.0, demand)
            assert found == _reference_score(prices, layout, cuts, num, 60.0, demand)
