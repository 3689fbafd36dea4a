"""The manifest of a checkpoint: its format, and the check that each leaf's
entry is one a reader can trust (shape, dtype that is array data, item name)."""

from __future__ import annotations

from typing import Any

import jax
import numpy as np

from alpa_ir.errors import AlpaError

FORMAT = "alpa_ir.api.checkpoint"
VERSION = 2
ARRAY_KINDS = ("array", "key", "python")


def array_dtype(text: str) -> np.dtype | None:
    """The dtype named ``text`` when it is one of array data (booleans and
    numbers, JAX's bfloat16, float8 and int4 included); None for unknown names
    and for objects, strings, bytes, void records and dates."""
    try:
        dtype = np.dtype(jax.numpy.dtype(text))
    except (TypeError, ValueError):
        return None
    if dtype == np.bool_ or jax.dtypes.issubdtype(dtype, np.number):
        return dtype
    return None


def check_manifest(label: str, manifest: Any) -> dict[str, Any]:
    """``manifest`` when it is an alpa_ir manifest of this version with sound
    leaf entries; else a one-line error starting with ``label``."""
    if not isinstance(manifest, dict) or manifest.get("format") != FORMAT:
        raise AlpaError(f"{label}: the manifest is not an alpa_ir checkpoint manifest")
    if manifest.get("version") != VERSION:
        raise AlpaError(
            f"{label}: manifest version {manifest.get('version')!r}, this reader knows {VERSION}"
        )
    leaves = manifest.get("leaves")
    if not isinstance(leaves, list) or not isinstance(manifest.get("treedef"), str):
        raise AlpaError(f"{label}: the manifest has no leaves or no tree structure")
    items: set[str] = set()
    for k, entry in enumerate(leaves):
        _check_entry(label, k, entry)
        if entry.get("kind") != "static":
            if entry["item"] in items:
                raise AlpaError(f"{label}: leaf {entry['path']} reuses item {entry['item']}")
            items.add(entry["item"])
    return manifest


def _check_entry(label: str, k: int, entry: Any) -> None:
    if not isinstance(entry, dict) or not isinstance(entry.get("path"), str):
        raise AlpaError(f"{label}: manifest leaf {k} is malformed")
    name = entry["path"]
    if entry.get("kind") == "static":
        return
    if entry.get("kind") not in ARRAY_KINDS:
        raise AlpaError(f"{label}: leaf {name} has unknown kind {entry.get('kind')!r}")
    shape, dtype, item = entry.get("shape"), entry.get("dtype"), entry.get("item")
    if not (
        isinstance(shape, list)
        and all(isinstance(d, int) and not isinstance(d, bool) and d >= 0 for d in shape)
        and isinstance(dtype, str)
        and isinstance(item, str)
        and item.startswith("leaf")
        and item[4:].isdigit()
        and isinstance(entry.get("checksum"), str)
    ):
        raise AlpaError(f"{label}: leaf {name} has a malformed manifest entry")
    if array_dtype(dtype) is None:
        try:
            np.dtype(jax.numpy.dtype(dtype))
        except (TypeError, ValueError):
            raise AlpaError(f"{label}: leaf {name} has unknown dtype {dtype!r}") from None
        raise AlpaError(
            f"{label}: leaf {name} has dtype {dtype!r}, which is not array data (only booleans "
            "and numbers are saved)"
        )
