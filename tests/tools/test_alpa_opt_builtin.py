"""alpa-opt and the pass manager with the real built-in plugin (lax dialect, JAX import)."""

from __future__ import annotations

from pathlib import Path

import jax.numpy as jnp
import pytest

from alpa_ir import import_jax
from alpa_ir.errors import PassFailure
from alpa_ir.ir.context import make_context
from alpa_ir.ir.text import parse_module, print_module
from alpa_ir.passmanager.pass_manager import PassManager
from alpa_ir.passmanager.pipeline_syntax import format_pipeline, parse_pipeline
from alpa_ir.plugins.registry import PluginRegistry, default_registry, load_registry
from alpa_ir.tools.alpa_opt import main

FIXTURES = Path(__file__).resolve().parents[1] / "plugins_fixture"


def _mlp(x: jnp.ndarray, w: jnp.ndarray) -> jnp.ndarray:
    return jnp.tanh(x @ w).sum(axis=0) * 2.0 + 1.0


def _mlp_args() -> tuple[jnp.ndarray, jnp.ndarray]:
    return jnp.ones((4, 8), jnp.float32), jnp.ones((8, 16), jnp.float32)


def mlp_factory() -> tuple[object, tuple[jnp.ndarray, jnp.ndarray]]:
    """An ``--import`` factory: (fn, example_args)."""
    return _mlp, _mlp_args()


@pytest.fixture
def registry(monkeypatch: pytest.MonkeyPatch) -> PluginRegistry:
    monkeypatch.syspath_prepend(str(FIXTURES))
    return load_registry(["alpa_testing_passes"], entry_points=False)


def test_builtin_pipeline_round_trips() -> None:
    registry = default_registry()
    passes = parse_pipeline("builtin.module(merge-trivial-ops)", registry)
    assert parse_pipeline(format_pipeline(passes), registry) == passes


def test_pass_manager_on_imported_lax_module(registry: PluginRegistry) -> None:
    module = import_jax(_mlp, *_mlp_args())
    dumps: list[str] = []
    manager = PassManager(
        registry, "merge-trivial-ops", print_ir_after={"merge-trivial-ops"}, ir_printer=dumps.append
    )
    ctx = make_context(registry)
    result = manager.execute(module, ctx)
    assert [t.name for t in result.timings] == ["merge-trivial-ops", "(verifier)"]
    [dump] = dumps
    assert dump.startswith("// -----// IR Dump After merge-trivial-ops //----- //\n")
    text = print_module(result.module)
    assert "lax." in text
    assert print_module(parse_module(text, ctx=ctx)) == text  # the output re-parses exactly


def test_reproducer_of_lax_module_reruns(
    registry: PluginRegistry, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    module = import_jax(_mlp, *_mlp_args())
    manager = PassManager(registry, "merge-trivial-ops,test-fail", reproducer_dir=tmp_path)
    with pytest.raises(PassFailure) as info:
        manager.run(module, make_context(registry))
    reproducer = str(info.value.reproducer)
    assert "lax." in Path(reproducer).read_text()
    code = main(
        [
            reproducer,
            "--run-reproducer",
            "--load-plugin=alpa_testing_passes",
            "--reproducer",
            str(tmp_path / "again"),
        ]
    )
    assert code == 1
    assert capsys.readouterr().err.startswith(
        "alpa-opt: error: pass 'test-fail' failed: RuntimeError: boom (reproducer: "
    )


def test_import_runs_the_pipeline_and_prints_parsable_ir(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.syspath_prepend(str(Path(__file__).parent))
    out = tmp_path / "out.mlir"
    spec = f"{Path(__file__).stem}:mlp_factory"
    assert main(["--import", spec, "-p", "merge-trivial-ops", "-o", str(out), "--timing"]) == 0
    err = capsys.readouterr().err
    assert "  Import\n" in err and "  merge-trivial-ops\n" in err
    text = out.read_text()
    assert text.startswith("builtin.module {\n  func.func @main(")
    assert main([str(out), "-p", "merge-trivial-ops"]) == 0  # what it printed, it reads back
    assert capsys.readouterr().out == text


@pytest.mark.slow
def test_import_gpt_tiny_step_end_to_end(capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["--import", "alpa_ir.models:gpt_tiny_step", "-p", "merge-trivial-ops"])
    out, err = capsys.readouterr()
    assert (code, err) == (0, "")
    assert out.startswith("builtin.module {\n  func.func @main(")
    assert "lax.dot_general" in out
