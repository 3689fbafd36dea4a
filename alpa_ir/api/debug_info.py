"""``dump_debug_info(folder)`` of the executables: the plan as files.

Each executable writes what a user (or a bug report) needs to see how its step
was compiled: the module as imported (``input_module.mlir``), the pass
pipeline that planned it (``pass_pipeline.txt``, replayable with ``alpa-opt``),
the planned module (``module.mlir``), a readable summary of the plan
(``plan.txt``) and the HLO XLA compiled for every program (``hlo/*.hlo``),
and what Alpa's ``dump_debug_info`` writes besides its HLO: the bytes a
device allocates (``mem_usage.txt``, per program for a pipeline) and where
every input and output lives (``input_placement_specs.txt``,
``output_placement_specs.txt``).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from alpa_ir.errors import AlpaError


def alpa_files(executable: Any) -> dict[str, str]:
    """``mem_usage.txt`` and the placement specs of ``executable`` (module docstring)."""
    sizes = getattr(executable, "get_allocation_sizes", None)
    per_program = sizes() if sizes is not None else {}
    lines = [f"{name}: {size / 1024**3:.3f} GB" for name, size in per_program.items()]
    total = max(per_program.values()) if per_program else executable.get_total_allocation_size()
    lines.append(f"total_allocation_size: {total / 1024**3:.3f} GB ({total} bytes)")
    return {
        "mem_usage.txt": "\n".join(lines),
        "input_placement_specs.txt": str(executable.get_input_placement_specs()),
        "output_placement_specs.txt": str(executable.get_output_placement_specs()),
    }


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
