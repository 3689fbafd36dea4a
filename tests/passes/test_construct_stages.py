"""construct-stages: AutoStageOption on the 8 CPU devices equals one device; the
cost table (range and layer-sum modes, cache hits on identical layers); errors;
the cross-stage communication option."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from pipeshard_fixtures import _assert_same_steps, _example, _step
from stage_fixtures import _deep_module
from stage_fixtures import _small_cluster as _cluster

from alpa_ir.api.pipeshard import AutoStageOption, PipeshardParallel
from alpa_ir.costs.analytical_stage_cost import AnalyticalStageCostModel
from alpa_ir.costs.stage_table import cost_table
from alpa_ir.dialects.pipeline import PlanOp
from alpa_ir.errors import AlpaError, PlanError
from alpa_ir.ir.module_utils import main_function, top_level_ops
from alpa_ir.passmanager.pass_manager import PassManager
from alpa_ir.pipeline.layer_ranges import LayerRanges
from alpa_ir.pipeline.stage_construction import LATENCY_ATTR, construct_stages, solve_stages
from alpa_ir.plugins.registry import default_registry


def test_auto_stages_equal_one_device() -> None:
    state, batch = _example()
    method = PipeshardParallel(num_micro_batches=2, stage_option=AutoStageOption())
    _assert_same_steps(_step, method, state, batch)


def test_identical_layers_hit_the_cost_cache() -> None:
    model = AnalyticalStageCostModel()
    ranges = LayerRanges(main_function(_deep_module()))
    table = cost_table(ranges, _cluster(), model, progress=False)
    assert table.pairs_costed == 10 * 3  # 10 ranges x views of (1,1), (1,2), (2,1)
    # the middle layers 1 and 2 are the same ops on the same shapes, and the
    # views (1,2) and (2,1) are one mesh of 2 devices: 9 distinct ranges on 2
    # distinct views are planned, the other 12 pairs are cache hits
    assert model.stats.misses == 9 * 2
    assert model.stats.hits == table.pairs_costed - 9 * 2


def test_layer_sum_adds_single_layers() -> None:
    ranges = LayerRanges(main_function(_deep_module()))
    model = AnalyticalStageCostModel()
    exact = cost_table(ranges, _cluster(), model, progress=False)
    summed = cost_table(ranges, _cluster(), model, cost_mode="layer-sum", progress=False)
    for shape in [(1, 1), (1, 2)]:
        one = [exact.cost(k, k, shape) for k in range(4)]
        assert summed.cost(1, 3, shape).latency == pytest.approx(sum(c.latency for c in one[1:]))
        assert summed.cost(0, 0, shape) == exact.cost(0, 0, shape)
        # the middle activations cross no stage inside a range
        assert summed.cost(1, 2, shape).cross_bytes == pytest.approx(
            exact.cost(1, 2, shape).cross_bytes
        )


def test_the_arrays_hold_every_ranges_cost() -> None:
    """``arrays`` (what the DP reads) agrees with ``cost`` for every range, in
    both modes; a layer-sum range is summed only when asked for."""
    ranges = LayerRanges(main_function(_deep_module()))
    for mode in ("range", "layer-sum"):
        table = cost_table(
            ranges, _cluster(), AnalyticalStageCostModel(), cost_mode=mode, progress=False
        )
        for shape in [(1, 1), (1, 2)]:
            arrays = table.arrays(shape)
            for i in range(4):
                for j in range(i, 4):
                    cost = table.cost(i, j, shape)
                    for name, values in arrays.items():
                        assert values[0, i, j] == pytest.approx(getattr(cost, name)), (mode, name)
            assert arrays["latency"][0, 1, 0] == float("inf")  # not a range
        if mode == "layer-sum":
            assert ranges.internal_bytes(1, 2) == pytest.approx(
                sum(ranges._edges[d][s] for d in (1, 2) for s in (1, 2))
            )


def test_the_pass_writes_meshes_and_the_plan() -> None:
    module = _deep_module()
    module.body.block.insert_op_before(_cluster(4).to_op(), main_function(module))
    PassManager(
        default_registry(), "builtin.module(construct-stages{num-micro-batches=2 progress=false})"
    ).run(module)
    plans = list(top_level_ops(module, PlanOp))
    assert len(plans) == 1 and LATENCY_ATTR in plans[0].attributes
    text = str(module)
    assert "mesh.logical_mesh @mesh0" in text and "stage0_forward" in text


def test_no_plan_fits_names_the_memory_needed() -> None:
    with pytest.raises(PlanError, match=r"no pipeline plan fits in .* needs [0-9.]+ GiB"):
        construct_stages(_deep_module(), _cluster(memory=1000.0), progress=False)


def test_more_stages_than_layers() -> None:
    ranges = LayerRanges(main_function(_deep_module()))
    table = cost_table(ranges, _cluster(8), AnalyticalStageCostModel(), progress=False)
    with pytest.raises(AlpaError, match=r"need at least 8 stages .* only 4 layers"):
        solve_stages(table, 2, submeshes=[(1, 1)])


def test_cross_stage_comm_prices_what_crosses_into_a_stage() -> None:
    ranges = LayerRanges(main_function(_deep_module()))
    slow = _cluster(2, bandwidth=1e3)
    table = cost_table(ranges, slow, AnalyticalStageCostModel(), progress=False)
    inter_only = solve_stages(table, 4, submeshes=[(1, 1)])
    with_comm = solve_stages(table, 4, submeshes=[(1, 1)], cross_stage_comm=True)
    assert with_comm.latency > inter_only.latency
    assert all(s.latency > s.cost.latency for s in with_comm.stages if s.cost.cross_bytes > 0)
    fewer = solve_stages(table, 4, cross_stage_comm=True)
    plain = solve_stages(table, 4)
    assert len(fewer.stages) <= len(plain.stages)


def test_activations_come_forward_and_gradients_back() -> None:
    ranges = LayerRanges(main_function(_deep_module()))
    for mode in ("range", "layer-sum"):
        model = AnalyticalStageCostModel()
        table = cost_table(ranges, _cluster(), model, cost_mode=mode, progress=False)
        first, middle, last = (table.cost(k, k, (1, 1)) for k in (0, 1, 3))
        assert first.cross_bytes == first.backward_bytes > 0  # gradients from layer 1 only
        assert last.backward_bytes == 0 < last.cross_bytes  # activations from layer 2 only
        assert 0 < middle.backward_bytes < middle.cross_bytes
        inner = table.cost(1, 2, (1, 1))  # receives from layers 0 and 3 only
        assert inner.cross_bytes == pytest.approx(first.backward_bytes + last.cross_bytes)
        assert inner.backward_bytes == pytest.approx(first.backward_bytes)


def test_a_slow_link_paces_the_pipeline() -> None:
    """With cross-stage comm, a stage counts in Eq. 2's max as the slowest of
    its compute and its incoming links, and the transfers add to the sum."""
    ranges = LayerRanges(main_function(_deep_module()))
    slow = _cluster(4, bandwidth=1e3)
    table = cost_table(ranges, slow, AnalyticalStageCostModel(), progress=False)
    plan = solve_stages(table, 8, submeshes=[(1, 1)], cross_stage_comm=True)
    for stage in plan.stages:
        forward, backward = table.transfer_times(stage.cost, stage.submesh)
        assert stage.latency == pytest.approx(stage.cost.latency + forward + backward)
        assert stage.pace == pytest.approx(max(stage.cost.latency, forward, backward))
    paces = [s.pace for s in plan.stages]
    assert max(paces) > max(s.cost.latency for s in plan.stages)  # the links are the bottleneck
    expected = sum(s.latency for s in plan.stages) + 7 * max(paces)
    assert plan.latency == pytest.approx(expected)


def test_workers_give_the_same_table_as_one_process() -> None:
    ranges = LayerRanges(main_function(_deep_module()))
    serial = cost_table(ranges, _cluster(4), AnalyticalStageCostModel(), progress=False)
    model = AnalyticalStageCostModel()
    parallel = cost_table(ranges, _cluster(4), model, progress=False, workers=2, workers_from_ops=0)
    assert parallel.costs == serial.costs
    assert parallel.pairs_costed == serial.pairs_costed
    # each distinct pair once; the parent's model keeps what the workers costed
    assert model.stats.misses == len(model._cache)
    assert model.stats.hits + model.stats.misses == parallel.pairs_costed


@dataclass
class _SlowParentModel(AnalyticalStageCostModel):
    """Costs as the analytical model, a second per pair in this process (so a
    worker process starts and takes tasks before the parent is done), which
    counts the pairs it costed; with ``fail_in_workers`` every other process
    (a worker, or this one when the model is used directly) fails instead."""

    parent: int = 0
    fail_in_workers: bool = False
    copies: list[_SlowParentModel] = field(default_factory=list)
    costed_here: int = 0

    def worker_copy(self) -> AnalyticalStageCostModel:
        copy = _SlowParentModel(
            self.options, parent=os.getpid(), fail_in_workers=self.fail_in_workers
        )
        self.copies.append(copy)
        return copy

    def keyed_cost(self, *args: Any, **kwargs: Any) -> Any:
        if os.getpid() == self.parent:
            time.sleep(1.0)
            self.costed_here += 1
        elif self.fail_in_workers:
            raise AlpaError("stage cost: this mesh is not allowed")
        return super().keyed_cost(*args, **kwargs)


@pytest.mark.parametrize("ahead", [False, True], ids=["started-by-the-table", "started-ahead"])
def test_the_parent_and_a_worker_process_share_the_tasks(
    ahead: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The parent costs tasks beside a worker process: one the table starts,
    or one started ahead, which is then taken instead of starting another."""
    import alpa_ir.costs.costing_workers as costing_workers

    ranges = LayerRanges(main_function(_deep_module()))
    serial = cost_table(ranges, _cluster(4), AnalyticalStageCostModel(), progress=False)
    model = _SlowParentModel()
    with costing_workers.StartedWorkers(1 if ahead else 0) as started:
        if ahead:

            def no_process() -> None:
                raise AssertionError("the worker started ahead should be used")

            monkeypatch.setattr(costing_workers, "_start_worker", no_process)
        parallel = cost_table(
            ranges, _cluster(4), model, progress=False, workers=2, workers_from_ops=0,
            started=started,
        )  # fmt: skip
        assert len(started) == 0  # taken (or none started)
    assert parallel.costs == serial.costs
    here = sum(c.costed_here for c in model.copies)
    assert 0 < here < model.stats.misses  # the worker process costed the others


