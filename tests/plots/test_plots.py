"""Pictures of plans: each file is written and holds what the plan says (the
SVG's element ids count the drawn bars, boxes and tiles)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from zoo_fixtures import tiny_step

import alpa_ir
from alpa_ir.backends.simulate import SimPlan, SimStage, simulate
from alpa_ir.dialects.sharding import ShardingSpec
from alpa_ir.errors import AlpaError
from alpa_ir.plots.devices import StageMesh, draw_devices
from alpa_ir.plots.memory import draw_memory, memory_curves
from alpa_ir.plots.shardings import ShardedTensor, draw_shardings, tile_owners
from alpa_ir.plots.timeline import draw_timeline
from alpa_ir.tools.alpa_opt import main as alpa_opt

FILECHECK = Path(__file__).resolve().parents[1] / "filecheck" / "alpa-opt"


def _ids(svg: Path, prefix: str) -> list[str]:
    return re.findall(rf'id="({prefix}[^"]*)"', svg.read_text())


def _plan(schedule: str, stages: int = 3, micro_batches: int = 4) -> SimPlan:
    return SimPlan(
        tuple(
            SimStage(1.0 + s, 2.0, 0.5, persistent_memory=100.0 * (s + 1), activation_memory=10.0)
            for s in range(stages)
        ),
        micro_batches,
        schedule,
        forward_transfers=(0.25,) * (stages - 1),
    )


@pytest.mark.parametrize("schedule", ["1f1b", "gpipe"])
def test_timeline_has_a_bar_per_run_and_per_transfer(tmp_path: Path, schedule: str) -> None:
    plan = _plan(schedule)
    result = simulate(plan)
    drawing = draw_timeline(result, tmp_path / "t.svg")
    runs, transfers = _ids(drawing.path, "run-"), _ids(drawing.path, "transfer-")
    # per stage: a forward and a backward per micro-batch, one apply-grad
    assert len(runs) == drawing.runs == 3 * (2 * 4 + 1) == len(result.timeline)
    # per boundary: each micro-batch's activations forward and gradients back
    assert len(transfers) == drawing.transfers == 2 * 2 * 4 == len(result.transfers)
    assert "run-2-backward-3" in runs and "transfer-1-0-3" in transfers
    assert drawing.end == result.iteration_time


def test_timeline_draws_a_measured_run_on_the_same_axis(tmp_path: Path) -> None:
    plan = _plan("1f1b", stages=2, micro_batches=2)
    slower = SimPlan(tuple(SimStage(2.0 * s.forward, 2.0 * s.backward, s.apply_grad)
                           for s in plan.stages), 2, "1f1b")  # fmt: skip
    measured = simulate(slower)
    drawing = draw_timeline(simulate(plan), tmp_path / "t.svg", measured=measured)
    assert drawing.measured_runs == len(_ids(drawing.path, "measured-run-")) == 2 * (2 * 2 + 1)
    assert drawing.end == measured.iteration_time


@pytest.mark.parametrize("schedule", ["1f1b", "gpipe"])
def test_memory_peak_is_the_simulators(tmp_path: Path, schedule: str) -> None:
    plan = _plan(schedule, stages=3, micro_batches=6)
    result = simulate(plan)
    drawing = draw_memory(plan, result, tmp_path / "m.svg")
    assert drawing.peaks == pytest.approx(result.peak_memory)
    assert len(_ids(drawing.path, "peak-")) == 3
    for stage, curve in zip(plan.stages, memory_curves(plan, result), strict=True):
        assert curve[0][1] == curve[-1][1] == stage.persistent_memory  # all freed at the end


def test_device_picture_has_a_box_per_device(tmp_path: Path) -> None:
    stages = [
        StageMesh("stage0", (2, 4), tuple(range(8))),
        StageMesh("stage1", (1, 8), tuple(range(8, 16))),
    ]
    drawing = draw_devices(2, 8, stages, tmp_path / "d.svg")
    assert drawing.devices == 16
    assert sorted(_ids(drawing.path, "device-"), key=lambda s: int(s.split("-")[1])) == [
        f"device-{d}" for d in range(16)
    ]
    assert len(_ids(drawing.path, "host-")) == 2


@pytest.mark.parametrize(
    ("spec", "tiles", "holders"),
    [
        ("[S0, R]", 2, 4),
        ("[R, S1]", 4, 2),
        ("[S01, R]", 8, 1),
        ("[S1, S0]", 8, 1),
        ("[R, R]", 1, 8),
    ],
)
def test_sharding_tiles_follow_the_spec(
    tmp_path: Path, spec: str, tiles: int, holders: int
) -> None:
    dims = tuple(
        tuple(int(c) for c in d[1:]) if d.startswith("S") else ()
        for d in spec.strip("[]").split(", ")
    )
    tensor = ShardedTensor("w", (16, 32), ShardingSpec(dims), (2, 4))
    assert str(tensor.spec) == spec
    owners = tile_owners(tensor)
    assert len(owners) == tiles and all(len(h) == holders for h in owners.values())
    drawing = draw_shardings([tensor], tmp_path / "s.svg")
    assert drawing.tiles == (tiles,) and len(_ids(drawing.path, "tile-0-")) == tiles


def test_pipeshard_executable_draws_every_view(tmp_path: Path) -> None:
    fn, args = tiny_step("mlp-tiny")
    method = alpa_ir.PipeshardParallel(
        num_micro_batches=2,
        layer_option=alpa_ir.AutoLayerOption(layer_num=2),
        stage_option=alpa_ir.UniformStageOption(num_stages=2),
    )
    executable = alpa_ir.parallelize(fn, method=method).get_executable(*args)
    # each sharding panel says why: its function's costliest communication
    from alpa_ir.plots.views import largest_tensors

    whys = [t.why for t in largest_tensors(executable.module)]
    assert whys and all(w.startswith("costliest: ") or w == "no communication" for w in whys)
    assert any(" B per device: " in w for w in whys)
    timeline = executable.plot("timeline", tmp_path / "timeline.svg")
    # 2 stages x (2 forward + 2 backward + apply-grad), 2 micro-batches each way
    assert timeline.runs == len(_ids(timeline.path, "run-")) == 10
    assert timeline.transfers == len(_ids(timeline.path, "transfer-")) == 4
    devices = executable.plot("devices", tmp_path / "devices.png")
    assert devices.devices == 8 and devices.path.stat().st_size > 1000
    assert executable.plot("memory", tmp_path / "memory.png").path.is_file()
    assert executable.plot("shardings", tmp_path / "shardings.png").path.is_file()

    # a measured step: a bar per RUN instruction executed, a bar per transfer
    # between stages (a SEND on one mesh and its RECV on another)
    executable.record_timeline = True
    executable(*args)
    runs = sum(i.kind == "run" for ins in executable.program.instructions.values() for i in ins)
    sends = {(i.target, i.micro_batch) for ins in executable.program.instructions.values()
             for i in ins if i.kind == "send"}  # fmt: skip
    measured = executable.plot("timeline", tmp_path / "measured.svg")
    assert measured.measured_runs == len(_ids(measured.path, "measured-run-")) == runs
    crossing = len(_ids(measured.path, "measured-transfer-"))
    assert 0 < crossing <= len(sends) and crossing == len(executable.last_timeline.transfers)
    assert measured.end >= executable.last_timeline.iteration_time > 0


def test_bad_requests_are_one_line_errors(tmp_path: Path) -> None:
    fn, args = tiny_step("mlp-tiny")
    executable = alpa_ir.parallelize(fn, method=alpa_ir.ShardParallel()).get_executable(*args)
    with pytest.raises(AlpaError, match="a 'timeline' picture needs a pipeline plan"):
        executable.plot("timeline", tmp_path / "t.png")
    with pytest.raises(AlpaError, match="unknown picture 'gantt'; known: timeline, memory"):
        executable.plot("gantt", tmp_path / "t.png")
    with pytest.raises(AlpaError, match=r"t.pdf: the name must end in .png or .svg"):
        executable.plot("devices", tmp_path / "t.pdf")
    assert executable.plot("shardings", tmp_path / "s.png").path.is_file()


def test_alpa_opt_view_draws_the_planned_module(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    source = FILECHECK / "construct-stages.mlir"
    pipeline = "cluster-operators{layers=2},construct-stages{cluster=local-cpu progress=false num-micro-batches=2}"
    code = alpa_opt([str(source), "-p", pipeline, "--view", str(tmp_path / "pics")])
    err = capsys.readouterr().err
    assert code == 0, err
    assert sorted(p.name for p in (tmp_path / "pics").iterdir()) == [
        "devices.png", "memory.png", "shardings.png", "timeline.png",
    ]  # fmt: skip
    assert "alpa-opt: pictures: " in err


def _bench_results() -> list[dict[str, object]]:
    def outcome(method: str, pflops: float, error: str = "") -> dict[str, object]:
        return {"method": method, "pflops": pflops, "error": error}

    return [
        {"model": "gpt3-350m", "gpus": 1, "outcomes": [outcome("alpa", 0.03), outcome("megatron", 0.02)]},
        {"model": "gpt3-1.3b", "gpus": 4, "outcomes": [outcome("alpa", 0.11), outcome("megatron", 0, "no grid point fits")]},
    ]  # fmt: skip


def test_scaling_figure_has_a_line_per_method_and_a_cross_per_failure(tmp_path: Path) -> None:
    from alpa_ir.plots.scaling import draw_scaling

    drawing = draw_scaling(_bench_results(), tmp_path / "f.svg")
    assert drawing.points == {"alpa": [(1, 0.03), (4, 0.11)], "megatron": [(1, 0.02)]}
    assert drawing.failures == {"megatron": [4]}
    assert sorted(_ids(drawing.path, "line-")) == ["line-alpa", "line-megatron"]
    assert _ids(drawing.path, "failed-") == ["failed-megatron-4"]


def test_scaling_figure_from_saved_json(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    import json

    from alpa_ir.plots.scaling import main as scaling

    saved = tmp_path / "r.json"
    saved.write_text(json.dumps(_bench_results()))
    assert scaling([str(saved), str(tmp_path / "f.png")]) == 0
    assert (tmp_path / "f.png").stat().st_size > 1000
    saved.write_text('{"model": 1}')
    assert scaling([str(saved), str(tmp_path / "g.png")]) == 1
    assert "expected the list alpa-bench --json prints" in capsys.readouterr().err


def test_communication_predicted_beside_compiled(tmp_path: Path) -> None:
    """Per stage program and collective kind, the plan's bytes beside XLA's:
    a bar each, and the two agree on this plan."""
    fn, args = tiny_step("mlp-tiny")
    method = alpa_ir.PipeshardParallel(
        num_micro_batches=2,
        layer_option=alpa_ir.AutoLayerOption(layer_num=2),
        stage_option=alpa_ir.UniformStageOption(num_stages=2, submesh_logical_shape=(2, 2)),
    )
    executable = alpa_ir.parallelize(fn, method=method).get_executable(*args)
    drawing = executable.plot("communication", tmp_path / "c.svg")
    assert drawing.rows, "the plan has collectives"
    assert {r.program for r in drawing.rows} <= set(executable.stage_function_names())
    predicted, measured = _ids(drawing.path, "predicted-"), _ids(drawing.path, "measured-")
    assert len(predicted) == len(measured) == len(drawing.rows)
    for row in drawing.rows:
        assert row.measured == pytest.approx(row.predicted, rel=0.1)
    with pytest.raises(AlpaError, match="a 'communication' picture needs a compiled executable"):
        from alpa_ir.plots.views import plot_module

        plot_module(executable.module, "communication", tmp_path / "x.png")
