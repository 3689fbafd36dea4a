"""save_checkpoint(path, state, step, local_cache_dir): the step is written
into the cache, then moved into ``path`` (without Ray: before the call
returns); the moved checkpoint restores to the state. (On Ray, in the
background: tests/backends/test_ray_backend.py.)"""

from __future__ import annotations

import errno
import os
from pathlib import Path
from typing import Any

import jax.numpy as jnp
import numpy as np
import pytest

import alpa_ir
from alpa_ir.errors import AlpaError
from alpa_ir.runtime import checkpoint_mover
from alpa_ir.runtime.checkpoint_mover import move_tree

STATE = {"w": jnp.arange(12.0).reshape(3, 4), "b": jnp.ones(4), "step": 3}


def test_a_step_saved_through_the_cache_lands_in_the_checkpoint(tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    alpa_ir.save_checkpoint(tmp_path / "ckpt", STATE, 1, cache)
    alpa_ir.save_checkpoint(tmp_path / "ckpt", STATE, 2, cache, overwrite=True)
    assert list(cache.iterdir()) == []  # every staged step moved out
    assert {p.name for p in (tmp_path / "ckpt").iterdir()} >= {"1", "2"}
    back = alpa_ir.restore_checkpoint(tmp_path / "ckpt", 2, STATE)
    np.testing.assert_array_equal(back["w"], STATE["w"])
    assert back["step"] == 3


def test_moving_across_file_systems_copies_then_renames(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A rename out of the cache fails across file systems (EXDEV): each entry
    is copied under a temporary name beside its target, then renamed; folders
    already in the target are merged."""
    src, dst = tmp_path / "src", tmp_path / "dst"
    (src / "1" / "state").mkdir(parents=True)
    (src / "1" / "state" / "data").write_text("x")
    (src / "meta").write_text("m")
    (dst / "1").mkdir(parents=True)
    (dst / "1" / "other").write_text("kept")
    real = os.replace

    def across(a: Any, b: Any) -> None:
        if Path(a).is_relative_to(src):
            raise OSError(errno.EXDEV, "Invalid cross-device link")
        real(a, b)

    monkeypatch.setattr(checkpoint_mover.os, "replace", across)
    move_tree(src, dst)
    assert not src.exists()
    assert (dst / "1" / "state" / "data").read_text() == "x"
    assert (dst / "1" / "other").read_text() == "kept"
    assert (dst / "meta").read_text() == "m"
    assert not [p for p in dst.rglob("*.moving")]


def test_a_cache_that_cannot_be_made_is_one_line(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("")
    with pytest.raises(AlpaError, match=r"local_cache_dir .*file/cache"):
        alpa_ir.save_checkpoint(tmp_path / "ckpt", STATE, 1, blocker / "cache")
