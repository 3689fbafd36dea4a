"""Every tiny zoo train step: import -> print -> parse -> print is exact, the
parsed module runs to the JAX step's numbers on one device, and with
hand-written data-parallel and Megatron-style specs on 8 devices."""

from __future__ import annotations

import jax
import pytest
from zoo_fixtures import (
    TINY_MODELS,
    data_parallel_rule,
    max_abs_diff,
    megatron_rule,
    reference_outputs,
    tiny_module_text,
    tiny_step,
)

import alpa_ir
from alpa_ir.api.sharding_annotation import annotate_shardings
from alpa_ir.hardware.device_mesh import LogicalDeviceMesh


@pytest.mark.parametrize("name", TINY_MODELS)
def test_roundtrip_and_single_device_execution(name):
    text = tiny_module_text(name)
    parsed = alpa_ir.parse_module(text)
    assert str(parsed) == text
    _fn, args = tiny_step(name)
    got = alpa_ir.execute(parsed, *args)
    assert jax.tree.structure(got) == jax.tree.structure(reference_outputs(name))
    assert max_abs_diff(got, reference_outputs(name)) <= 1e-6


@pytest.mark.parametrize("name", TINY_MODELS)
@pytest.mark.parametrize(
    ("mesh_shape", "rule"),
    [((8,), data_parallel_rule), ((2, 4), megatron_rule)],
    ids=["data-parallel", "megatron"],
)
def test_hand_sharded_execution_on_8_devices(name, mesh_shape, rule):
    module = alpa_ir.parse_module(tiny_module_text(name))
    annotate_shardings(module, LogicalDeviceMesh(mesh_shape), rule)
    text = str(module)
    assert "#sharding.spec<[S" in text
    assert str(alpa_ir.parse_module(text)) == text
    _fn, args = tiny_step(name)
    exe = alpa_ir.compile_module(module)
    assert max_abs_diff(exe(*args), reference_outputs(name)) <= 1e-4
    assert "all-reduce" in exe.hlo_text(*args)
