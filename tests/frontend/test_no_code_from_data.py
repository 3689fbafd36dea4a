"""Data never makes code run: parsing a module, restoring a checkpoint and
replaying a reproducer import nothing named in the data. Each test names a
module that writes a marker file when imported, puts it on ``sys.path``,
and checks that the marker is never written."""

from __future__ import annotations

import json
import sys
from collections.abc import Iterator
from pathlib import Path

import jax.numpy as jnp
import pytest

import alpa_ir
from alpa_ir.errors import AlpaError
from alpa_ir.tools.alpa_opt import main as alpa_opt_main

MODULE = "alpa_marker_payload"


@pytest.fixture
def marker(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """A module that, imported, writes ``marker``; it is importable from sys.path."""
    out = tmp_path / "imported.txt"
    source = tmp_path / "src"
    source.mkdir()
    (source / f"{MODULE}.py").write_text(
        f"from pathlib import Path\nPath({str(out)!r}).write_text('imported')\nclass Thing: pass\n"
    )
    monkeypatch.syspath_prepend(str(source))
    sys.modules.pop(MODULE, None)
    yield out
    sys.modules.pop(MODULE, None)


def _module_text() -> str:
    module = alpa_ir.import_jax(lambda x: {"y": x * 2}, jnp.ones(3))
    return str(module)


def test_parsing_and_running_a_module_imports_nothing(marker: Path) -> None:
    text = _module_text().replace(
        "alpa.out_tree = \"('dict', ['y'], ('*',))\"",
        f"alpa.out_tree = \"('{MODULE}:Thing', None, ('*',))\"",
    )
    assert MODULE in text
    module = alpa_ir.parse_module(text)
    with pytest.raises(AlpaError, match="not loaded in this process"):
        alpa_ir.execute(module, jnp.ones(3))
    assert not marker.exists()


def test_restoring_a_checkpoint_imports_nothing(marker: Path, tmp_path: Path) -> None:
    path = alpa_ir.save_checkpoint(tmp_path / "ckpt", {"w": jnp.ones(3)})
    [step] = [p for p in path.iterdir() if p.name.isdigit()]
    file = step / "manifest" / "metadata"
    manifest = json.loads(file.read_text())
    manifest["treedef"] = f"('{MODULE}:Thing', None, ('*',))"
    file.write_text(json.dumps(manifest))
    with pytest.raises(AlpaError, match="not loaded in this process"):
        alpa_ir.restore_checkpoint(path)
    assert not marker.exists()


def test_replaying_a_reproducer_imports_nothing(
    marker: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    reproducer = tmp_path / "case.reproducer.mlir"
    reproducer.write_text(
        "// alpa_ir reproducer: pass 'merge-trivial-ops' failed: boom\n"
        f"// alpa-opt-reproducer: --pass-pipeline='builtin.module(merge-trivial-ops)' "
        f"--load-plugin={MODULE}\n" + _module_text()
    )
    assert alpa_opt_main([str(reproducer), "--run-reproducer"]) != 0
    err = capsys.readouterr().err
    assert f"add --load-plugin={MODULE}" in err and "Traceback" not in err
    assert not marker.exists()
