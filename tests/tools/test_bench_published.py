"""alpa-bench's suites of real pre-training runs: the published rows are the
papers' tables, a published plan is simulated as laid out (interleaved chunks
on their stage meshes), and the suites' options are checked."""

from __future__ import annotations

import dataclasses
import math
from functools import cache
from typing import Any

import pytest

from alpa_ir.api.parallel_config import ParallelConfig
from alpa_ir.tools.alpa_bench import main
from alpa_ir.tools.bench_published import (
    LLAMA3_RUNS,
    MEGATRON_RUNS,
    published_options,
    simulate_published,
)


def test_megatron_rows_are_table1() -> None:
    rows = {r.model: r for r in MEGATRON_RUNS}
    assert len(rows) == 10 and all(r.cluster == "dgx-a100" for r in rows.values())
    one_t = rows["megatron-1t"].config
    assert (one_t.tensor, one_t.pipeline, one_t.data, one_t.virtual_stages) == (8, 64, 6, 2)
    assert one_t.recompute == "full" and one_t.micro_batches(3072) == 512
    assert rows["megatron-530b"].config.describe() == "TP8·PP35x3v·DP9 full recompute"
    assert rows["megatron-1.7b"].config.describe() == "TP1·PP1·DP32 full recompute"
    for r in rows.values():
        assert r.config.num_devices == r.gpus


def test_llama3_rows_are_table4() -> None:
    described = [(r.model, r.gpus, r.config.describe()) for r in LLAMA3_RUNS]
    assert described == [
        ("llama3-405b", 8192, "TP8·PP16x2v·DP64 ZeRO-2 full recompute"),
        ("llama3-405b", 16384, "TP8·PP16x2v·DP128 ZeRO-2 full recompute"),
        ("llama3-405b-128k", 16384, "TP8·CP16·PP16x2v·DP8 ZeRO-2 full recompute"),
    ]
    assert [
        r.config.micro_batches(b) for r, b in zip(LLAMA3_RUNS, (2048, 2048, 128), strict=True)
    ] == [
        32,
        16,
        16,
    ]
    # FlashAttention's memory where no materialized-score plan fits (sequence 131,072)
    assert [r.tiled_attention for r in LLAMA3_RUNS] == [False, False, True]


@cache
def _tiny_ranges() -> tuple[Any, float]:
    """A 4-block tiny Llama at the micro-batch shape (4 micro-batches), a layer
    per block (its own markers)."""
    from alpa_ir.frontend.arguments import micro_batch_args
    from alpa_ir.frontend.jaxpr_import import import_jax
    from alpa_ir.ir.module_utils import main_function
    from alpa_ir.models.registry import get_config
    from alpa_ir.models.train_step import make_train_step, train_step_flops
    from alpa_ir.pipeline.layer_ranges import LayerRanges

    config = dataclasses.replace(get_config("llama-tiny"), num_layers=4, pipeline_markers=True)
    step, args = make_train_step(config, abstract=True)
    micro = micro_batch_args(tuple(args), (1,), 4)
    module = import_jax(step, *micro, batch_argnums=(1,))
    return LayerRanges(main_function(module)), train_step_flops(config)


def _simulate(config: ParallelConfig) -> Any:
    from alpa_ir.costs.analytical_stage_cost import AnalyticalStageCostModel
    from alpa_ir.costs.stage_cost import StageCostOptions
    from alpa_ir.hardware.clusters import dgx_a100

    ranges, flops = _tiny_ranges()
    options = published_options(StageCostOptions(remat=config.recompute == "full"))
    model = AnalyticalStageCostModel(options)
    return simulate_published(ranges, dgx_a100(1), config, model, 4, flops, rows=2)


def test_an_interleaved_plan_is_simulated_as_laid_out() -> None:
    config = ParallelConfig(
        tensor=2, pipeline=2, data=2, virtual_stages=2, recompute="full", micro_batch_size=1
    )
    out = _simulate(config)
    assert not out.error and math.isfinite(out.iteration_time) and out.pflops > 0
    assert out.schedule == "interleaved-1f1b"
    assert [s["layers"] for s in out.stages] == [[0, 0], [1, 1], [2, 2], [3, 3]]
    # chunks 0 and 2 on the first stage's devices, 1 and 3 on the second's
    assert [s["devices"] for s in out.stages] == [[0, 3], [4, 7], [0, 3], [4, 7]]
    assert all(s["logical_mesh"] == [2, 2] for s in out.stages)
    plain = _simulate(dataclasses.replace(config, virtual_stages=1))
    assert plain.schedule == "1f1b" and len(plain.stages) == 2
    assert plain.iteration_time != out.iteration_time


def test_tensor_parallel_degree_changes_the_stage_mesh() -> None:
    out = _simulate(ParallelConfig(tensor=4, pipeline=2, data=1, micro_batch_size=1))
    assert [s["logical_mesh"] for s in out.stages] == [[1, 4], [1, 4]]
    with pytest.raises(Exception, match="but there are 8 devices"):
        _simulate(ParallelConfig(tensor=4, pipeline=1, data=1))


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--suite=megatron", "--gpus=64"], "--gpus: the rows of --suite megatron run on"),
        (["--suite=llama3", "--models=gpt3-39b"], "--models 'gpt3-39b' is not a model of"),
        (["--suite=megatron", "--cluster=dgx-h100"], "--cluster: the rows of --suite megatron"),
    ],
)
def test_published_suite_options(
    argv: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit):
        main(argv)
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1


@pytest.mark.parametrize(
    ("argv", "schedule"),
    [
        (["--suite=llama3"], "auto"),
        (["--suite=llama3", "--schedule=1f1b"], "1f1b"),
        (["--suite=megatron"], "1f1b"),
    ],
)
def test_the_llama3_suite_chooses_the_schedule_by_default(
    argv: list[str], schedule: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """--schedule's default is the suite's: auto for llama3, 1F1B elsewhere."""
    import alpa_ir.tools.alpa_bench as alpa_bench

    seen: list[str] = []
    monkeypatch.setattr(
        alpa_bench, "_published_main", lambda parser, args: seen.append(args.schedule) or 0
    )
    assert alpa_bench.main(argv) == 0
    assert seen == [schedule]
