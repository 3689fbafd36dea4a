"""The bad-input corpus of the Python API, the IR verifier, reproducers and
alpa-opt: every malformed, hostile or nonsensical input is an
``alpa_ir.AlpaError`` (alpa-opt: exit status 1 or 2) whose message is one line
naming what is wrong and where; nothing is accepted silently and nothing
hangs. The command-line tools' arguments are in ``test_cli_bad_inputs.py``,
checkpoints in ``test_checkpoint.py`` (damaged, edited, truncated,
path-escaping), data that names code in ``test_no_code_from_data.py``, the
training loop's arguments in ``api/test_train.py``.
``pytest -m bad_input`` runs them all."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import PartitionSpec as P

import alpa_ir
from alpa_ir.api.pipeshard import (
    AutoLayerOption,
    AutoStageOption,
    ManualStageOption,
    PipeshardParallel,
    UniformStageOption,
)
from alpa_ir.errors import AlpaError
from alpa_ir.tools.alpa_opt import main as alpa_opt_main

pytestmark = pytest.mark.bad_input

_RNG = np.random.default_rng(0)
STATE = {"w": jnp.asarray(_RNG.normal(size=(8, 4)), jnp.float32)}
BATCH = {
    "x": jnp.asarray(_RNG.normal(size=(16, 8)), jnp.float32),
    "y": jnp.asarray(_RNG.normal(size=(16, 4)), jnp.float32),
}


def step(state: dict[str, jax.Array], batch: dict[str, jax.Array]) -> Any:
    def loss(w: jax.Array) -> jax.Array:
        return jnp.mean((batch["x"] @ w - batch["y"]) ** 2)

    value, grad = jax.value_and_grad(loss)(state["w"])
    return {"w": state["w"] - 0.1 * grad}, value


def _run(method: Any, *args: Any, **kw: Any) -> Any:
    return alpa_ir.parallelize(step, method=method, **kw)(*(args or (STATE, BATCH)))


def _compiled(method: Any = None) -> Any:
    return alpa_ir.parallelize(step, method=method or alpa_ir.DataParallel()).get_executable(
        STATE, BATCH
    )


def _donated_again() -> None:
    parallel = alpa_ir.parallelize(step, method=alpa_ir.DataParallel())
    state = {"w": jnp.array(STATE["w"])}
    new, _ = parallel(state, BATCH)
    parallel(new, BATCH)
    parallel(new, BATCH)


def _tracing_error() -> None:
    def broken(state: Any, batch: Any) -> Any:
        return state["w"] @ batch["x"]  # (8, 4) @ (16, 8): the user's shapes disagree

    alpa_ir.parallelize(broken, method=alpa_ir.DataParallel())(STATE, BATCH)


def _shard_map_step() -> None:
    from jax.sharding import AxisType

    mesh = jax.make_mesh((8,), ("d",), axis_types=(AxisType.Auto,))

    def step(state: Any, batch: Any) -> Any:
        def local(x: jax.Array) -> jax.Array:
            return jax.lax.psum(jnp.sum(x), "d")

        total = jax.shard_map(local, mesh=mesh, in_specs=P("d"), out_specs=P())(batch["x"])
        return state["w"] * total

    alpa_ir.parallelize(step, method=alpa_ir.ShardParallel())(STATE, BATCH)


def _save_to_a_file(tmp: Path) -> None:
    (tmp / "file").write_text("x")
    alpa_ir.save_checkpoint(tmp / "file", STATE)


def _save_under_a_file(tmp: Path) -> None:
    (tmp / "file").write_text("x")
    alpa_ir.save_checkpoint(tmp / "file" / "ck", STATE)


def _restore_other_keys(tmp: Path) -> None:
    alpa_ir.save_checkpoint(tmp / "ck", {"p": jnp.ones(2), "n": jnp.zeros(3)})
    alpa_ir.restore_checkpoint(tmp / "ck", target={"p": jnp.ones(2), "m": jnp.zeros(3)})


API_CASES: list[tuple[str, Callable[[Path], Any], str]] = [
    ("method-string", lambda t: _run("ShardParallel"), r"method must be a parallel method.*'Shard"),
    ("method-float", lambda t: _run(1.5), r"method must be a parallel method.*1\.5"),
    (
        "mesh-float-shape",
        lambda t: alpa_ir.LogicalDeviceMesh((2.7, 4)),
        r"must hold ints, got 2\.7",
    ),
    ("mesh-zero-shape", lambda t: alpa_ir.LogicalDeviceMesh((0, 4)), r"\[0, 4\] must be positive"),
    ("mesh-empty-shape", lambda t: alpa_ir.LogicalDeviceMesh(()), "must be non-empty"),
    ("mesh-bool-shape", lambda t: alpa_ir.LogicalDeviceMesh((True, 4)), "must hold ints, got True"),
    (
        "mesh-negative-device",
        lambda t: alpa_ir.LogicalDeviceMesh((1, 2), devices=(-1, 0)),
        "device id -1 is negative",
    ),
    (
        "mesh-duplicate-devices",
        lambda t: alpa_ir.LogicalDeviceMesh((1, 2), devices=(3, 3)),
        r"list device 3 twice",
    ),
    (
        "mesh-device-count",
        lambda t: alpa_ir.LogicalDeviceMesh((2, 2), devices=(0, 1)),
        r"needs 4 devices, got 2",
    ),
    (
        "mesh-alpha-length",
        lambda t: alpa_ir.LogicalDeviceMesh((2, 4), alpha=(1.0,)),
        r"alpha needs 2 values",
    ),
    (
        "mesh-more-devices-than-exist",
        lambda t: _run(alpa_ir.ShardParallel(devices=[0, 99])),
        r"needs 100 devices but only 8 local devices exist \(more CPU devices: XLA_FLAGS",
    ),
    ("devices-string", lambda t: _run(alpa_ir.ShardParallel(devices="abc")), "got str"),
    (
        "devices-repeated",
        lambda t: _run(alpa_ir.ShardParallel(devices=[1, 1])),
        "device 1 is listed more than once",
    ),
    (
        "devices-foreign-object",
        lambda t: _run(alpa_ir.ShardParallel(devices=[object()])),
        "is not one of this process's devices",
    ),
    (
        "micro-batches-negative",
        lambda t: _run(alpa_ir.ShardParallel(num_micro_batches=-2)),
        "num_micro_batches must be an int >= 1, got -2",
    ),
    (
        "micro-batches-zero",
        lambda t: _run(alpa_ir.DataParallel(num_micro_batches=0)),
        "num_micro_batches must be an int >= 1, got 0",
    ),
    (
        "micro-batches-float",
        lambda t: _run(alpa_ir.ShardParallel(num_micro_batches=1.5)),
        "got 1.5",
    ),
    (
        "micro-batches-not-dividing",
        lambda t: _run(alpa_ir.ShardParallel(num_micro_batches=3)),
        r"batch\.x: a batch array of shape \[16, 8\] cannot be split into 3 micro-batches",
    ),
    (
        "pipeline-micro-batches-negative",
        lambda t: _run(PipeshardParallel(num_micro_batches=-1)),
        "got -1",
    ),
    (
        "pipeline-layer-option-string",
        lambda t: PipeshardParallel(layer_option="automatic"),
        "layer_option must be 'manual' or a layer option, got 'automatic'",
    ),
    (
        "pipeline-stage-option-string",
        lambda t: PipeshardParallel(stage_option="best"),
        "stage_option must be 'uniform', 'auto' or a stage option, got 'best'",
    ),
    (
        "auto-stage-cost-mode",
        lambda t: AutoStageOption(cost_mode="exact"),  # type: ignore[arg-type]
        "AutoStageOption: cost_mode must be 'layer-sum' or 'range', got 'exact'",
    ),
    (
        "auto-stage-repeated-layers",
        lambda t: AutoStageOption(repeated_layers="tied"),  # type: ignore[arg-type]
        "AutoStageOption: repeated_layers must be 'auto', 'share' or 'separate', got 'tied'",
    ),
    (
        "auto-stage-cross-stage-comm",
        lambda t: AutoStageOption(cross_stage_comm="sometimes"),  # type: ignore[arg-type]
        "AutoStageOption: cross_stage_comm must be True, False or 'auto', got 'sometimes'",
    ),
    (
        "auto-stage-workers",
        lambda t: AutoStageOption(workers=0),
        "AutoStageOption: workers must be a positive integer, got 0",
    ),
    (
        "pipeline-schedule",
        lambda t: PipeshardParallel(pipeline_schedule="zigzag"),
        "pipeline_schedule must be one of 'auto', '1f1b', 'gpipe', 'zb-h1', 'interleaved-1f1b', 'zb-v', 'inference', got 'zigzag'",
    ),
    ("pipeline-backend", lambda t: PipeshardParallel(backend="tpu"), "backend must be"),
    (
        "pipeline-uneven-stages",
        lambda t: _run(
            PipeshardParallel(
                layer_option=AutoLayerOption(3), stage_option=UniformStageOption(num_stages=3)
            )
        ),
        "8 devices cannot be split evenly into 3 stages",
    ),
    (
        "pipeline-more-stages-than-layers",
        lambda t: _run(
            PipeshardParallel(
                layer_option=AutoLayerOption(1), stage_option=UniformStageOption(num_stages=2)
            )
        ),
        "2 stages requested but the step has only 1 layers",
    ),
    (
        "pipeline-manual-lengths",
        lambda t: _run(
            PipeshardParallel(
                layer_option=AutoLayerOption(2),
                stage_option=ManualStageOption([[0], [1]], [(1, 8)]),
            )
        ),
        "ManualStageOption has 2 stages but 1 submesh shapes",
    ),
    (
        "pipeline-manual-gap",
        lambda t: _run(
            PipeshardParallel(
                layer_option=AutoLayerOption(2),
                stage_option=ManualStageOption([[0, 2]], [(1, 8)]),
            )
        ),
        r"stage layers \[0, 2\] are not consecutive",
    ),
    (
        "pipeline-manual-devices",
        lambda t: _run(
            PipeshardParallel(
                layer_option=AutoLayerOption(2),
                stage_option=ManualStageOption([[0], [1]], [(1, 2), (1, 2)]),
            )
        ),
        "the submeshes hold 4 devices but the plan has 8",
    ),
    (
        "static-argnums-range",
        lambda t: _run(alpa_ir.DataParallel(), static_argnums=(5,)),
        "static_argnums names argument 5 but the step is called with 2",
    ),
    (
        "static-argnums-string",
        lambda t: _run(alpa_ir.DataParallel(), static_argnums="everything"),
        "static_argnums must be a sequence of ints or 'auto', got 'everything'",
    ),
    (
        "static-argnums-bool",
        lambda t: _run(alpa_ir.DataParallel(), static_argnums=(True,)),
        "static_argnums must hold ints, got True",
    ),
    (
        "static-unhashable",
        lambda t: alpa_ir.parallelize(
            lambda s, b, extra: step(s, b), method=alpa_ir.DataParallel(), static_argnums=(2,)
        )(STATE, BATCH, [1, 2]),
        r"static argument extra \(list\) is not hashable",
    ),
    (
        "call-other-shape",
        lambda t: _compiled()(STATE, {"x": jnp.ones((32, 8)), "y": jnp.ones((32, 4))}),
        r"compiled for f32\[16, 8\] at batch\.x, called with f32\[32, 8\]",
    ),
    (
        "call-other-dtype",
        lambda t: _compiled()(STATE, {"x": jnp.ones((16, 8), jnp.int32), "y": BATCH["y"]}),
        r"compiled for f32\[16, 8\] at batch\.x, called with i32\[16, 8\]",
    ),
    (
        "call-other-structure",
        lambda t: _compiled()(STATE, {"x": BATCH["x"]}),
        "arguments have structure",
    ),
    ("call-other-arity", lambda t: _compiled()(STATE), "compiled for 2 arguments, got 1"),
    ("donated-twice", lambda t: _donated_again(), r"w was donated to an earlier call"),
    ("user-code-error", lambda t: _tracing_error(), r"tracing broken: .*dot_general"),
    (
        "shard-map-region",
        lambda t: _shard_map_step(),
        r"test_bad_inputs\.py:\d+: jax\.shard_map regions .* are not supported",
    ),
    (
        "manual-unknown-axis",
        lambda t: _run(alpa_ir.ManualShardParallel(({"w": P("nope")}, {"x": None, "y": None}))),
        "names a mesh axis not in",
    ),
    (
        "manual-none-subtree",
        lambda t: _run(alpa_ir.ManualShardParallel(({"w": P("m1")}, None))),
        r"ManualShardParallel in_specs is None for the whole subtree \[1\] \(2 leaves\); "
        "only a leaf may be None",
    ),
    (
        "manual-spec-too-long",
        lambda t: _run(
            alpa_ir.ShardParallel(
                manual_sharding_option=alpa_ir.ManualShardingOption(
                    in_axis_resources=({"w": P(None, None, "m1")}, None)
                )
            )
        ),
        "has 3 entries for a rank-2 array",
    ),
    (
        "manual-spec-not-dividing",
        lambda t: _run(
            alpa_ir.ShardParallel(
                devices=alpa_ir.LogicalDeviceMesh((1, 8)),
                manual_sharding_option=alpa_ir.ManualShardingOption(
                    in_axis_resources=({"w": P(None, "m1")}, None)
                ),
            )
        ),
        "splits dimension 1 of size 4 8 ways",
    ),
    (
        "manual-axis-names-count",
        lambda t: _run(
            alpa_ir.ShardParallel(
                manual_sharding_option=alpa_ir.ManualShardingOption(("a", "b", "c"))
            )
        ),
        r"names 3 mesh axes, the mesh \[1, 8\] has 2",
    ),
    (
        "manual-prefix-mismatch",
        lambda t: _run(
            alpa_ir.ShardParallel(
                manual_sharding_option=alpa_ir.ManualShardingOption(
                    in_axis_resources=({"v": P()}, None)
                )
            )
        ),
        "in_axis_resources does not match the structure",
    ),
    (
        "propagation-without-specs",
        lambda t: _run(
            alpa_ir.ShardParallel(
                auto_sharding_option=alpa_ir.AutoShardingOption(enable_auto_sharding=False)
            )
        ),
        "enable_auto_sharding=False.*give one",
    ),
    (
        "force-batch-axis-range",
        lambda t: _run(
            alpa_ir.ShardParallel(
                auto_sharding_option=alpa_ir.AutoShardingOption(force_batch_dim_to_mesh_dim=5)
            )
        ),
        r"force-batch-dim-to-mesh-dim=5 but the mesh \[1, 8\] has 2 axes",
    ),
    (
        "unknown-solver",
        lambda t: _run(
            alpa_ir.ShardParallel(auto_sharding_option=alpa_ir.AutoShardingOption(solver="nope"))
        ),
        "nope",
    ),
    (
        "physical-mesh-shape",
        lambda t: alpa_ir.get_global_physical_mesh().get_logical_mesh((3, 3)),
        r"shape \[3, 3\] holds 9 devices, the physical mesh has 8",
    ),
    (
        "physical-mesh-duplicates",
        lambda t: alpa_ir.PhysicalDeviceMesh([0, 0]),
        "device 0 is listed more than once",
    ),
    ("init-unknown-cluster", lambda t: alpa_ir.init(cluster="tpu"), "unknown cluster 'tpu'"),
    (
        "init-local-address",
        lambda t: alpa_ir.init(cluster="local", address="1.2.3.4:6379"),
        "address is an option of cluster='ray'",
    ),
    (
        "init-local-probe",
        lambda t: alpa_ir.init(cluster="local", probe=True),
        "probe is an option of cluster='ray'",
    ),
    ("checkpoint-path-is-a-file", _save_to_a_file, "exists and is not a directory"),
    ("checkpoint-path-under-a-file", _save_under_a_file, r"file is not a directory"),
    (
        "checkpoint-target-other-keys",
        _restore_other_keys,
        "the checkpoint has leaf state.n where the target has state.m",
    ),
    (
        "checkpoint-negative-step",
        lambda t: alpa_ir.save_checkpoint(t / "ck", STATE, step=-1),
        "step must be an int >= 0, got -1",
    ),
    (
        "checkpoint-missing",
        lambda t: alpa_ir.restore_checkpoint(t / "nowhere"),
        "no checkpoint at .*nowhere",
    ),
    ("parse-garbage", lambda t: alpa_ir.parse_module("garbage"), r"<string>:1:1"),
    (
        "execute-wrong-arity",
        lambda t: alpa_ir.execute(alpa_ir.import_jax(step, STATE, BATCH), STATE),
        "arguments have structure",
    ),
    (
        "execute-wrong-shape",
        lambda t: alpa_ir.execute(
            alpa_ir.import_jax(step, STATE, BATCH), {"w": jnp.ones((4, 4))}, BATCH
        ),
        r"argument 0 \(state\.w\) is float32\[4, 4\], the module expects float32\[8, 4\]",
    ),
]


@pytest.mark.parametrize(("name", "call", "message"), API_CASES, ids=[c[0] for c in API_CASES])
def test_api(tmp_path: Path, name: str, call: Callable[[Path], Any], message: str) -> None:
    with pytest.raises(AlpaError, match=message) as info:
        call(tmp_path)
    assert "\n" not in str(info.value).strip()


MESH = (
    "  mesh.logical_mesh @mesh {shape = array<i64: 2, 4>, devices = array<i64: 0, 1, 2, 3, 4, 5, "
    "6, 7>, alpha = array<f64: 1.0, 1.0>, beta = array<f64: 1.0, 0.1>}\n"
)


def _ir(spec: str = "[S0, R]", lc: str = "1", body: str = "", result: str = "8x4") -> str:
    return (
        "builtin.module {\n"
        + MESH
        + f"  func.func @main(%x: tensor<8x6xf32> {{sharding.spec = #sharding.spec<{spec}>}}, "
        "%w: tensor<6x4xf32>) -> tensor<8x4xf32> attributes {mesh.mesh = @mesh} {\n"
        f"    %y = lax.dot_general %x, %w {{dimension_numbers = #lax.dot<lhs_contracting = [{lc}], "
        "rhs_contracting = [0], lhs_batch = [], rhs_batch = []>} : "
        f"(tensor<8x6xf32>, tensor<6x4xf32>) -> tensor<{result}xf32>\n"
        + body
        + "    func.return %y : tensor<8x4xf32>\n  }\n}\n"
    )


def _collective(text: str) -> str:
    return _ir(body=f"    %z = {text} : tensor<8x4xf32>\n")


IR_CASES: list[tuple[str, str, str]] = [
    ("spec-axis-missing", _ir("[S7, R]"), r":3:3: .*names mesh axis 7, the mesh \[2, 4\] has 2"),
    ("spec-rank", _ir("[S0]"), r"spec \[S0\] has rank 1, the tensor \[8, 6\] has rank 2"),
    ("spec-not-dividing", _ir("[R, S1]"), "splits dimension 1 of size 6 into 4 shards"),
    ("spec-axis-twice", _ir("[S0, S0]"), "uses a mesh axis twice"),
    ("spec-partial-axis", _ir("[S0, R], partial = [5]"), "names mesh axis 5"),
    ("dot-dim-range", _ir(lc="2"), r":4:5: .*lhs contracting dimension 2 is out of range"),
    ("dot-dim-size", _ir(lc="0"), r"lhs 0 \(size 8\) and rhs 0 \(size 6\) differ in size"),
    (
        "dot-result-shape",
        _ir(result="8x5").replace("tensor<8x4xf32>", "tensor<8x5xf32>"),
        r"result shape \[8, 5\], the dimensions give \[8, 4\]",
    ),
    (
        "collective-axis",
        _collective("sharding.all_reduce %y {axes = array<i64: 3>}"),
        "mesh axis 3 does not exist on the 2-d mesh",
    ),
    (
        "collective-dim",
        _collective("sharding.all_gather %y {axes = array<i64: 1>, dim = 4}"),
        "dim 4 is out of range for the rank-2 operand",
    ),
    (
        "collective-axes-repeat",
        _collective("sharding.all_reduce %y {axes = array<i64: 1, 1>}"),
        "needs distinct mesh axes",
    ),
    ("mesh-missing", _ir().replace("mesh.mesh = @mesh", "mesh.mesh = @nope"), "names no mesh"),
    (
        "result-specs-count",
        _ir().replace(
            "rhs_batch = []>}",
            "rhs_batch = []>, sharding.specs = [#sharding.spec<[R, R]>, #sharding.spec<[R, R]>]}",
        ),
        "holds 2 specs for 1 results",
    ),
    (
        "unknown-key-impl",
        _ir().replace("tensor<6x4xf32>)", "tensor<6x4x!lax.key<xyz>>)", 1),
        r"unknown PRNG implementation 'xyz'; expected one of fry, rbg, urbg",
    ),
]


@pytest.mark.parametrize(("name", "text", "message"), IR_CASES, ids=[c[0] for c in IR_CASES])
def test_invalid_ir_is_refused(name: str, text: str, message: str) -> None:
    with pytest.raises(AlpaError, match=message) as info:
        alpa_ir.parse_module(text)
    assert "\n" not in str(info.value).strip()


@pytest.mark.parametrize(("name", "text", "message"), IR_CASES, ids=[c[0] for c in IR_CASES])
def test_invalid_ir_through_alpa_opt(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], name: str, text: str, message: str
) -> None:
    source = tmp_path / "in.mlir"
    source.write_text(text)
    assert alpa_opt_main([str(source)]) == 1
    err = capsys.readouterr().err
    assert err.startswith("alpa-opt: error: ") and err.count("\n") == 1
    assert "Traceback" not in err


REPRODUCERS: list[tuple[str, str, str]] = [
    ("no-header", _ir(), "not a reproducer: no line starts with"),
    (
        "unknown-argument",
        "// alpa-opt-reproducer: --evil=1\n" + _ir(),
        "unknown reproducer argument",
    ),
    ("no-pipeline", "// alpa-opt-reproducer: \n" + _ir(), "names no --pass-pipeline"),
    ("unbalanced-quote", "// alpa-opt-reproducer: --pass-pipeline='a\n" + _ir(), "malformed"),
    (
        "names-a-plugin",
        "// alpa-opt-reproducer: --pass-pipeline='builtin.module()' --load-plugin=os\n" + _ir(),
        "add --load-plugin=os",
    ),
]


@pytest.mark.parametrize(("name", "text", "message"), REPRODUCERS, ids=[c[0] for c in REPRODUCERS])
def test_bad_reproducers(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], name: str, text: str, message: str
) -> None:
    source = tmp_path / "case.reproducer.mlir"
    source.write_text(text)
    assert alpa_opt_main([str(source), "--run-reproducer"]) != 0
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1 and "Traceback" not in err


def test_user_errors_leave_no_reproducer_unless_asked(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A plan that does not fit is the user's error: no file in the temp directory."""
    import tempfile

    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    with pytest.raises(AlpaError):
        _run(
            alpa_ir.ShardParallel(
                auto_sharding_option=alpa_ir.AutoShardingOption(memory_budget=1.0)
            )
        )
    assert not list(tmp_path.glob("*.reproducer.mlir"))


def test_a_plugin_that_contributes_nothing_is_named(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """``--load-plugin`` of a module that implements no hook (``json``)."""
    source = tmp_path / "in.mlir"
    source.write_text(_ir())
    assert alpa_opt_main([str(source), "--load-plugin=json", "-p", "builtin.module()"]) != 0
    err = capsys.readouterr().err
    assert "plugin 'json' contributes nothing" in err and err.count("\n") == 1
    assert "Traceback" not in err
