"""Checkpoint faults (``alpa_ir.api.checkpoint``, issue 44): a damaged leaf that
is not the first, a manifest that lies about a shape or names a dtype that is
not array data, symbolic links out of a step, a full disk, a read-only file
system and a save killed at four moments. Each is a one-line error naming the
checkpoint, the step, the user's leaf and the cause; the previous step stays
restorable and the next save succeeds."""

from __future__ import annotations

import gc
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import alpa_ir
from alpa_ir.api.checkpoint import orbax_io, read_manifest
from alpa_ir.errors import AlpaError


def _state() -> dict[str, Any]:
    """Four leaves; the big one (data file of its own) and the lied-about one
    come after state.n, the first."""
    rng = np.random.default_rng(0)
    return {
        "n": jnp.ones(3),
        "params": {
            "v": jnp.asarray(rng.normal(size=(256, 256)), jnp.float32),
            "w": jnp.asarray(rng.normal(size=(8, 16)), jnp.float32),
        },
        "z": jnp.arange(5),
    }


def _assert_equal(got: Any, want: Any) -> None:
    assert jax.tree.structure(got) == jax.tree.structure(want)
    for a, b in zip(jax.tree.leaves(got), jax.tree.leaves(want), strict=True):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


def _orbax_frames(unraisable: Any) -> list[str]:
    code = getattr(unraisable.object, "cr_code", None)
    files = [code.co_filename] if code is not None else []
    tb = unraisable.exc_traceback
    while tb is not None:
        files.append(tb.tb_frame.f_code.co_filename)
        tb = tb.tb_next
    return [f for f in files if f"{os.sep}orbax{os.sep}" in f]


def _one_line_error(path: Path, pattern: str, monkeypatch: pytest.MonkeyPatch) -> str:
    """The restore's error; orbax's failed reads leave nothing to report later
    ("Exception ignored in <coroutine ...>" on stderr at the next collection)."""
    reported: list[Any] = []
    monkeypatch.setattr(sys, "unraisablehook", reported.append)
    with pytest.raises(AlpaError, match=pattern) as info:
        alpa_ir.restore_checkpoint(path)
    gc.collect()
    # (tensorstore's late callbacks into the event loop orbax closed may still
    # report "Event loop is closed" at any time: asyncio's frames, not orbax's)
    assert [u for u in reported if _orbax_frames(u)] == []
    text = str(info.value)
    assert "\n" not in text and "leaf0000" not in text  # the user's paths, not orbax's items
    return text


