"""Acceptance gaps of the foundation: ``merge-trivial-ops`` groups by BFS depth
and keeps a zoo step's semantics; a JAX function using a primitive the lax
dialect cannot carry is one clear error naming the primitive and the user's
source line, from the library and from ``alpa-opt --import``."""

from __future__ import annotations

import sys
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from zoo_fixtures import max_abs_diff, reference_outputs, tiny_step

import alpa_ir
from alpa_ir.dialects.lax import ConstantOp, LaxOp
from alpa_ir.errors import UnsupportedPrimitiveError
from alpa_ir.ir.module_utils import main_function
from alpa_ir.passmanager.pass_manager import PassManager
from alpa_ir.plugins.registry import default_registry
from alpa_ir.tools.alpa_opt import main

GROUP = "sharding.group"


def _merge(module) -> None:
    PassManager(default_registry(), "builtin.module(merge-trivial-ops)").run(module)


def _groups(module) -> dict[str, list[int]]:
    """Primitive name -> group ids of its ops in @main, in program order."""
    found: dict[str, list[int]] = {}
    for op in main_function(module).body.block.ops:
        if isinstance(op, LaxOp) and GROUP in op.attributes:
            found.setdefault(op.primitive_name, []).append(op.attributes[GROUP].value.data)
    return found


def test_merge_joins_the_deepest_operand_group() -> None:
    def f(x, w1, w2):
        a = jnp.tanh(x @ w1)  # dot: group 0 (depth 1), tanh joins it (depth 2)
        c = x @ w2  # dot: group 1 (depth 1)
        d = a + c  # deepest operand is the tanh: group 0
        e = jnp.exp(x)  # trivial, but only inputs as operands: a group of its own
        return d.sum() + e.sum()

    x, w = np.ones((4, 8), np.float32), np.ones((8, 8), np.float32)
    module = alpa_ir.import_jax(f, x, w, w)
    _merge(module)
    groups = _groups(module)
    dot0, dot1 = groups["dot_general"]
    assert dot0 != dot1
    assert groups["tanh"] == [dot0]
    add_groups = groups["add"]
    assert add_groups[0] == dot0  # a + c joins the deeper tanh, not the second dot
    [exp_group] = groups["exp"]
    assert exp_group not in (dot0, dot1)
    main_fn = main_function(module)
    assert main_fn.attributes["sharding.num_groups"].value.data == 3
    for op in main_fn.body.block.ops:  # every op but constants and the return is grouped
        grouped = isinstance(op, LaxOp) and not isinstance(op, ConstantOp)
        assert (GROUP in op.attributes) == grouped
    text = str(module)
    assert str(alpa_ir.parse_module(text)) == text
    np.testing.assert_allclose(
        alpa_ir.execute(alpa_ir.parse_module(text), x, w, w), f(x, w, w), rtol=1e-6
    )


def test_merged_zoo_step_executes_to_the_same_results() -> None:
    fn, args = tiny_step("mlp-tiny")
    module = alpa_ir.import_jax(fn, *args)
    nodes = sum(
        1 for op in main_function(module).body.block.ops if isinstance(op, LaxOp | ConstantOp)
    )
    _merge(module)
    num_groups = main_function(module).attributes["sharding.num_groups"].value.data
    assert 0 < num_groups < nodes / 2
    text = str(module)
    parsed = alpa_ir.parse_module(text)
    assert str(parsed) == text
    got = alpa_ir.execute(parsed, *args)
    assert jax.tree.structure(got) == jax.tree.structure(reference_outputs("mlp-tiny"))
    assert max_abs_diff(got, reference_outputs("mlp-tiny")) <= 1e-6


CALLBACK_SOURCE = """\
import jax
import jax.numpy as jnp
import numpy as np


def step(x):
    y = jax.pure_callback(np.sin, jax.ShapeDtypeStruct(x.shape, x.dtype), x)
    return (y * 2.0).sum()


def factory():
    return step, (jnp.ones((4,), jnp.float32),)
"""
CALLBACK_LINE = 7


@pytest.fixture
def callback_module(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    name = "alpa_acceptance_callback_step"
    (tmp_path / f"{name}.py").write_text(CALLBACK_SOURCE)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, name, raising=False)
    yield name, str(tmp_path / f"{name}.py")
    sys.modules.pop(name, None)


def test_unsupported_primitive_names_primitive_and_user_line(callback_module) -> None:
    name, path = callback_module
    module = __import__(name)
    fn, args = module.factory()
    with pytest.raises(UnsupportedPrimitiveError) as info:
        alpa_ir.import_jax(fn, *args)
    message = str(info.value)
    assert message.startswith(f"{path}:{CALLBACK_LINE}: primitive 'pure_callback' ")
    assert "not supported by the lax dialect" in message


def test_alpa_opt_import_of_unsupported_primitive_is_one_line(
    callback_module, capsys: pytest.CaptureFixture[str]
) -> None:
    name, path = callback_module
    code = main(["--import", f"{name}:factory"])
    out, err = capsys.readouterr()
    assert (code, out) == (1, "")
    assert err.startswith(
        f"alpa-opt: error: {path}:{CALLBACK_LINE}: primitive 'pure_callback' is not supported"
    )
    assert err.count("\n") == 1 and "Traceback" not in err
