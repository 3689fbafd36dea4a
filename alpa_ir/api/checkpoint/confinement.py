"""A checkpoint holds no way out of itself: symbolic links that lead outside
the folder being read or written are refused before anything is read or written."""

from __future__ import annotations

import os
from pathlib import Path

from alpa_ir.errors import AlpaError


def escaping_link(folder: Path) -> tuple[Path, Path] | None:
    """The first symbolic link at or under ``folder`` (files and folders, not
    followed) whose target resolves outside ``folder``, with that target."""
    inside = folder.resolve()
    for dirpath, dirnames, filenames in os.walk(inside, followlinks=False):
        for name in sorted(dirnames + filenames):
            entry = Path(dirpath) / name
            if entry.is_symlink():
                target = entry.resolve()
                if not target.is_relative_to(inside):
                    return entry, target
    return None


def check_step_confined(label: str, root: Path, step_dir: Path) -> None:
    """Refuse a step (``root/<step>``) that is, or holds, a link leading out of it."""
    root = root.resolve()
    if step_dir.is_symlink() and not step_dir.resolve().is_relative_to(root):
        raise AlpaError(
            f"{label}: the step folder {step_dir.name} is a symbolic link to "
            f"{step_dir.resolve()}, outside the checkpoint; nothing was read"
        )
    found = escaping_link(step_dir)
    if found is not None:
        entry, target = found
        raise AlpaError(
            f"{label}: {_inside(entry, root)} is a symbolic link to {target}, outside the "
            "checkpoint; nothing was read"
        )


def check_save_confined(where: Path) -> None:
    """Refuse to save into a checkpoint folder holding a link that leads out of
    it (a save would write or delete through it)."""
    if not where.is_dir():
        return
    found = escaping_link(where)
    if found is not None:
        entry, target = found
        raise AlpaError(
            f"cannot save checkpoint {where}: {_inside(entry, where.resolve())} is a symbolic "
            f"link to {target}, outside the checkpoint; saving never writes through one"
        )


def _inside(entry: Path, root: Path) -> str:
    """``entry`` relative to the checkpoint when it is under it."""
    return str(entry.relative_to(root)) if entry.is_relative_to(root) else str(entry)