@pytest.fixture(scope="module")
def saved(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One healthy checkpoint; each test damages a copy."""
    path = tmp_path_factory.mktemp("saved") / "ckpt"
    alpa_ir.save_checkpoint(path, _state(), step=7)
    return path


@pytest.fixture
def ckpt(saved: Path, tmp_path: Path) -> Path:
    path = tmp_path / "ckpt"
    shutil.copytree(saved, path, symlinks=True)
    return path


def test_a_healthy_checkpoint_reads_leaf_by_leaf(ckpt: Path) -> None:
    """Each leaf alone is a read orbax accepts (the fallback that names a
    damaged leaf reads them so; it used to hit orbax's tree-structure check)."""
    sharding = jax.sharding.SingleDeviceSharding(jax.devices()[0])
    with orbax_io.opened(ckpt, create=False) as manager:
        got = orbax_io.read_items(
            manager, 7, {"leaf00002": jax.ShapeDtypeStruct((8, 16), np.float32, sharding=sharding)}
        )
    assert list(got) == ["leaf00002"]
    np.testing.assert_array_equal(np.asarray(got["leaf00002"]), _state()["params"]["w"])
    _assert_equal(alpa_ir.restore_checkpoint(ckpt), _state())


def test_truncated_data_of_a_later_leaf_names_it(
    ckpt: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    files = [p for p in (ckpt / "7" / "state").rglob("*") if p.is_file() and p.parent.name == "d"]
    data = max(files, key=lambda p: p.stat().st_size)
    data.write_bytes(data.read_bytes()[: data.stat().st_size // 3])
    _one_line_error(
        ckpt,
        r"^checkpoint .*ckpt \(step 7\): leaf state\.params\.v cannot be read: .*"
        r"Requested byte range .* is not valid for value of size",
        monkeypatch,
    )


def _edit_leaf(path: Path, leaf: str, **changes: Any) -> None:
    file = path / "7" / "manifest" / "metadata"
    manifest = json.loads(file.read_text())
    for entry in manifest["leaves"]:
        if entry["path"] == leaf:
            entry.update(changes)
    file.write_text(json.dumps(manifest))


def test_a_manifest_shape_lie_names_the_leaf_and_keeps_orbax_reason(
    ckpt: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _edit_leaf(ckpt, "state.params.w", shape=[2, 2])
    _one_line_error(
        ckpt,
        r"^checkpoint .*ckpt \(step 7\): leaf state\.params\.w cannot be read: Requested "
        r"shape: \(2, 2\) is not compatible with the stored shape: \(8, 16\)",
        monkeypatch,
    )


@pytest.mark.parametrize("dtype", ["object", "str", "<U3", "|S4", "bytes", "V8", "datetime64[s]"])
def test_a_manifest_dtype_that_is_not_array_data_is_refused(
    ckpt: Path, dtype: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    _edit_leaf(ckpt, "state.params.w", dtype=dtype)
    _one_line_error(
        ckpt,
        rf"^checkpoint .*ckpt \(step 7\): leaf state\.params\.w has dtype "
        rf"'{re.escape(dtype)}', which is not array data",
        monkeypatch,
    )


def test_array_dtypes_of_jax_pass_the_manifest_check(tmp_path: Path) -> None:
    state = {
        "b": jnp.ones(4, jnp.bfloat16),
        "f8": jnp.ones(4, jnp.float8_e4m3fn),
        "i4": jnp.ones(4, jnp.int4),
        "ok": jnp.ones(4, jnp.bool_),
        "c": jnp.ones(4, jnp.complex64),
    }
    path = alpa_ir.save_checkpoint(tmp_path / "ckpt", state)
    restored = alpa_ir.restore_checkpoint(path)
    assert {k: v.dtype for k, v in restored.items()} == {k: v.dtype for k, v in state.items()}


# --------------------------------------------------------------------------- links


def _outside_copy(path: Path, tmp_path: Path) -> Path:
    """A copy of the checkpoint elsewhere: a link to it would read good bytes."""
    copy = tmp_path / "elsewhere"
    shutil.copytree(path, copy)
    return copy


def _link(entry: Path, target: Path) -> None:
    if entry.is_dir() and not entry.is_symlink():
        shutil.rmtree(entry)
    else:
        entry.unlink()
    entry.symlink_to(target, target_is_directory=target.is_dir())


@pytest.mark.parametrize(
    "where",
    ["state/d/FILE", "state/ocdbt.process_0/d", "manifest/metadata", "."],
    ids=["data-file", "data-folder", "manifest-file", "step-folder"],
)
def test_a_link_out_of_the_step_is_refused_before_any_read(
    ckpt: Path, tmp_path: Path, where: str
) -> None:
    copy = _outside_copy(ckpt, tmp_path)
    if "FILE" in where:
        [name] = [p.name for p in (ckpt / "7" / "state" / "d").iterdir()]
        where = where.replace("FILE", name)
    entry = (ckpt / "7" / where).resolve() if where == "." else ckpt / "7" / where
    _link(entry, copy / "7" / where)
    for read in (alpa_ir.restore_checkpoint, read_manifest):
        with pytest.raises(AlpaError, match=r"is a symbolic link to .*elsewhere") as info:
            read(ckpt)
        text = str(info.value)
        assert text.startswith(f"checkpoint {ckpt} (step 7): ") and "outside the checkpoint" in text
        assert "nothing was read" in text and "\n" not in text


def test_a_link_inside_the_step_is_read(ckpt: Path) -> None:
    manifest = ckpt / "7" / "manifest"
    (manifest / "metadata").rename(manifest / "real")
    (manifest / "metadata").symlink_to("real")
    _assert_equal(alpa_ir.restore_checkpoint(ckpt), _state())


@pytest.mark.parametrize("where", ["7/state/d", "8.orbax-checkpoint-tmp"], ids=["in-step", "tmp"])
def test_a_save_never_writes_through_a_link(ckpt: Path, tmp_path: Path, where: str) -> None:
    outside = tmp_path / "precious"
    outside.mkdir()
    (outside / "keep.txt").write_text("mine")
    entry = ckpt / where
    if entry.exists():
        shutil.rmtree(entry)
    entry.symlink_to(outside, target_is_directory=True)
    with pytest.raises(AlpaError, match="saving never writes through one") as info:
        alpa_ir.save_checkpoint(ckpt, _state(), step=8, overwrite=True)
    assert str(info.value).startswith(f"cannot save checkpoint {ckpt}: {where} is a symbolic link")
    assert [p.name for p in outside.iterdir()] == ["keep.txt"]
    assert (outside / "keep.txt").read_text() == "mine"


# --------------------------------------------------------------------------- full, read-only

_SAVES = """
import json, os, sys, time
os.environ["XLA_FLAGS"] = "--xla_force_host_platform_device_count=8"
os.environ["JAX_PLATFORMS"] = "cpu"
import jax.numpy as jnp
import numpy as np
import alpa_ir
from alpa_ir.errors import AlpaError
# 16 MiB that do not compress under state.params.w, after the first leaf state.params.b
w = np.random.default_rng(0).normal(size=(2048, 2048)).astype(np.float32)
state = {"params": {"b": jnp.ones(3), "w": jnp.asarray(w)}}
print("ready", flush=True)
print("saving", file=sys.stderr, flush=True)  # nothing may follow on stderr
for path in sys.argv[1:]:
    try:
        alpa_ir.save_checkpoint(path, state, step=2, overwrite=True)
        error = None
    except AlpaError as err:
        error = str(err)
    print(json.dumps({"path": path, "error": error}), flush=True)
import atexit
# atexit runs once every non-daemon thread is joined, before JAX's own teardown
done = time.monotonic()
atexit.register(lambda: print(f"joined {time.monotonic() - done:.3f}", flush=True))
print("done", flush=True)
"""


@pytest.fixture
def mounts(tmp_path: Path) -> Iterator[dict[str, Path]]:
    """A full 4 MiB tmpfs and a read-only one, each with step 1 saved."""
    if shutil.which("mount") is None or shutil.which("umount") is None:
        pytest.skip("no mount command here to make a small tmpfs")
    made: list[Path] = []
    try:
        for name, size in (("full", "4m"), ("readonly", "8m")):
            where = tmp_path / name
            where.mkdir()
            mount = ["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(where)]
            done = subprocess.run(mount, capture_output=True, text=True, check=False)
            if done.returncode != 0:
                pytest.skip(f"cannot mount a tmpfs here: {done.stderr.strip() or done.returncode}")
            made.append(where)
            alpa_ir.save_checkpoint(where / "ckpt", _small(), step=1)
        remount = ["mount", "-o", "remount,ro", str(made[1])]
        done = subprocess.run(remount, capture_output=True, text=True, check=False)
        if done.returncode != 0:
            pytest.skip(f"cannot remount a tmpfs read-only: {done.stderr.strip()}")
        yield {"full": made[0], "readonly": made[1]}
    finally:
        for where in made:
            subprocess.run(["umount", "-l", str(where)], capture_output=True, check=False)


def _small() -> dict[str, Any]:
    return {"params": {"b": jnp.zeros(3), "w": jnp.full((4, 4), 2.0)}}


def test_disk_full_and_read_only_saves_fail_in_one_line_and_exit(
    mounts: dict[str, Path], tmp_path: Path
) -> None:
    script = tmp_path / "saves.py"
    script.write_text(_SAVES)
    targets = [
        mounts["full"] / "ckpt",
        mounts["full"] / "new",
        mounts["readonly"] / "ckpt",
        mounts["readonly"] / "new",
    ]
    proc = subprocess.Popen(
        [sys.executable, str(script), *map(str, targets)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        out, err = proc.communicate(timeout=120)
    except subprocess.TimeoutExpired:
        proc.kill()
        out, err = proc.communicate()
        pytest.fail(f"the saving process did not exit (a thread left blocked?): {out}")
    lines = out.splitlines()
    assert lines[0] == "ready" and lines[len(targets) + 1] == "done", out
    results = [json.loads(line) for line in lines[1 : len(targets) + 1]]
    assert err.split("saving\n", 1)[1] == "", err  # orbax printed nothing
    # no thread is left blocked: the interpreter joins them all within a second
    # (an asynchronous orbax save on a read-only disk left four waiting forever)
    joined = lines[len(targets) + 2].split()
    assert joined[0] == "joined" and float(joined[1]) < 1.0, joined
    assert proc.returncode == 0

    full, full_new, ro, ro_new = (r["error"] for r in results)
    for error in (full, full_new, ro, ro_new):
        assert error is not None and "\n" not in error and "leaf0000" not in error
    for error, path in zip((full, full_new), targets[:2], strict=True):
        assert error.startswith(f"cannot save checkpoint {path} (step 2): leaf state.params.w: ")
        assert "No space left on device" in error
    for error, path in zip((ro, ro_new), targets[2:], strict=True):
        assert error.startswith(f"cannot save checkpoint {path} (step 2): ")
        assert "Read-only file system" in error
    # the partial step is gone, the previous one restores, the next save succeeds
    assert [p.name for p in targets[0].iterdir()] == ["1"] and not targets[1].exists()
    assert [p.name for p in targets[2].iterdir()] == ["1"] and not targets[3].exists()
    for path in (targets[0], targets[2]):
        _assert_equal(alpa_ir.restore_checkpoint(path), _small())
    newer = jax.tree.map(lambda x: x + 1, _small())
    alpa_ir.save_checkpoint(targets[0], newer, step=3, overwrite=True)
    assert [p.name for p in targets[0].iterdir()] == ["3"]
    _assert_equal(alpa_ir.restore_checkpoint(targets[0]), newer)


# --------------------------------------------------------------------------- SIGKILL

_KILLED = """
import os, sys
os.environ["XLA_FLAGS"] = "--xla_force_host_platform_device_count=8"
os.environ["JAX_PLATFORMS"] = "cpu"
import jax.numpy as jnp
import numpy as np
import alpa_ir
step = int(sys.argv[2])
rng = np.random.default_rng(step)  # 32 MiB that do not compress
state = {f"leaf{k}": jnp.asarray(rng.normal(size=(1024, 1024)).astype(np.float32)) for k in range(8)}
print("ready", flush=True)
sys.stdin.readline()
print("saving", flush=True)
alpa_ir.save_checkpoint(sys.argv[1], state, step=step, overwrite=True)
print("saved", flush=True)
"""

MOMENTS = ("start", "tmp", "tmp+50ms", "tmp+250ms")
"""When a save is killed: as it starts, when orbax's temporary step appears,
50 ms and 250 ms later."""


def _kill_state(step: int) -> dict[str, Any]:
    """What the saver of ``step`` writes (32 MiB; the steps this test saves
    itself, odd ones, are small)."""
    if step % 2:
        return {"w": np.full((8, 8), float(step), np.float32)}
    rng = np.random.default_rng(step)
    return {f"leaf{k}": rng.normal(size=(1024, 1024)).astype(np.float32) for k in range(8)}


def _kill_at(path: Path, proc: subprocess.Popen[str], moment: str) -> bool:
    """Let ``proc`` (ready to save) save and SIGKILL it at ``moment``;
    returns whether it was still saving when killed."""
    assert proc.stdin is not None and proc.stdout is not None
    assert proc.stdout.readline().strip() == "ready"
    proc.stdin.write("go\n")
    proc.stdin.flush()
    assert proc.stdout.readline().strip() == "saving"
    if moment != "start":
        deadline = time.monotonic() + 60
        while proc.poll() is None and time.monotonic() < deadline:
            if any(orbax_io.TMP_SUFFIX in p.name for p in path.iterdir()):
                break
            time.sleep(0.002)
        time.sleep({"tmp": 0.0, "tmp+50ms": 0.05, "tmp+250ms": 0.25}[moment])
    alive = proc.poll() is None
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    return alive


def test_a_save_killed_at_four_moments_keeps_a_whole_step(tmp_path: Path) -> None:
    script = tmp_path / "save.py"
    script.write_text(textwrap.dedent(_KILLED))
    path = tmp_path / "ckpt"
    steps = [10 * (k + 1) for k in range(len(MOMENTS))]
    # the savers start (import JAX, build their state) together, then save one by one
    procs = [
        subprocess.Popen(
            [sys.executable, str(script), str(path), str(step)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            text=True,
        )
        for step in steps
    ]
    try:
        alpa_ir.save_checkpoint(path, _kill_state(1), step=1)
        previous, killed_alive = 1, 0
        for proc, step, moment in zip(procs, steps, MOMENTS, strict=True):
            killed_alive += _kill_at(path, proc, moment)
            got = read_manifest(path)["step"]
            assert got in (previous, step)  # the previous step, or the new one if it committed
            _assert_equal(alpa_ir.restore_checkpoint(path), _kill_state(got))
            previous = step + 1  # the next save succeeds and leaves no debris
            alpa_ir.save_checkpoint(path, _kill_state(previous), step=previous, overwrite=True)
            assert [p.name for p in path.iterdir()] == [str(previous)]
        _assert_equal(alpa_ir.restore_checkpoint(path), _kill_state(previous))
    finally:
        for proc in procs:
            proc.kill()
            proc.wait()
    assert killed_alive >= 3, "most kills should land while the save runs"
