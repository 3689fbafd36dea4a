"""A planned step replays in alpa-opt: its input module run through its pass
pipeline prints exactly the executable's module, and that module, run on the
xla backend, equals one device."""

from __future__ import annotations

from pathlib import Path

import pytest
from zoo_fixtures import max_abs_diff, reference_outputs, tiny_step

import alpa_ir
from alpa_ir.ir.text import parse_module, print_module
from alpa_ir.tools.alpa_opt import main as alpa_opt


@pytest.mark.parametrize("method", ["ShardParallel", "Zero3Parallel", "DataParallel"])
def test_alpa_opt_replays_the_plan_exactly(
    method: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    fn, args = tiny_step("mlp-tiny")
    mesh = alpa_ir.LogicalDeviceMesh((2, 4))
    executable = alpa_ir.parallelize(fn, method=getattr(alpa_ir, method)(mesh)).get_executable(
        *args
    )
    _assert_replays(executable, args, tmp_path, capsys)


def _assert_replays(
    executable: object, args: tuple, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """alpa-opt prints the executable's module from its input and pipeline, and
    that module run on the xla backend equals one device."""
    source = tmp_path / "input.mlir"
    source.write_text(print_module(executable.input_module))  # type: ignore[attr-defined]
    pipeline = executable.pass_pipeline  # type: ignore[attr-defined]
    assert alpa_opt([str(source), f"--pass-pipeline={pipeline}"]) == 0
    replayed = capsys.readouterr().out
    assert replayed == print_module(executable.module)  # type: ignore[attr-defined]
    got = alpa_ir.execute(parse_module(replayed), *args)
    assert max_abs_diff(got, reference_outputs("mlp-tiny")) <= 1e-5


def test_a_named_pipeline_is_the_methods_pipeline(capsys: pytest.CaptureFixture[str]) -> None:
    """`data-parallel` stands for exactly DataParallel()'s passes, and may be
    combined with other passes."""
    want = alpa_ir.DataParallel().auto_sharding_option.pipeline(1)
    assert alpa_opt(["-p", want, "--print-pipeline"]) == 0
    canonical = capsys.readouterr().out
    assert alpa_opt(["-p", "data-parallel", "--print-pipeline"]) == 0
    assert capsys.readouterr().out == canonical
    assert alpa_opt(["-p", "zero3-parallel,cluster-operators", "--print-pipeline"]) == 0
    out = capsys.readouterr().out
    assert "reduce-scatter-rewrite{mode=zero3}" in out and out.rstrip().endswith(
        "cluster-operators{layers=2 delta=0.5 relax-delta=true fit-delta=false "
        "replace-markers=false})"
    )
    assert alpa_opt(["-p", "data-parallel{solver=highs}", "--print-pipeline"]) == 1
    err = capsys.readouterr().err
    assert "named pipeline 'data-parallel' takes no options" in err
    assert alpa_opt(["--list-passes"]) == 0
    listing = capsys.readouterr().out
    assert "Named pipelines (5):" in listing and "  zero2-parallel\n" in listing


PIPESHARD_STAGE_OPTIONS = {
    "uniform": alpa_ir.UniformStageOption(num_stages=2),
    "manual": alpa_ir.ManualStageOption([[0], [1]], [(1, 1), (1, 3)]),
    "auto": alpa_ir.AutoStageOption(),
}


@pytest.mark.parametrize("stage", sorted(PIPESHARD_STAGE_OPTIONS))
def test_alpa_opt_replays_a_pipeshard_plan_exactly(
    stage: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Layers, stages (outline-stages or construct-stages), per-stage sharding
    (shard-stages), transfers and instruction lists: every step is a pass."""
    fn, args = tiny_step("mlp-tiny")
    method = alpa_ir.PipeshardParallel(
        devices=range(4),
        num_micro_batches=2,
        layer_option=alpa_ir.AutoLayerOption(layer_num=2),
        stage_option=PIPESHARD_STAGE_OPTIONS[stage],
    )
    executable = alpa_ir.parallelize(fn, method=method).get_executable(*args)
    pipeline = executable.pass_pipeline
    assert ("construct-stages{" if stage == "auto" else "outline-stages{") in pipeline
    assert "shard-stages{" in pipeline and "emit-instructions{" in pipeline
    _assert_replays(executable, args, tmp_path, capsys)


@pytest.mark.parametrize("schedule", ["zb-h1", "interleaved-1f1b", "zb-v"])
def test_alpa_opt_replays_a_zero_bubble_or_interleaved_plan_exactly(
    schedule: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The split backward (split-backward), the chunks per mesh (outline-stages'
    mesh-of) and the schedule's task order (emit-instructions) replay too."""
    fn, args = tiny_step("mlp-tiny")
    chunks = 1 if schedule == "zb-h1" else 2
    method = alpa_ir.PipeshardParallel(
        devices=range(4),
        num_micro_batches=2,
        layer_option=alpa_ir.AutoLayerOption(layer_num=2 * chunks),
        stage_option=alpa_ir.UniformStageOption(num_stages=2),
        pipeline_schedule=schedule,  # type: ignore[arg-type]
    )
    executable = alpa_ir.parallelize(fn, method=method).get_executable(*args)
    pipeline = executable.pass_pipeline
    assert f"schedule={schedule}" in pipeline
    assert ("split-backward" in pipeline) == (schedule != "interleaved-1f1b")
    _assert_replays(executable, args, tmp_path, capsys)
