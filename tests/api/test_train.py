"""``alpa_ir.train`` on the local devices: checkpoints every few steps, a
fresh call resumes from the directory (no step lost or run twice), and
one-line errors for bad arguments. The run that loses a Ray host is
tests/api/test_train_elastic.py."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from zoo_fixtures import max_abs_diff, tiny_step

import alpa_ir
from alpa_ir.api.checkpoint import read_manifest
from alpa_ir.api.train import RecoveryOption
from alpa_ir.errors import AlpaError


def scaled_batches(batch: Any) -> Any:
    """Step i's batch: the example batch scaled by 1 + i / 10 (every step differs)."""
    return lambda i: jax.tree.map(lambda x: x * (1.0 + 0.1 * i), batch)


def jit_steps(fn: Any, state: Any, batch_fn: Any, n: int) -> tuple[Any, list[float]]:
    """n uninterrupted steps of ``jax.jit`` on one device."""
    run, losses = jax.jit(fn), []
    for i in range(n):
        state, loss = run(state, batch_fn(i))
        losses.append(float(loss))
    return state, losses


def test_a_fresh_call_resumes_from_the_checkpoint_directory(tmp_path: Path) -> None:
    """4 steps (checkpoints after 3 and 4), then a fresh call for 8 runs
    steps 4-7 only; the state equals 8 steps of jax.jit; a third call finds
    the run complete and runs nothing."""
    fn, (state, batch) = tiny_step("mlp-tiny")
    batch_fn = scaled_batches(batch)
    want, want_losses = jit_steps(fn, state, batch_fn, 8)
    calls: list[int] = []

    def counted(i: int) -> Any:
        calls.append(i)
        return batch_fn(i)

    ckpt = tmp_path / "ckpt"
    method = alpa_ir.ShardParallel()
    _, losses = alpa_ir.train(
        fn, state, counted, method=method, num_steps=4, checkpoint_dir=ckpt, checkpoint_every=3
    )
    assert calls == [0, 1, 2, 3] and read_manifest(ckpt)["step"] == 4
    np.testing.assert_allclose(losses, want_losses[:4], rtol=1e-4)

    calls.clear()
    final, losses = alpa_ir.train(
        fn, state, counted, method=method, num_steps=8, checkpoint_dir=ckpt, checkpoint_every=3
    )
    assert calls == [4, 5, 6, 7]  # resumed at 4: nothing replayed, nothing skipped
    assert read_manifest(ckpt)["step"] == 8
    assert all(math.isnan(x) for x in losses[:4])
    np.testing.assert_allclose(losses[4:], want_losses[4:], rtol=1e-4)
    assert max_abs_diff(final, want) <= 1e-4

    calls.clear()
    again, losses = alpa_ir.train(
        fn, state, counted, method=method, num_steps=8, checkpoint_dir=ckpt, checkpoint_every=3
    )
    assert calls == [] and all(math.isnan(x) for x in losses)
    assert max_abs_diff(again, final) == 0


# --------------------------------------------------------------------------- bad input


def _tiny(state: jax.Array, batch: jax.Array) -> tuple[jax.Array, jax.Array]:
    return state + batch, jnp.sum(batch)


STATE = jnp.zeros((8, 4))


def _train(tmp_path: Path, **overrides: Any) -> Any:
    kwargs: dict[str, Any] = {
        "method": alpa_ir.ShardParallel(),
        "num_steps": 3,
        "checkpoint_dir": tmp_path / "ckpt",
        "checkpoint_every": 1,
    }
    kwargs |= overrides
    batch_fn = kwargs.pop("batch_fn", lambda i: jnp.full((8, 4), float(i)))
    step = kwargs.pop("step", _tiny)
    return alpa_ir.train(step, STATE, batch_fn, **kwargs)


