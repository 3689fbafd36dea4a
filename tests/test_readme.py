"""README's Python snippets run as written, one after the other in one
namespace (the second continues the first), in a scratch directory."""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest

README = Path(__file__).resolve().parent.parent / "README.md"


def _snippets() -> list[str]:
    return re.findall(r"^```python\n(.*?)^```$", README.read_text(), flags=re.S | re.M)


def test_readme_has_python_snippets() -> None:
    assert len(_snippets()) >= 2


def test_readme_snippets_run(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    namespace: dict[str, object] = {"__name__": "__readme__"}
    for k, code in enumerate(_snippets()):
        exec(compile(code, f"README.md snippet {k + 1}", "exec"), namespace)
    assert os.path.isdir(tmp_path / "ckpt")