def test_workers_started_ahead_and_not_taken_are_ended() -> None:
    from alpa_ir.costs.costing_workers import StartedWorkers

    with StartedWorkers(2) as started:
        processes = [process for process, _ in started._idle]
        assert len(started) == 2 and all(p.poll() is None for p in processes)
    assert all(p.poll() is not None for p in processes)


def test_a_script_without_a_main_guard_costs_in_workers(tmp_path: Path) -> None:
    """The workers do not re-import the user's script (multiprocessing's
    spawn would run it again, and fail, without ``if __name__ == "__main__"``)."""
    script = tmp_path / "plan.py"
    script.write_text(
        "import sys\n"
        f"sys.path.insert(0, {str(Path(__file__).parents[1])!r})\n"
        "from stage_fixtures import _deep_module, _small_cluster\n"
        "from alpa_ir.costs.analytical_stage_cost import AnalyticalStageCostModel\n"
        "from alpa_ir.ir.module_utils import main_function\n"
        "from alpa_ir.costs.stage_table import cost_table\n"
        "from alpa_ir.pipeline.layer_ranges import LayerRanges\n"
        "ranges = LayerRanges(main_function(_deep_module()))\n"
        "table = cost_table(ranges, _small_cluster(4), AnalyticalStageCostModel(),\n"
        "                   progress=False, workers=2, workers_from_ops=0)\n"
        "print('RAN', table.pairs_costed)\n"
    )
    done = subprocess.run(
        [sys.executable, str(script)], capture_output=True, text=True, timeout=300, check=False
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.count("RAN") == 1  # the script ran once, in the parent only


def test_a_worker_error_is_raised_in_the_parent() -> None:
    ranges = LayerRanges(main_function(_deep_module()))
    names = r"construct-stages: costing layers? [0-9-]+ on the logical mesh \[\d+, \d+\]: "
    with pytest.raises(AlpaError, match=names + "stage cost: this mesh is not allowed"):
        cost_table(
            ranges,
            _cluster(4),
            _SlowParentModel(fail_in_workers=True),
            progress=False,
            workers=2,
            workers_from_ops=0,
        )


def test_a_failing_pair_names_its_layers_and_mesh_in_this_process() -> None:
    ranges = LayerRanges(main_function(_deep_module()))
    with pytest.raises(
        AlpaError,
        match=r"^construct-stages: costing layer 0 on the logical mesh \[1, 1\]: stage cost: "
        "this mesh is not allowed$",
    ):
        cost_table(ranges, _cluster(4), _SlowParentModel(fail_in_workers=True), progress=False)


def test_a_small_table_is_costed_without_starting_workers(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import alpa_ir.costs.costing_workers as costing_workers

    def no_process() -> None:
        raise AssertionError("no worker should start for a tiny model")

    monkeypatch.setattr(costing_workers, "_start_worker", no_process)
    ranges = LayerRanges(main_function(_deep_module()))
    serial = cost_table(ranges, _cluster(4), AnalyticalStageCostModel(), progress=False)
    parallel = cost_table(
        ranges, _cluster(4), AnalyticalStageCostModel(), progress=False, workers=2
    )
    assert parallel.costs == serial.costs


def test_repeated_layers_reach_the_costings_auto_sharding() -> None:
    from alpa_ir.costs.function_plan import plan_function
    from alpa_ir.passes.construct_stages import ConstructStages

    function = LayerRanges(main_function(_deep_module())).function(0, 3).function
    mesh = _cluster(4).logical_mesh((1, 4))
    variables = {}
    for mode in ("separate", "share"):
        options = ConstructStages(repeated_layers=mode).cost_options()  # type: ignore[arg-type]
        assert options.repeated_layers == mode
        statistics: list[Any] = []
        plan_function(function, mesh, options, statistics=statistics)
        stats = {s.name: s.value for s in statistics}
        variables[mode] = (stats["num-nodes"], stats["num-variables"])
    nodes, separate = variables["separate"]
    assert separate == nodes
    assert variables["share"][1] < nodes  # the repeated layers' copies share variables


def test_workers_must_be_positive() -> None:
    ranges = LayerRanges(main_function(_deep_module()))
    with pytest.raises(AlpaError, match="workers must be >= 1, got 0"):
        cost_table(ranges, _cluster(), AnalyticalStageCostModel(), progress=False, workers=0)


def test_the_pass_gives_the_cost_model_its_options_of_the_same_names() -> None:
    """Every stage cost option the pass has a field for reaches the model as set
    (a new field named like a cost option is a choice, seen here)."""
    from dataclasses import fields

    from alpa_ir.costs.stage_cost import StageCostOptions
    from alpa_ir.passes.construct_stages import ConstructStages

    shared = {f.name for f in fields(ConstructStages)} & {f.name for f in fields(StageCostOptions)}
    assert shared == {
        "cost_model", "fusion", "memory_fallback", "optimizer_state_factor", "remat",
        "repeated_layers", "solver", "time_limit", "zero", "num_micro_batches",
    }  # fmt: skip
    stage_pass = ConstructStages(
        optimizer_state_factor=3.0, solver="highs", time_limit=5.0, remat=True, zero=True,
        fusion=True, memory_fallback=True, repeated_layers="share", cost_model="alpha-beta",
        num_micro_batches=4,
    )  # fmt: skip
    options = stage_pass.cost_options()
    assert {n: getattr(options, n) for n in shared} == {n: getattr(stage_pass, n) for n in shared}


def test_cross_stage_comm_auto_keeps_the_plan_the_simulator_times_faster() -> None:
    """On slow links the DP that counts transfers finds a faster plan than
    Alpa's, and ``auto`` keeps it; it never keeps the slower of the two; with
    one device both are one plan, Alpa's."""
    from alpa_ir.pipeline.stage_construction import _simulated, plan_stages

    ranges = LayerRanges(main_function(_deep_module()))
    model = AnalyticalStageCostModel()
    for cluster, slow in ((_cluster(4, bandwidth=1e3), True), (_cluster(4), False)):
        table = cost_table(ranges, cluster, model, progress=False)
        plans = {c: plan_stages(table, 4, cross_stage_comm=c) for c in (False, True, "auto")}
        times = {c: _simulated(table, p, 4, p.schedule, False).iteration_time
                 for c, p in plans.items()}  # fmt: skip
        assert times["auto"] == min(times[False], times[True])
        if slow:
            assert times[True] < times[False] and plans["auto"] == plans[True]
    one = cost_table(ranges, _cluster(1), model, progress=False)
    assert plan_stages(one, 4, cross_stage_comm="auto") == plan_stages(one, 4)


def test_the_cost_table_leaves_the_step_out_of_collections() -> None:
    """The step and its layers, which outlive the costing, are frozen while it runs."""
    import gc

    seen: list[int] = []

    class Recording(AnalyticalStageCostModel):
        def keyed_cost(self, *args: Any, **kwargs: Any) -> Any:
            seen.append(gc.get_freeze_count())
            return super().keyed_cost(*args, **kwargs)

    ranges = LayerRanges(main_function(_deep_module()))
    assert gc.get_freeze_count() == 0
    cost_table(ranges, _cluster(4), Recording(), progress=False)
    assert seen and min(seen) > 0
    assert gc.get_freeze_count() == 0


def test_shard_stages_leaves_the_module_out_of_collections(monkeypatch: pytest.MonkeyPatch) -> None:
    """The module outlives the planning of its stage functions: frozen meanwhile."""
    import gc

    import alpa_ir.passes.shard_stages as shard_stages
    from alpa_ir.ir.context import make_context

    seen: list[int] = []
    monkeypatch.setattr(
        shard_stages, "shard_in_call_order", lambda op, shard: seen.append(gc.get_freeze_count())
    )
    shard_stages.ShardStages().apply(make_context(), _deep_module())
    assert seen and seen[0] > 0
    assert gc.get_freeze_count() == 0
