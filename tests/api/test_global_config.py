"""Alpa's ``global_config``: its fields that mean something here reach a step
through the frozen options ``parallelize`` reads once; the others warn when
set to another value than Alpa's default; a name Alpa lacks is an error."""

from __future__ import annotations

import warnings
from collections.abc import Iterator

import pytest
from pipeshard_fixtures import _example, _step

import alpa_ir
import alpa_ir.api.global_config as config_module
import alpa_ir.api.parallel as parallel_module
from alpa_ir.api.global_config import GlobalConfig, GlobalOptions, SessionRandom
from alpa_ir.errors import AlpaError


@pytest.fixture
def config(monkeypatch: pytest.MonkeyPatch) -> Iterator[GlobalConfig]:
    """A fresh ``alpa_ir.global_config`` for the test (the module's one is left as it was)."""
    fresh = GlobalConfig()
    monkeypatch.setattr(config_module, "global_config", fresh)
    monkeypatch.setattr(parallel_module, "global_config", fresh)
    assert alpa_ir.global_config is fresh
    yield fresh


def test_fields_with_meaning_are_read_once_at_parallelize(config: GlobalConfig) -> None:
    config.collect_trace = True
    config.print_compilation_time = True
    step = alpa_ir.parallelize(_step, method=alpa_ir.ShardParallel())
    config.collect_trace = False  # too late for that step
    assert step.global_options == GlobalOptions(collect_trace=True, print_compilation_time=True)
    assert alpa_ir.parallelize(_step).global_options.collect_trace is False
    assert config.options() == GlobalOptions(print_compilation_time=True)


def test_collect_trace_and_local_allgather_reach_a_pipeline(
    config: GlobalConfig, capsys: pytest.CaptureFixture[str]
) -> None:
    state, batch = _example()
    method = alpa_ir.PipeshardParallel(
        num_micro_batches=2, layer_option="manual", devices=list(range(6))
    )
    plain = alpa_ir.parallelize(_step, method=method, donate_argnums=())
    plain_executable = plain.get_executable(state, batch)
    assert not plain_executable.record_timeline
    assert "local-all-gather=false" not in plain_executable.pass_pipeline
    assert "compilation time" not in capsys.readouterr().out

    config.collect_trace = True
    config.use_local_allgather = False
    config.print_compilation_time = True
    traced = alpa_ir.parallelize(_step, method=method, donate_argnums=())
    executable = traced.get_executable(state, batch)
    assert executable.record_timeline
    assert "cross-mesh-resharding{local-all-gather=false}" in executable.pass_pipeline
    assert "compilation time of _step:" in capsys.readouterr().out
    traced(state, batch)
    assert executable.last_timeline is not None  # the step recorded its timeline


def test_fields_without_meaning_warn_in_one_line(config: GlobalConfig) -> None:
    assert config.xla_gpu_autotune_level == 4  # Alpa's defaults read back
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        config.xla_gpu_autotune_level = 4  # Alpa's default: nothing to say
    with pytest.warns(
        UserWarning, match="global_config.xla_gpu_autotune_level = 0 has no meaning"
    ) as caught:
        config.xla_gpu_autotune_level = 0
    assert "\n" not in str(caught[0].message)
    assert config.xla_gpu_autotune_level == 0
    with pytest.raises(AlpaError, match="global_config has no field 'no_such_field'"):
        config.no_such_field = 1
    with pytest.raises(AttributeError):
        _ = config.no_such_field
    with pytest.raises(AlpaError, match="collect_trace must be a bool"):
        config.collect_trace = "yes"


def test_seeded_calls_from_threads_each_get_a_number_of_their_own(config: GlobalConfig) -> None:
    import sys
    import threading

    config.seed_draws(7)
    numbers: list[int] = []

    def call_many() -> None:
        numbers.extend([config.next_call().calls for _ in range(2000)])

    interval = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)  # threads switch often, so an unlocked count would repeat
    try:
        threads = [threading.Thread(target=call_many) for _ in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    finally:
        sys.setswitchinterval(interval)
    assert sorted(numbers) == list(range(16000))
    assert config.session_random() == SessionRandom(7, 16000)
