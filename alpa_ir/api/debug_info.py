"""``dump_debug_info(folder)`` of the executables: the plan as files.

Each executable writes what a user (or a bug report) needs to see how its step
was compiled: the module as imported (``input_module.mlir``), the pass
pipeline that planned it (``pass_pipeline.txt``, replayable with ``alpa-opt``),
the planned module (``module.mlir``), a readable summary of the plan
(``plan.txt``) and the HLO XLA compiled for every program (``hlo/*.hlo``).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path

from alpa_ir.errors import AlpaError


def write_debug_info(folder: str | os.PathLike[str], files: Mapping[str, str]) -> Path:
    """Write ``files`` (relative path -> text) under ``folder``; returns the folder."""
    root = Path(folder)
    try:
        root.mkdir(parents=True, exist_ok=True)
        for name, text in files.items():
            path = root / name
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(text if text.endswith("\n") else text + "\n")
    except OSError as err:
        raise AlpaError(f"dump_debug_info: cannot write to {root}: {err.strerror}") from None
    return root
