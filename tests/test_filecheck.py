"""Run the lit + filecheck tests under tests/filecheck, so that `pytest` runs everything."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

FILECHECK_DIR = Path(__file__).parent / "filecheck"


def test_lit_filecheck_suite() -> None:
    """Every ``*.mlir`` test passes (lit from this interpreter's environment)."""
    done = subprocess.run(
        [sys.executable, "-c", "from lit.main import main; main()", "-q", str(FILECHECK_DIR)],
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert done.returncode == 0, f"lit failed:\n{done.stdout}\n{done.stderr}"
