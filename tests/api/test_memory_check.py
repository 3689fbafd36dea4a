"""A plan that cannot fit in the local devices' memory is refused after
planning and before anything compiles, in one line naming the need and the
budget (GiB per device) and where the budget comes from."""

from __future__ import annotations

import re
from typing import Any

import numpy as np
import pytest
from pipeshard_fixtures import _example, _step

import alpa_ir
import alpa_ir.api.pipeshard_executable as pipeshard_executable
import alpa_ir.backends.spmd as spmd
from alpa_ir.api.pipeshard import AutoStageOption, PipeshardParallel, UniformStageOption
from alpa_ir.errors import PlanError
from alpa_ir.hardware.memory_budget import MEMORY_ENV
from alpa_ir.models import make_train_step
from alpa_ir.models.mlp import MLPConfig

NEED = r"needs (\d+\.\d+) GiB"
BUDGET = r"the budget is 0\.000977 GiB \(1024 KiB\) per device"


@pytest.fixture
def no_compile(monkeypatch: pytest.MonkeyPatch) -> None:
    """Any compile of a stage or a program fails the test."""

    def compile_forbidden(*args: Any, **kwargs: Any) -> Any:
        raise AssertionError("a plan that does not fit must be refused before it compiles")

    monkeypatch.setattr(spmd, "compile_spmd", compile_forbidden)
    monkeypatch.setattr(pipeshard_executable, "compile_module", compile_forbidden)
    monkeypatch.delenv(MEMORY_ENV, raising=False)


def _mlp() -> tuple[Any, tuple[Any, ...]]:
    """An MLP whose Adam state alone takes about 7 MiB per device on 4 devices."""
    config = MLPConfig(input_dim=256, hidden_size=1024, num_layers=4, output_dim=64, batch_size=64)
    return make_train_step(config)


def _one_line(error: pytest.ExceptionInfo[PlanError]) -> str:
    message = str(error.value)
    assert "\n" not in message
    return message


def test_shard_parallel_over_its_budget_is_refused_before_compiling(no_compile: None) -> None:
    fn, args = _mlp()
    method = alpa_ir.ShardParallel(devices=range(4), device_memory="1MiB")
    with pytest.raises(PlanError) as error:
        alpa_ir.parallelize(fn, method=method).get_executable(*args)
    message = _one_line(error)
    assert message.startswith("ShardParallel: the plan on mesh [1, 4] needs ")
    need = re.search(NEED + " per device", message)
    assert need is not None and float(need.group(1)) > 0.005  # the Adam state, ~7 MiB
    assert re.search(BUDGET + r" \(device_memory='1MiB' given by hand\)", message), message
    assert "nothing was compiled" in message


def test_the_environment_variable_is_a_budget_given_by_hand(
    no_compile: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(MEMORY_ENV, "1MiB")
    fn, args = _mlp()
    with pytest.raises(PlanError, match=BUDGET + r" \(ALPA_DEVICE_MEMORY=1MiB\)"):
        alpa_ir.parallelize(fn, method=alpa_ir.DataParallel()).get_executable(*args)


def test_a_plan_within_its_budget_compiles_and_runs() -> None:
    fn, args = _mlp()
    method = alpa_ir.ShardParallel(devices=range(4), device_memory="1GiB")
    _, loss = alpa_ir.parallelize(fn, method=method)(*args)
    assert np.isfinite(float(loss))


def test_uniform_pipeline_over_its_budget_is_refused_before_compiling(no_compile: None) -> None:
    state, batch = _example()
    method = PipeshardParallel(
        num_micro_batches=2,
        stage_option=UniformStageOption(num_stages=3, submesh_logical_shape=(1, 2)),
        devices=range(6),
        device_memory="2KiB",
    )
    with pytest.raises(PlanError) as error:
        alpa_ir.parallelize(_step, method=method, donate_argnums=()).get_executable(state, batch)
    message = _one_line(error)
    # the neediest stage: its state, gradients, 2 micro-batches in flight (1F1B)
    assert re.match(r"PipeshardParallel: stage 1 of the plan, on mesh \[1, 2\], needs ", message)
    assert "2 micro-batches x " in message
    assert "the budget is 0.000002 GiB (2 KiB) per device (device_memory='2KiB' given" in message


def test_automatic_stages_name_where_the_budget_comes_from(no_compile: None) -> None:
    state, batch = _example()
    method = PipeshardParallel(
        num_micro_batches=2, stage_option=AutoStageOption(), device_memory="1KiB"
    )
    with pytest.raises(PlanError) as error:
        alpa_ir.parallelize(_step, method=method, donate_argnums=()).get_executable(state, batch)
    message = _one_line(error)
    assert re.search(
        r"no pipeline plan fits in 0\.000001 GiB \(1 KiB\) per device "
        r"\(device_memory='1KiB' given by hand\); the best one-stage plan on all 8 devices "
        r"needs \d+\.\d+ GiB",
        message,
    ), message
