"""A schedule an installed plugin adds runs through PipeshardParallel: the
tiny GPT on 2 stages equals one device under it, and the plan records it."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from pipeshard_fixtures import tiny_gpt_method
from zoo_fixtures import same_steps, tiny_step

import alpa_ir
from alpa_ir.api.pipeshard import AutoStageOption, PipeshardParallel
from alpa_ir.dialects.pipeline import PlanOp, ProgramOp, RunOp
from alpa_ir.ir.module_utils import top_level_ops
from alpa_ir.plugins.registry import default_registry

FIXTURES = Path(__file__).resolve().parents[1] / "plugins_fixture"


@pytest.fixture
def installed(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """The schedule plugin as pip would install it (its entry point's metadata)."""
    dist = tmp_path / "alpa_schedule_plugin-0.1.0.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text(
        "Metadata-Version: 2.1\nName: alpa-schedule-plugin\nVersion: 0.1.0\n"
    )
    (dist / "entry_points.txt").write_text("[alpa_ir]\nschedule = alpa_schedule_plugin\n")
    monkeypatch.syspath_prepend(str(FIXTURES))
    monkeypatch.syspath_prepend(str(tmp_path))
    default_registry.cache_clear()
    yield
    default_registry.cache_clear()


def test_a_plugins_schedule_runs_and_equals_one_device(installed: None) -> None:
    fn, (state, batch) = tiny_step("gpt-tiny")
    parallel = alpa_ir.parallelize(fn, method=tiny_gpt_method("w-last", 2, 4), donate_argnums=())
    same_steps(parallel, fn, state, batch, 3, state_tol=1e-5)
    executable = parallel.get_executable(state, batch)
    (plan,) = top_level_ops(executable.module, PlanOp)
    assert isinstance(plan, PlanOp) and plan.schedule.data == "w-last"
    assert "schedule=w-last" in executable.pass_pipeline
    # each mesh runs its W's after its last forward and B, as the plugin orders them
    # (the last stage computes its B with its forward)
    for program in top_level_ops(executable.module, ProgramOp):
        runs = [op.function.root_reference.data for op in program.body.block.ops
                if isinstance(op, RunOp)]  # fmt: skip
        weights = [i for i, f in enumerate(runs) if f.endswith("_backward_weight")]
        inputs = [i for i, f in enumerate(runs) if f.endswith("_backward")]
        assert len(weights) == 4 and min(weights) > max(inputs, default=-1)
        assert min(weights) > max(i for i, f in enumerate(runs) if f.endswith("_forward"))


def test_a_plugins_schedule_needs_given_stages(installed: None) -> None:
    with pytest.raises(alpa_ir.AlpaError) as info:
        PipeshardParallel(num_micro_batches=4, stage_option=AutoStageOption(),
                          pipeline_schedule="w-last")  # fmt: skip
    assert str(info.value).startswith(
        "pipeline_schedule 'w-last' is a plugin's: it runs on given stages"
    )


def test_an_unknown_schedule_lists_the_plugins_too(installed: None) -> None:
    with pytest.raises(alpa_ir.AlpaError) as info:
        PipeshardParallel(num_micro_batches=4, pipeline_schedule="w-first")
    assert str(info.value) == (
        "pipeline_schedule must be one of 'auto', '1f1b', 'gpipe', 'zb-h1', "
        "'interleaved-1f1b', 'zb-v', 'inference', 'w-last', got 'w-first'"
    )
