"""Garbage collection while planning: frozen_heap."""

from __future__ import annotations

import gc

from alpa_ir.ir.collection import frozen_heap


def test_frozen_heap_leaves_what_exists_out_and_puts_it_back() -> None:
    assert gc.get_freeze_count() == 0
    kept = [object() for _ in range(10)]
    with frozen_heap():
        assert gc.get_freeze_count() >= len(kept)  # the heap as it was, out of collections
    assert gc.get_freeze_count() == 0


def test_frozen_heap_leaves_someone_elses_freeze_alone() -> None:
    gc.freeze()
    try:
        frozen = gc.get_freeze_count()
        with frozen_heap():
            assert gc.get_freeze_count() == frozen  # nothing more frozen
        assert gc.get_freeze_count() == frozen  # and theirs still frozen
    finally:
        gc.unfreeze()
