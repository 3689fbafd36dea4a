"""Checkpoints of a training state on orbax-checkpoint, independent of the plan (import alpa_ir.api.checkpoint).

    alpa_ir.save_checkpoint("ckpt", state, step=2)
    state = alpa_ir.restore_checkpoint("ckpt", target=executable)

A checkpoint is an orbax ``CheckpointManager`` directory: one committed step
(``ckpt/2/``) holding two items, ``state`` (every array leaf, saved by orbax
from the shards each process holds, never gathered: multi-host saves each
host's shards) and ``manifest`` (JSON: the pytree structure as text, each
leaf's path, shape, dtype and checksum). Only global values are stored, never
a mesh or a sharding, so a checkpoint written under one plan (ZeRO-3 on
(1, 4), a pipeline over several meshes, several hosts) restores under any
other: orbax reads, for each device of the target placement, its slice.

Safety, by orbax's commit protocol: a step is written into a temporary
directory and renamed once complete, so a save killed mid-write (SIGKILL at
any moment) leaves the previous step restorable, and the next save clears
the debris; overwriting writes the new step first and deletes the old one
only once the new one is committed, so the path always holds a complete
checkpoint. A save that fails (no space left, a read-only file system) is a
one-line error naming the leaf being written and the cause, its partial step
removed at once; orbax runs synchronously, so no thread of it outlives the
call and orbax logs nothing on the way.

Integrity: every leaf carries a checksum of its values and their positions
(a sum over elements, so any sharding computes the same), checked after each
restore; a file that was edited, truncated or removed, a manifest that does
not parse, lies about a shape or names a dtype that is not array data give a
one-line :class:`~alpa_ir.errors.AlpaError` naming the checkpoint, the step,
the leaf and orbax's reason. Confinement: a step holding a symbolic link
that leads out of it is refused before anything is read, and a save never
writes through such a link. Restoring never imports a module named in the
data (node types resolve only among loaded types, see
:mod:`alpa_ir.frontend.pytree_codec`).

Leaves: arrays (any numeric or boolean dtype; PRNG keys as their key data,
restored as keys), Python ints (restored as 0-d arrays); leaves that are not
arrays (an equinox module's functions, Python bools and floats) are written
into the manifest when they are literals and otherwise come from ``target``.

Modules: :mod:`.checksums`, :mod:`.manifest` (format and its check),
:mod:`.confinement` (links), :mod:`.orbax_io` (orbax, its errors and logs),
:mod:`.save`, :mod:`.restore`.
"""

from __future__ import annotations

from alpa_ir.api.checkpoint.checksums import checksum
from alpa_ir.api.checkpoint.manifest import FORMAT, VERSION
from alpa_ir.api.checkpoint.orbax_io import latest_step, write_checkpoint
from alpa_ir.api.checkpoint.restore import read_manifest, restore_checkpoint
from alpa_ir.api.checkpoint.save import save_checkpoint

__all__ = [
    "FORMAT",
    "VERSION",
    "checksum",
    "latest_step",
    "read_manifest",
    "restore_checkpoint",
    "save_checkpoint",
    "write_checkpoint",
]
