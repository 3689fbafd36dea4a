"""The mesh, sharding and pipeline dialects load without JAX (only the lax
dialect's parameter codecs need it), so a tool that reads plans stays light."""

from __future__ import annotations

import subprocess
import sys


def test_the_plan_dialects_do_not_import_jax() -> None:
    code = (
        "import sys\n"
        "import alpa_ir.dialects.mesh, alpa_ir.dialects.sharding, alpa_ir.dialects.pipeline\n"
        "print(sorted(m for m in sys.modules if m == 'jax' or m.startswith('jax.')))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True
    )
    assert done.stdout.strip() == "[]", done.stdout
