"""Shared helpers for tests over the model zoo: cached train steps, their
imported modules, hand-written sharding rules, tree comparison, and a
parallel step stepped beside one device's."""

from __future__ import annotations

import functools
from typing import Any

import jax
import numpy as np

import alpa_ir
from alpa_ir.dialects.sharding import ShardingSpec
from alpa_ir.models import make_train_step
from alpa_ir.models.megatron import megatron_spec

TINY_MODELS = ("mlp-tiny", "gpt-tiny", "moe-tiny", "wresnet-tiny", "bert-tiny", "llama-tiny")


@functools.cache
def _tiny_step(name: str) -> tuple[Any, tuple[Any, ...]]:
    return make_train_step(name)


def fresh(tree: Any) -> Any:
    """A copy of ``tree``'s arrays: a step donates its state (its buffers are
    consumed), so a test that reuses shared arguments hands each call its own."""
    return jax.tree.map(lambda x: x.copy() if isinstance(x, jax.Array) else x, tree)


def tiny_step(name: str) -> tuple[Any, tuple[Any, ...]]:
    """The zoo's tiny train step and fresh copies of its example arguments."""
    fn, args = _tiny_step(name)
    return fn, fresh(args)


@functools.cache
def tiny_module_text(name: str) -> str:
    fn, args = _tiny_step(name)
    return str(alpa_ir.import_jax(fn, *args))


@functools.cache
def reference_outputs(name: str) -> Any:
    fn, args = tiny_step(name)  # fresh: the step donates its state
    return jax.jit(fn)(*args)


def max_abs_diff(got: Any, want: Any) -> float:
    assert jax.tree.structure(got) == jax.tree.structure(want)
    diffs = [
        float(np.max(np.abs(np.asarray(a, np.float64) - np.asarray(b, np.float64)), initial=0.0))
        for a, b in zip(jax.tree.leaves(got), jax.tree.leaves(want), strict=True)
    ]
    return max(diffs, default=0.0)


def data_parallel_rule(name: str, shape: tuple[int, ...]) -> ShardingSpec | None:
    """Batch arrays split along their first dimension over mesh axis 0."""
    if name.startswith("batch") and shape and shape[0] % 8 == 0:
        return ShardingSpec(((0,),) + ((),) * (len(shape) - 1))
    return None


def megatron_rule(name: str, shape: tuple[int, ...]) -> ShardingSpec | None:
    """Megatron-style on a (2, 4) mesh (``alpa_ir.models.megatron``)."""
    return megatron_spec(name, shape, (2, 4))


def same_steps(
    parallel: Any,
    step: Any,
    state: Any,
    batch: Any,
    steps: int,
    rtol: float = 1e-5,
    state_tol: float | None = None,
) -> tuple[Any, Any]:
    """``steps`` steps of ``parallel`` and of ``step`` on one device, side by
    side: the losses equal (``rtol``) at each and, with ``state_tol``, the
    states' largest difference at most that; both final states."""
    ours, theirs = state, state
    for _ in range(steps):
        ours, our_loss = parallel(ours, batch)
        theirs, loss = jax.jit(step)(theirs, batch)
        np.testing.assert_allclose(our_loss, loss, rtol=rtol)
        if state_tol is not None:
            assert max_abs_diff(ours, theirs) <= state_tol
    return ours, theirs


def check_tiny_steps(run: Any, name: str, steps: int, tol: float = 1e-5) -> None:
    """``run`` (a parallel step of the zoo's tiny ``name``) over ``steps``
    steps equals one device's at each, each step on the state it returned."""
    fn, (state, batch) = tiny_step(name)
    one_device, theirs = jax.jit(fn), state
    for _ in range(steps):
        want = one_device(theirs, batch)  # before ``run``, which may donate the state
        got = run(state, batch)
        assert max_abs_diff(got, want) <= tol
        state, theirs = got[0], want[0]