@pytest.mark.bad_input
@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"num_steps": 0}, r"^alpa_ir.train: num_steps must be >= 1, got 0$"),
        ({"num_steps": -2}, r"^alpa_ir.train: num_steps must be >= 1, got -2$"),
        ({"num_steps": 2.5}, r"^alpa_ir.train: num_steps must be an int, got 2.5$"),
        ({"num_steps": True}, r"^alpa_ir.train: num_steps must be an int, got True$"),
        ({"checkpoint_every": 0}, r"^alpa_ir.train: checkpoint_every must be >= 1, got 0$"),
        ({"checkpoint_every": -1}, r"^alpa_ir.train: checkpoint_every must be >= 1, got -1$"),
        ({"method": "shard"}, r"^alpa_ir.train: method must be a parallel method .* got 'shard'$"),
        ({"batch_fn": [1, 2]}, r"^alpa_ir.train: batch_fn must be callable"),
        ({"step": None}, r"^alpa_ir.train: step must be callable, got None$"),
        ({"recovery": 3}, r"^alpa_ir.train: recovery must be a RecoveryOption, got 3$"),
    ],
)
def test_bad_arguments_are_one_line_errors(
    tmp_path: Path, overrides: dict[str, Any], message: str
) -> None:
    with pytest.raises(AlpaError, match=message) as info:
        _train(tmp_path, **overrides)
    assert "\n" not in str(info.value)
    assert not (tmp_path / "ckpt").exists()  # refused before anything ran


@pytest.mark.bad_input
def test_a_batch_fn_that_raises_names_the_step(tmp_path: Path) -> None:
    def batch_fn(i: int) -> jax.Array:
        if i == 2:
            raise ValueError("shard 2 of the data set is missing\nmore detail")
        return jnp.full((8, 4), float(i))

    with pytest.raises(
        AlpaError,
        match=r"^alpa_ir.train: batch_fn\(2\) raised ValueError: shard 2 of the data set is "
        r"missing$",
    ):
        _train(tmp_path, batch_fn=batch_fn)
    assert read_manifest(tmp_path / "ckpt")["step"] == 2  # the steps before it are kept


@pytest.mark.bad_input
def test_a_step_that_returns_no_loss_names_the_step(tmp_path: Path) -> None:
    with pytest.raises(
        AlpaError, match=r"^alpa_ir.train: step 0: step must return \(state, loss\), got \w+$"
    ):
        _train(tmp_path, step=lambda s, b: s + b)


@pytest.mark.bad_input
def test_a_checkpoint_past_num_steps_is_refused(tmp_path: Path) -> None:
    alpa_ir.save_checkpoint(tmp_path / "ckpt", STATE, step=5)
    with pytest.raises(
        AlpaError, match=r"^alpa_ir.train: checkpoint .*ckpt is at step 5, past num_steps=3$"
    ):
        _train(tmp_path)


@pytest.mark.bad_input
def test_a_checkpoint_dir_that_is_a_file_is_refused(tmp_path: Path) -> None:
    (tmp_path / "ckpt").write_text("not a checkpoint")
    with pytest.raises(AlpaError, match=r"^alpa_ir.train: checkpoint_dir .*ckpt exists and is not"):
        _train(tmp_path)


@pytest.mark.bad_input
@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"max_recoveries": -1}, "max_recoveries must be >= 0, got -1"),
        ({"max_recoveries": 1.5}, "max_recoveries must be an int, got 1.5"),
        ({"lost_host_timeout_s": -1.0}, "lost_host_timeout_s must be a number >= 0, got -1.0"),
        ({"lost_host_timeout_s": "10"}, "lost_host_timeout_s must be a number >= 0, got '10'"),
    ],
)
def test_bad_recovery_options_are_one_line_errors(kwargs: dict[str, Any], message: str) -> None:
    with pytest.raises(AlpaError, match=rf"^RecoveryOption: {message}$"):
        RecoveryOption(**kwargs)


def test_a_directory_without_a_committed_step_starts_from_step_0(tmp_path: Path) -> None:
    """An empty folder, or one holding only a save killed before its commit
    (orbax's temporary step folder), has nothing to resume from."""
    debris = tmp_path / "ckpt" / "2.orbax-checkpoint-tmp-1700000000"
    debris.mkdir(parents=True)
    calls: list[int] = []

    def batch_fn(i: int) -> jax.Array:
        calls.append(i)
        return jnp.full((8, 4), float(i))

    final, losses = _train(tmp_path, batch_fn=batch_fn)
    assert calls == [0, 1, 2] and losses == [0.0, 32.0, 64.0]
    np.testing.assert_array_equal(np.asarray(final), np.full((8, 4), 3.0))
    assert read_manifest(tmp_path / "ckpt")["step"] == 3
