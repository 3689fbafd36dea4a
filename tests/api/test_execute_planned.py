"""A planned ``ShardParallel`` module run through ``alpa_ir.execute`` is the
program ``parallelize`` runs: the xla backend compiles the plan's explicit
per-device program, so XLA compiles the same collectives for both paths (not
GSPMD's choice from the specs), and the results equal one device."""

from __future__ import annotations

import pytest
from zoo_fixtures import max_abs_diff, reference_outputs, tiny_step

import alpa_ir
from alpa_ir.costs.collective_accounting import hlo_collectives


def _collectives(text: str) -> list[tuple[str, int, object]]:
    return [(c.kind, c.bytes, c.replica_groups) for c in hlo_collectives(text)]


@pytest.mark.parametrize(
    ("model", "method"),
    # GSPMD, given only these plans' specs, compiles fewer collectives (no
    # reduce-scatter): 52 against 60 and 9 against 17
    [
        pytest.param("gpt-tiny", "ShardParallel", marks=pytest.mark.slow),
        ("mlp-tiny", "Zero2Parallel"),
    ],
)
def test_execute_of_the_planned_module_compiles_the_same_collectives(
    model: str, method: str
) -> None:
    fn, args = tiny_step(model)
    mesh = alpa_ir.LogicalDeviceMesh((2, 4))
    # ShardParallel reduce-scatters gradients when asked, as Alpa's
    option = alpa_ir.AutoShardingOption(prefer_reduce_scatter=True)
    parallel = (
        alpa_ir.ShardParallel(mesh, auto_sharding_option=option)
        if method == "ShardParallel"
        else getattr(alpa_ir, method)(mesh)
    )
    executable = alpa_ir.parallelize(fn, method=parallel).get_executable(*args)
    want = _collectives(executable.get_hlo_text(*args))
    assert {kind for kind, _, _ in want} >= {"all-reduce", "reduce-scatter"}

    compiled = alpa_ir.compile_module(executable.module)
    assert _collectives(compiled.hlo_text(*args)) == want
    got = alpa_ir.execute(executable.module, *tiny_step(model)[1])
    assert max_abs_diff(got, reference_outputs(model)) <= 1e-5
