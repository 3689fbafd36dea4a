"""A pipeline's backward programs sum their gradients over the micro-batches
in place, as Alpa's: the running sums are their first parameters, donated
(aliased to the results they return), so no separate add program runs and no
second copy of a stage's gradients is held. The step equals one device under
every schedule kind (1F1B, GPipe, and ZB-H1, whose W programs hold the sums)."""

from __future__ import annotations

import re

import jax
import numpy as np
import pytest
from alpa_mlp_fixtures import alpa_mlp_args as _args
from alpa_mlp_fixtures import alpa_mlp_step as _step

import alpa_ir
from alpa_ir import ManualStageOption, PipeshardParallel
from alpa_ir.testing import HloParser


def _aliased_parameters(hlo: str) -> set[int]:
    """The parameter numbers the module's ``input_output_alias`` donates."""
    header = hlo[: hlo.find("\n")]
    return {int(p) for p in re.findall(r"\}: \((\d+),", header)}


@pytest.mark.parametrize("schedule", ["1f1b", "gpipe", "zb-h1"])
def test_backward_programs_sum_in_place_and_the_step_equals_one_device(schedule: str) -> None:
    params, batch = _args()
    method = PipeshardParallel(
        devices=list(range(4)),
        num_micro_batches=4,
        layer_option="manual",
        stage_option=ManualStageOption([[0], [1]], [(1, 2)] * 2, [(1, 2)] * 2, [{}] * 2),
        pipeline_schedule=schedule,
    )
    parallel = alpa_ir.parallelize(_step, method=method, batch_argnums=(1,))
    executable = parallel.get_executable(params, batch)
    names = executable.stage_function_names()
    texts = executable.get_hlo_text()
    summing = [
        (name, text)
        for name, text in zip(names, texts, strict=True)
        if executable.functions[name].accumulators
    ]
    # each stage's weight gradients (4 per stage) are summed by its backward
    # (or, split, by its W program), never by a program of their own
    assert len(summing) == 2 and all("forward" not in n and "apply" not in n for n, _ in summing)
    for name, text in summing:
        sums = executable.functions[name].accumulators
        assert len(sums) == 4, name
        params_ = HloParser.parse_param_shapes(HloParser.get_param_line(text))
        root = HloParser.parse_root_shapes(HloParser.get_root_line(text))
        # the running sums come first and come back, donated
        assert [params_[j] for j in range(4)] == [root[k] for k in sums], name
        assert set(range(4)) <= _aliased_parameters(text), name
    jax.tree.map(
        lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-5),
        parallel(params, batch),
        jax.jit(_step)(params, batch),
    )
