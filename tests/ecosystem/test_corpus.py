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


def test_a_third_valid_execution_widens_the_tolerance_by_its_own_difference() -> None:
    """``compare``'s ``want3`` counts ``|want - want3|`` as noise, like
    ``want2``: an error within 4x of it passes, one beyond it still fails."""
    import numpy as np

    case = corpus.Case(name="synthetic", library="none", build=lambda: None, steps=1, atol=0.0)
    want = [{"w": np.array([1.0, 2.0], np.float32)}]
    got = [{"w": np.array([1.0, 2.001], np.float32)}]  # 1e-3 off, rtol 1e-4: 2e-4 allowed
    with pytest.raises(AssertionError, match="max error"):
        corpus.compare(got, want, want, case)
    near = [{"w": np.array([1.0, 2.0003], np.float32)}]  # noise 3e-4: 4x covers 1e-3
    corpus.compare(got, want, want, case, near)
    far_off = [{"w": np.array([1.0, 2.0001], np.float32)}]  # noise 1e-4: 4x does not
    with pytest.raises(AssertionError, match="max error"):
        corpus.compare(got, want, want, case, far_off)
