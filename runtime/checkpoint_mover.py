"""Moving a checkpoint written to a local cache into its directory, in the
background (Alpa's ``save_checkpoint(..., local_cache_dir=...)`` and its
daemon move workers).

:func:`move_tree` moves every entry of a cache folder into the checkpoint
directory: an entry the directory lacks is renamed into it (on another file
system: copied under a temporary name, then renamed), so a reader never sees
half of one; folders present on both sides are merged. A
:class:`MoveWorker` is a Ray actor on one node that runs the moves of that
node's cache in the order they were asked for; ``sync`` answers once the
earlier moves are done, with the errors they met.
"""

from __future__ import annotations

import os
import shutil
import uuid
from pathlib import Path
from typing import Any

NAME_PREFIX = "alpa_ir.move_worker."


def mover_name(node_id: str) -> str:
    """The Ray actor name of the move worker of node ``node_id``."""
    return NAME_PREFIX + node_id


def move_tree(src: str | os.PathLike[str], dst: str | os.PathLike[str]) -> None:
    """Move every entry of the folder ``src`` into the folder ``dst`` (module
    docstring), then remove ``src``."""
    source, target = Path(src), Path(dst)
    target.mkdir(parents=True, exist_ok=True)
    for entry in sorted(source.iterdir()):
        there = target / entry.name
        if entry.is_dir() and not entry.is_symlink() and there.is_dir():
            move_tree(entry, there)
            continue
        try:
            os.replace(entry, there)  # the same file system: one atomic rename
        except OSError:
            staged = target / f".{entry.name}.{uuid.uuid4().hex}.moving"
            if entry.is_dir() and not entry.is_symlink():
                shutil.copytree(entry, staged, symlinks=True)
                if there.exists():
                    shutil.rmtree(there)
                os.replace(staged, there)
                shutil.rmtree(entry)
            else:
                shutil.copy2(entry, staged, follow_symlinks=False)
                os.replace(staged, there)
                entry.unlink()
    source.rmdir()


class MoveWorker:
    """A Ray actor that moves cached checkpoints on its node (module docstring)."""

    def __init__(self) -> None:
        self.errors: list[str] = []
        self.handle: Any = None

    def keep(self, handle: Any) -> None:
        """Hold a handle to this actor, so that it lives as long as the driver
        (Ray collects an actor when its creator's handles are gone); the
        first handle is kept (those found by name later do not count)."""
        if self.handle is None:
            self.handle = handle

    def move(self, src: str, dst: str) -> None:
        try:
            move_tree(src, dst)
        except OSError as err:
            self.errors.append(f"moving {src} into {dst}: {err.strerror or err}")

    def sync(self) -> list[str]:
        """Once the moves asked for before are done: the errors they met."""
        errors, self.errors = self.errors, []
        return errors
