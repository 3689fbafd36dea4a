"""``tools/bench_real_models.py``: the core on a tiny Hugging Face GPT-2 at 8 GPUs
(plan, baselines, timings), the Markdown report, and bad command lines."""

from __future__ import annotations

from typing import Any

import pytest

from alpa_ir.tools.bench_real_models import (
    METHODS,
    ModelSpec,
    PlanSettings,
    UserStep,
    data_parallel_micro_batches,
    gpt2_step,
    main,
    markdown,
    plan_model,
)


def tiny_gpt2(abstract: bool) -> UserStep:
    from transformers import GPT2Config

    config = GPT2Config(vocab_size=64, n_positions=16, n_embd=16, n_layer=2, n_head=2)
    return gpt2_step(config, abstract, seq=16)


@pytest.fixture(scope="module")
def planned() -> dict[str, Any]:
    from alpa_ir.tools.bench_suite import bench_cluster

    spec = ModelSpec("gpt2-tiny", "GPT-2, 2 layers of 16", tiny_gpt2, layers=3)
    settings = PlanSettings(num_micro_batches=4, workers=1, time_limit=10)
    return plan_model(spec, bench_cluster("alpa-testbed", 8), settings)


@pytest.mark.slow
def test_tiny_gpt2_has_a_plan_and_every_baseline(planned: dict[str, Any]) -> None:
    assert planned["model"] == "gpt2-tiny" and planned["gpus"] == 8
    assert planned["layers"] == 3 and planned["num_micro_batches"] == 4
    assert planned["parameters"] > 0 and planned["model_flops"] > 0
    assert planned["import_time"] > 0
    times = planned["compile_time"]
    assert set(times) == {"clustering", "costing", "dp", "other", "total"}
    assert times["total"] == pytest.approx(
        times["clustering"] + times["costing"] + times["dp"] + times["other"]
    )
    assert planned["peak_rss_gib"]["planner"] > 0
    outcomes = {o["method"]: o for o in planned["outcomes"]}
    assert set(outcomes) == set(METHODS)
    alpa = outcomes["alpa"]
    assert not alpa["error"] and alpa["pflops"] > 0
    covered = [k for s in alpa["stages"] for k in range(s["layers"][0], s["layers"][1] + 1)]
    assert covered == [0, 1, 2]
    assert sum(s["submesh"][0] * s["submesh"][1] for s in alpa["stages"]) <= 8
    for method in ("data-parallel", "zero-2", "zero-3"):
        (stage,) = outcomes[method]["stages"]
        assert stage["logical_mesh"] == [8, 1] and not outcomes[method]["error"]
    # ZeRO-2 partitions the gradients and optimizer state data parallelism replicates
    assert outcomes["zero-2"]["peak_memory_gib"] < outcomes["data-parallel"]["peak_memory_gib"]


@pytest.mark.slow
def test_report_has_a_row_per_table(planned: dict[str, Any]) -> None:
    report = markdown([planned, {"model": "llama-1b", "gpus": 64, "error": "boom"}], [], "test")
    assert report.count("| gpt2-tiny | 8 |") == 2  # the planning and the PFLOPS tables
    assert "- llama-1b on 64 GPUs: planning failed: boom" in report


def test_data_parallel_needs_whole_rows_per_device() -> None:
    assert data_parallel_micro_batches(8, 8, 4) == 1
    assert data_parallel_micro_batches(64, 8, 4) == 4
    assert data_parallel_micro_batches(8, 64, 4) == 0


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--models", "gpt5"], "--models: unknown model 'gpt5'; known: gpt2, gpt2-medium"),
        (["--gpus", "0"], "--gpus must be a positive integer"),
        (["--micro-batches", "3"], "--micro-batches must divide the global batch 8"),
    ],
)
def test_bad_command_line_is_one_line(
    argv: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exit_info:
        main(argv)
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Traceback" not in err
    assert err.startswith("bench-real-models: error: ") and message in err
