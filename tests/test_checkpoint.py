"""Checkpoints (``alpa_ir.checkpoint``): a state trained under one plan is saved,
restored under another plan and trained on with the numbers of one device;
arrays on different device subsets; clear errors; atomic writes."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import NamedSharding, SingleDeviceSharding
from jax.sharding import PartitionSpec as P

import alpa_ir
from alpa_ir import checkpoint
from alpa_ir.device_mesh import LogicalDeviceMesh
from alpa_ir.errors import AlpaError
from alpa_ir.models import make_train_step
from alpa_ir.parallel import DataParallel, ShardParallel, Zero3Parallel, parallelize


def _host(tree: Any) -> Any:
    return jax.tree.map(lambda x: np.array(x), tree)


def _assert_close(got: Any, want: Any) -> None:
    assert jax.tree.structure(got) == jax.tree.structure(want)
    for a, b in zip(jax.tree.leaves(got), jax.tree.leaves(want), strict=True):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-4, atol=1e-5)


def _is_split(x: jax.Array) -> bool:
    return len({tuple((s.start, s.stop) for s in sh.index) for sh in x.addressable_shards}) > 1


@pytest.mark.parametrize(
    ("first", "second"),
    [
        (Zero3Parallel(LogicalDeviceMesh((1, 4))), DataParallel(LogicalDeviceMesh((1, 8)))),
        (ShardParallel(LogicalDeviceMesh((2, 2))), Zero3Parallel(LogicalDeviceMesh((4, 2)))),
    ],
    ids=["zero3-1x4_to_data-1x8", "auto-2x2_to_zero3-4x2"],
)
def test_resume_under_another_plan_matches_one_device(
    tmp_path: Path, first: Any, second: Any
) -> None:
    fn, (state, batch) = make_train_step("mlp-tiny")
    # The single-device run: 4 steps.
    ref_state, ref_losses = _host(state), []
    for _ in range(4):
        ref_state, loss = jax.jit(fn)(ref_state, batch)
        ref_losses.append(float(loss))

    # 2 steps under the first plan (the state is donated each step).
    step_a = parallelize(fn, method=first)
    losses = []
    for _ in range(2):
        state, loss = step_a(state, batch)
        losses.append(float(loss))
    saved = _host(state)
    assert any(_is_split(x) for x in jax.tree.leaves(state)), "the first plan shards nothing"
    alpa_ir.save_checkpoint(tmp_path / "ckpt", state, step=2)
    assert checkpoint.read_manifest(tmp_path / "ckpt")["step"] == 2

    # Restore under the second plan: its placement, the saved values exactly.
    step_b = parallelize(fn, method=second)
    executable = step_b.get_executable(saved, batch)
    restored = alpa_ir.restore_checkpoint(tmp_path / "ckpt", target=executable)
    want = executable.get_input_shardings()[0]
    for x, s, v in zip(
        jax.tree.leaves(restored), jax.tree.leaves(want), jax.tree.leaves(saved), strict=True
    ):
        assert x.sharding.is_equivalent_to(s, x.ndim)
        np.testing.assert_array_equal(np.asarray(x), v)

    state = restored
    for _ in range(2):
        state, loss = step_b(state, batch)
        losses.append(float(loss))
    np.testing.assert_allclose(losses, ref_losses, rtol=1e-4)
    _assert_close(state, ref_state)


def test_arrays_on_different_device_subsets(tmp_path: Path) -> None:
    devices = jax.devices()
    mesh_a = jax.sharding.Mesh(np.array(devices[:2]), ("x",))
    mesh_b = jax.sharding.Mesh(np.array(devices[4:8]).reshape(2, 2), ("x", "y"))
    values = {
        "a": np.arange(24, dtype=np.float32).reshape(4, 6),
        "b": np.arange(5, dtype=np.int32),
        "c": (np.linspace(0, 1, 32, dtype=np.float32).reshape(8, 4),),
        "d": np.arange(8, dtype=np.float32).astype(jnp.bfloat16),
    }
    state = {
        "a": jax.device_put(values["a"], NamedSharding(mesh_a, P(None, "x"))),
        "b": jax.device_put(values["b"], SingleDeviceSharding(devices[5])),
        # split over x, replicated over y: each slice is written once.
        "c": (jax.device_put(values["c"][0], NamedSharding(mesh_b, P("x", None))),),
        "d": jax.device_put(values["d"], NamedSharding(mesh_b, P(("x", "y")))),
    }
    alpa_ir.save_checkpoint(tmp_path / "ckpt", state)
    assert sorted(p.name for p in (tmp_path / "ckpt").iterdir()) == [
        "00000.npy",
        "00001.npy",
        "00002.npy",
        "00003.npy",
        "manifest.json",
    ]
    assert np.load(tmp_path / "ckpt" / "00000.npy").shape == (4, 6)  # plain global .npy

    plain = alpa_ir.restore_checkpoint(tmp_path / "ckpt")
    assert plain["d"].dtype == jnp.bfloat16
    _assert_equal(plain, values)

    # Placed elsewhere: a on 4 devices split by rows, c on one device, ...
    other = jax.sharding.Mesh(np.array(devices[2:6]), ("z",))
    shardings = {
        "a": NamedSharding(other, P("z", None)),
        "b": NamedSharding(other, P()),
        "c": (SingleDeviceSharding(devices[0]),),
        "d": NamedSharding(mesh_a, P("x")),
    }
    moved = alpa_ir.restore_checkpoint(tmp_path / "ckpt", shardings=shardings)
    _assert_equal(moved, values)
    for x, s in zip(jax.tree.leaves(moved), jax.tree.leaves(shardings), strict=True):
        assert x.sharding == s
    assert _is_split(moved["a"]) and moved["a"].addressable_shards[0].data.shape == (1, 6)

    # One sharding for every leaf.
    one = alpa_ir.restore_checkpoint(tmp_path / "ckpt", shardings=SingleDeviceSharding(devices[3]))
    assert all(x.devices() == {devices[3]} for x in jax.tree.leaves(one))


def _assert_equal(got: Any, want: Any) -> None:
    assert jax.tree.structure(got) == jax.tree.structure(want)
    for a, b in zip(jax.tree.leaves(got), jax.tree.leaves(want), strict=True):
        assert a.dtype == b.dtype
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


def _small_state() -> dict[str, Any]:
    return {
        "params": {"w": jnp.ones((4, 3)), "b": jnp.zeros((3,))},
        "opt_state": (jnp.array(2, jnp.int32),),
    }


def test_missing_directory_and_manifest(tmp_path: Path) -> None:
    with pytest.raises(AlpaError, match=r"no checkpoint at .*nowhere: not a directory"):
        alpa_ir.restore_checkpoint(tmp_path / "nowhere")
    (tmp_path / "empty").mkdir()
    with pytest.raises(AlpaError, match=r"manifest\.json is missing"):
        alpa_ir.restore_checkpoint(tmp_path / "empty")


def test_missing_leaf_file_is_named(tmp_path: Path) -> None:
    path = alpa_ir.save_checkpoint(tmp_path / "ckpt", _small_state())
    names = [e["path"] for e in checkpoint.read_manifest(path)["leaves"]]
    assert names == ["state.opt_state.0", "state.params.b", "state.params.w"]
    (path / "00002.npy").unlink()
    with pytest.raises(AlpaError, match=r"leaf state\.params\.w has no file 00002\.npy"):
        alpa_ir.restore_checkpoint(path)


def test_leaf_file_disagreeing_with_manifest(tmp_path: Path) -> None:
    path = alpa_ir.save_checkpoint(tmp_path / "ckpt", _small_state())
    np.save(path / "00001.npy", np.zeros((5,), np.float32))
    with pytest.raises(AlpaError, match=r"leaf state\.params\.b .*float32\[5\].*float32\[3\]"):
        alpa_ir.restore_checkpoint(path)


def test_target_structure_mismatch_names_the_leaf(tmp_path: Path) -> None:
    path = alpa_ir.save_checkpoint(tmp_path / "ckpt", _small_state())
    sharding = SingleDeviceSharding(jax.devices()[0])
    target = {"params": {"w": sharding, "b": sharding, "extra": sharding}, "opt_state": (sharding,)}
    with pytest.raises(AlpaError, match=r"leaf state\.params\.extra is in the target"):
        alpa_ir.restore_checkpoint(path, target=target)
    target = {"params": {"w": sharding}, "opt_state": (sharding,)}
    with pytest.raises(AlpaError, match=r"leaf state\.params\.b is in the checkpoint but not"):
        alpa_ir.restore_checkpoint(path, shardings=target)


def test_target_shape_mismatch_names_leaf_and_shapes(tmp_path: Path) -> None:
    path = alpa_ir.save_checkpoint(tmp_path / "ckpt", _small_state())
    target = jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype), _small_state())
    target["params"]["w"] = jax.ShapeDtypeStruct((4, 4), jnp.float32)
    with pytest.raises(
        AlpaError,
        match=r"leaf state\.params\.w: checkpoint shape \[4, 3\] != target shape \[4, 4\]",
    ):
        alpa_ir.restore_checkpoint(path, target=target)


def test_shape_mismatch_against_an_executable(tmp_path: Path) -> None:
    fn, (state, batch) = make_train_step("mlp-tiny")
    executable = parallelize(fn, method=DataParallel(LogicalDeviceMesh((1, 2)))).get_executable(
        state, batch
    )
    state["params"]["dense_1"]["kernel"] = jnp.zeros((64, 8))
    path = alpa_ir.save_checkpoint(tmp_path / "ckpt", state)
    with pytest.raises(
        AlpaError,
        match=r"leaf state\.params\.dense_1\.kernel: checkpoint shape \[64, 8\] "
        r"!= target shape \[64, 64\]",
    ):
        alpa_ir.restore_checkpoint(path, target=executable)


def test_existing_checkpoint_needs_overwrite(tmp_path: Path) -> None:
    path = alpa_ir.save_checkpoint(tmp_path / "ckpt", _small_state(), step=1)
    with pytest.raises(AlpaError, match="already exists"):
        alpa_ir.save_checkpoint(path, _small_state(), step=2)
    newer = jax.tree.map(lambda x: x + 1, _small_state())
    alpa_ir.save_checkpoint(path, newer, step=2, overwrite=True)
    assert checkpoint.read_manifest(path)["step"] == 2
    _assert_equal(alpa_ir.restore_checkpoint(path), newer)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ckpt"]


def _fail_on_third_leaf(monkeypatch: pytest.MonkeyPatch) -> None:
    real = checkpoint._write_leaf
    calls = []

    def flaky(file: Path, leaf: Any, name: str) -> None:
        calls.append(name)
        if len(calls) == 3:
            raise OSError("disk full")
        real(file, leaf, name)

    monkeypatch.setattr(checkpoint, "_write_leaf", flaky)


def test_failed_save_leaves_no_checkpoint(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _fail_on_third_leaf(monkeypatch)
    with pytest.raises(OSError, match="disk full"):
        alpa_ir.save_checkpoint(tmp_path / "ckpt", _small_state())
    assert list(tmp_path.iterdir()) == []  # neither the name nor a temp dir


def test_failed_overwrite_keeps_the_old_checkpoint(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = alpa_ir.save_checkpoint(tmp_path / "ckpt", _small_state(), step=1)
    _fail_on_third_leaf(monkeypatch)
    with pytest.raises(OSError, match="disk full"):
        alpa_ir.save_checkpoint(path, jax.tree.map(lambda x: x + 1, _small_state()), overwrite=True)
    assert checkpoint.read_manifest(path)["step"] == 1
    _assert_equal(alpa_ir.restore_checkpoint(path), _small_state())
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ckpt"]


def test_input_avals_of_a_micro_batched_executable() -> None:
    fn, args = make_train_step("mlp-tiny")
    executable = parallelize(
        fn, method=Zero3Parallel(LogicalDeviceMesh((1, 4)), num_micro_batches=2)
    ).get_executable(*args)
    avals = executable.get_input_avals()
    assert jax.tree.structure(avals) == jax.tree.structure(args)
    for aval, arg in zip(jax.tree.leaves(avals), jax.tree.leaves(args), strict=True):
        assert (aval.shape, aval.dtype) == (arg.shape, arg.dtype)  # whole batch
    state_leaves = len(jax.tree.leaves(args[0]))
    shardings = jax.tree.leaves(executable.get_input_shardings())
    assert shardings[:state_leaves] == list(executable._in_shardings[:state_leaves])


def test_deleted_state_is_refused_and_nothing_is_written(tmp_path: Path) -> None:
    state = _small_state()
    state["params"]["w"].delete()  # as a step that donates its state does
    with pytest.raises(AlpaError, match=r"leaf state\.params\.w was deleted"):
        alpa_ir.save_checkpoint(tmp_path / "ckpt", state)
    assert list(tmp_path.iterdir()) == []


def test_restore_into_a_pipeline_plan_matches_one_device(tmp_path: Path) -> None:
    """Saved under ShardParallel on 2x2, restored into the placement of a
    2-stage PipeshardParallel step, trained on like one device."""
    from alpa_ir.pipeshard import AutoLayerOption, PipeshardParallel, UniformStageOption

    fn, (state, batch) = make_train_step("mlp-tiny")
    ref_state, ref_losses = _host(state), []
    for _ in range(3):
        ref_state, loss = jax.jit(fn)(ref_state, batch)
        ref_losses.append(float(loss))
    state, loss = parallelize(fn, method=ShardParallel(LogicalDeviceMesh((2, 2))))(state, batch)
    losses = [float(loss)]
    alpa_ir.save_checkpoint(tmp_path / "ckpt", state, step=1)
    saved = _host(state)

    method = PipeshardParallel(
        num_micro_batches=2,
        layer_option=AutoLayerOption(layer_num=2),
        stage_option=UniformStageOption(num_stages=2),
    )
    step = parallelize(fn, method=method, donate_argnums=())
    executable = step.get_executable(saved, batch)
    restored = alpa_ir.restore_checkpoint(tmp_path / "ckpt", target=executable)
    want = executable.get_input_shardings()[0]
    meshes = {frozenset(s.device_set) for s in jax.tree.leaves(want)}
    assert len(meshes) == 2, "the state should live on both stages' meshes"
    for x, s, v in zip(
        jax.tree.leaves(restored), jax.tree.leaves(want), jax.tree.leaves(saved), strict=True
    ):
        assert x.sharding.is_equivalent_to(s, x.ndim)
        np.testing.assert_array_equal(np.asarray(x), v)
    avals = jax.tree.leaves(executable.get_input_avals())
    assert [a.shape for a in avals] == [np.shape(x) for x in jax.tree.leaves((saved, batch))]
    state = restored
    for _ in range(2):
        state, loss = step(state, batch)
        losses.append(float(loss))
    np.testing.assert_allclose(losses, ref_losses, rtol=1e-4)
    _assert_close(state, ref_state)
