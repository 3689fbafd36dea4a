"""Checkpoints on orbax (``alpa_ir.api.checkpoint``): a state trained under one plan
is saved, restored under another plan (pipelines included, both ways) and
trained on with the numbers of one device; arrays on different device subsets;
keys, Python scalars and static leaves; checksums; damaged, edited, truncated
and path-escaping checkpoints give one-line errors naming the leaf (the
faults of issue 44, a killed save among them, are in test_checkpoint_faults)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import NamedSharding, SingleDeviceSharding
from jax.sharding import PartitionSpec as P

import alpa_ir
from alpa_ir.api import checkpoint
from alpa_ir.api.parallel import parallelize
from alpa_ir.api.shard_parallel import DataParallel, ShardParallel, Zero3Parallel
from alpa_ir.errors import AlpaError
from alpa_ir.hardware.device_mesh import LogicalDeviceMesh
from alpa_ir.models import make_train_step


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


def test_checksum_is_the_same_under_every_sharding() -> None:
    value = np.arange(128, dtype=np.float32).reshape(8, 16)
    mesh = jax.sharding.Mesh(np.array(jax.devices()).reshape(2, 4), ("x", "y"))
    sums = {
        checkpoint.checksum(value),
        checkpoint.checksum(jax.device_put(value, NamedSharding(mesh, P("x", "y")))),
        checkpoint.checksum(jax.device_put(value, NamedSharding(mesh, P(None, ("x", "y"))))),
        checkpoint.checksum(jax.device_put(value, NamedSharding(mesh, P()))),
    }
    assert len(sums) == 1
    swapped = value.copy()
    swapped[0, 0], swapped[0, 1] = value[0, 1], value[0, 0]
    assert checkpoint.checksum(swapped) not in sums  # positions count, not only values


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


def test_keys_python_scalars_and_static_leaves(tmp_path: Path) -> None:
    state = {
        "w": jnp.ones((2, 2)),
        "key": jax.random.key(3),
        "raw": jax.random.PRNGKey(4),
        "step": 5,
        "rate": 0.5,
        "act": jnp.tanh,
    }
    path = alpa_ir.save_checkpoint(tmp_path / "ckpt", state)
    with pytest.raises(AlpaError, match=r"leaf state\.act is not an array and was not saved"):
        alpa_ir.restore_checkpoint(path)
    restored = alpa_ir.restore_checkpoint(path, target=state)
    assert restored["act"] is jnp.tanh and restored["rate"] == 0.5
    assert int(restored["step"]) == 5
    assert np.array_equal(jax.random.key_data(restored["key"]), jax.random.key_data(state["key"]))
    assert np.array_equal(restored["raw"], state["raw"])


def test_train_state_restores_into_its_target(tmp_path: Path) -> None:
    import flax.linen as nn
    import optax
    from flax.training.train_state import TrainState

    model = nn.Dense(3)
    state = TrainState.create(
        apply_fn=model.apply,
        params=model.init(jax.random.key(0), jnp.ones((1, 2))),
        tx=optax.adam(1e-3),
    )
    path = alpa_ir.save_checkpoint(tmp_path / "ckpt", state)
    with pytest.raises(AlpaError, match="TrainState"):
        alpa_ir.restore_checkpoint(path)  # its apply_fn and tx are not saved
    restored = alpa_ir.restore_checkpoint(path, target=state)
    assert isinstance(restored, TrainState) and restored.apply_fn is state.apply_fn
    _assert_equal(restored.params, state.params)


def test_missing_directory_and_empty_directory(tmp_path: Path) -> None:
    with pytest.raises(AlpaError, match=r"no checkpoint at .*nowhere: not a directory"):
        alpa_ir.restore_checkpoint(tmp_path / "nowhere")
    (tmp_path / "empty").mkdir()
    with pytest.raises(AlpaError, match=r"no checkpoint at .*empty: no committed step"):
        alpa_ir.restore_checkpoint(tmp_path / "empty")


def _step_dir(path: Path) -> Path:
    [step] = [p for p in path.iterdir() if p.name.isdigit()]
    return step


def _largest_data_file(path: Path) -> Path:
    files = [
        p for p in (_step_dir(path) / "state").rglob("*") if p.is_file() and p.parent.name == "d"
    ]
    return max(files, key=lambda p: p.stat().st_size)


def _big_state() -> dict[str, Any]:
    rng = np.random.default_rng(0)
    return {"big": jnp.asarray(rng.normal(size=(256, 256)), jnp.float32), "small": jnp.ones(3)}


def test_edited_data_is_caught_by_its_checksum_or_its_reader(tmp_path: Path) -> None:
    path = alpa_ir.save_checkpoint(tmp_path / "ckpt", _big_state())
    data = _largest_data_file(path)
    raw = bytearray(data.read_bytes())
    for k in range(len(raw) // 2, len(raw) // 2 + 64):
        raw[k] ^= 0x55
    data.write_bytes(bytes(raw))
    with pytest.raises(AlpaError, match=r"checkpoint .*ckpt \(step 0\): leaf state\.big"):
        alpa_ir.restore_checkpoint(path)


def test_truncated_data_names_the_leaf(tmp_path: Path) -> None:
    path = alpa_ir.save_checkpoint(tmp_path / "ckpt", _big_state())
    data = _largest_data_file(path)
    data.write_bytes(data.read_bytes()[: data.stat().st_size // 3])
    with pytest.raises(AlpaError, match=r"checkpoint .*ckpt \(step 0\): leaf state\.big"):
        alpa_ir.restore_checkpoint(path)


def _edit_manifest(path: Path, edit: Any) -> None:
    file = _step_dir(path) / "manifest" / "metadata"
    manifest = json.loads(file.read_text())
    file.write_text(json.dumps(edit(manifest)) if callable(edit) else edit)


@pytest.mark.parametrize(
    ("edit", "message"),
    [
        ("{not json", "cannot read its manifest"),
        (lambda m: {**m, "format": "other"}, "not an alpa_ir checkpoint manifest"),
        (lambda m: {**m, "version": 99}, "manifest version 99"),
        (lambda m: {k: v for k, v in m.items() if k != "leaves"}, "no leaves"),
        (
            lambda m: {**m, "leaves": [{**m["leaves"][0], "item": "../../../etc/x"}]},
            r"leaf state\.big has a malformed manifest entry",
        ),
        (
            lambda m: {**m, "leaves": [{**m["leaves"][0], "shape": [-1]}, m["leaves"][1]]},
            r"leaf state\.big has a malformed manifest entry",
        ),
        (
            lambda m: {**m, "leaves": [{**m["leaves"][0], "dtype": "float99"}, m["leaves"][1]]},
            r"leaf state\.big has unknown dtype",
        ),
        (lambda m: {**m, "leaves": m["leaves"][:1]}, "the manifest lists 1"),
        (lambda m: {**m, "treedef": "__import__('os')"}, "malformed pytree text"),
        (
            lambda m: {**m, "treedef": "('evil_module:Thing', None, ('*', '*'))"},
            "not loaded in this process",
        ),
        (
            lambda m: {**m, "leaves": [{**m["leaves"][0], "checksum": "0" * 16}, m["leaves"][1]]},
            r"leaf state\.big does not match its checksum",
        ),
    ],
    ids=[
        "json",
        "format",
        "version",
        "no-leaves",
        "path-escape",
        "negative-shape",
        "dtype",
        "missing-leaf",
        "code-in-treedef",
        "unknown-type",
        "checksum",
    ],
)
def test_damaged_manifests_give_one_line_errors(tmp_path: Path, edit: Any, message: str) -> None:
    path = alpa_ir.save_checkpoint(tmp_path / "ckpt", _big_state())
    _edit_manifest(path, edit)
    with pytest.raises(AlpaError, match=message) as info:
        alpa_ir.restore_checkpoint(path)
    assert "\n" not in str(info.value) and "ckpt" in str(info.value)


def test_target_structure_and_shape_mismatch(tmp_path: Path) -> None:
    path = alpa_ir.save_checkpoint(tmp_path / "ckpt", _small_state())
    sharding = SingleDeviceSharding(jax.devices()[0])
    target = {"params": {"w": sharding, "b": sharding, "extra": sharding}, "opt_state": (sharding,)}
    with pytest.raises(AlpaError, match=r"does not match the target's structure \(3 vs 4"):
        alpa_ir.restore_checkpoint(path, target=target)
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
    assert [p.name for p in path.iterdir()] == ["2"]  # the old step is gone


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
    assert shardings[:state_leaves] == list(executable._compile_local()[1][:state_leaves])


def test_deleted_state_is_refused_and_nothing_is_written(tmp_path: Path) -> None:
    state = _small_state()
    state["params"]["w"].delete()  # as a step that donates its state does
    with pytest.raises(AlpaError, match=r"leaf state\.params\.w was deleted"):
        alpa_ir.save_checkpoint(tmp_path / "ckpt", state)
    assert list(tmp_path.iterdir()) == []


def test_restore_into_a_pipeline_plan_matches_one_device(tmp_path: Path) -> None:
    """Saved under ShardParallel on 2x2, restored into the placement of a
    2-stage PipeshardParallel step, trained on like one device."""
    from alpa_ir.api.pipeshard import AutoLayerOption, PipeshardParallel, UniformStageOption

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


def test_alpas_restore_form_reads_the_step_asked_for(tmp_path: Path) -> None:
    """Alpa's ``restore_checkpoint(path, step, placement_specs)``: the step saved
    as ``step`` (the user's number, which orbax may renumber), placed by the
    given shardings; a step not saved is one line."""
    rows = NamedSharding(jax.make_mesh((8,), ("d",)), P("d"))
    first = {"w": jnp.arange(16.0).reshape(8, 2)}
    alpa_ir.save_checkpoint(tmp_path / "ckpt", {"w": first["w"] + 1}, 7)
    alpa_ir.save_checkpoint(tmp_path / "ckpt", first, 3, overwrite=True)  # orbax: step 8
    got = alpa_ir.restore_checkpoint(tmp_path / "ckpt", 3, {"w": rows})
    _assert_equal(got, first)
    assert got["w"].sharding.is_equivalent_to(rows, 2)
    with pytest.raises(AlpaError, match=r"no step 7 in checkpoint .*committed steps are 3$"):
        alpa_ir.restore_checkpoint(tmp_path / "ckpt", 7, {"w": rows})
