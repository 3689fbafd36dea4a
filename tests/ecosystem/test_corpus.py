"""The ecosystem corpus under pytest: every case of ``corpus.CASES`` in every
mode (``a``: import_jax + execute, ``b``: ShardParallel on (2, 4), ``c``:
PipeshardParallel with 2 micro-batches and 2 stages) equals the single-device
``jax.jit`` step, to a tolerance whose noise term comes from a second valid
execution (see ``corpus.compare``). Any exception out of the alpa_ir API must
be an ``alpa_ir.AlpaError``.

Run it alone with ``pytest -m corpus tests/ecosystem``; print the whole table
with ``python tests/ecosystem/corpus.py``."""

from __future__ import annotations

import corpus
import pytest

import alpa_ir

# A case's modes share its references (cached per process): under
# ``pytest -n 2 --dist loadgroup`` they run in one worker.
PARAMS = [
    pytest.param(name, mode, id=f"{name}-{mode}", marks=pytest.mark.xdist_group(name))
    for name in corpus.CASES
    for mode in corpus.MODES
]


@pytest.mark.corpus
@pytest.mark.parametrize(("name", "mode"), PARAMS)
def test_case_matches_one_device(name: str, mode: str) -> None:
    """``corpus.check_mode``: runs the mode inside ``corpus.alpa_api`` (an
    exception out of alpa_ir that is not an ``alpa_ir.AlpaError`` fails as
    ``NotAlpaError``), compares every output leaf of every step with the
    reference, and in mode ``c`` of a step with batch statistics compares
    with the micro-batched reference and requires the micro-batch warning."""
    try:
        corpus.check_mode(corpus.CASES[name], mode)
    except alpa_ir.AlpaError:
        raise
    except corpus.NotAlpaError as exc:
        pytest.fail(str(exc))
