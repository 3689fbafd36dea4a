"""``alpa.testing.assert_allclose``: two results compared leaf by leaf."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

import numpy as np


def assert_allclose(x: Any, y: Any, rtol: float = 1e-4, atol: float = 1e-4) -> None:
    """Assert that ``x`` and ``y`` hold the same structure of close values, as
    Alpa's helper: mappings (dict, ``FrozenDict``) by key, sequences
    element by element, arrays and scalars by ``np.testing.assert_allclose``,
    other registered pytrees (a ``TrainState``) by their leaves, anything else
    by equality. A mismatch raises ``AssertionError`` naming where."""
    _compare(x, y, rtol, atol, "")


def _compare(x: Any, y: Any, rtol: float, atol: float, where: str) -> None:
    at = where or "the top"
    if isinstance(x, Mapping):
        assert isinstance(y, Mapping), f"at {at}: a mapping against {type(y).__name__}"
        assert set(x) == set(y), f"at {at}: keys {sorted(map(str, x))} != {sorted(map(str, y))}"
        for k in x:
            _compare(x[k], y[k], rtol, atol, f"{where}[{k!r}]")
    elif isinstance(x, str | bytes):
        assert x == y, f"at {at}: {x!r} != {y!r}"
    elif hasattr(x, "__array__") or np.isscalar(x):
        assert hasattr(y, "__array__") or np.isscalar(y), f"at {at}: an array against {y!r}"
        np.testing.assert_allclose(np.asarray(x), np.asarray(y), rtol, atol, err_msg=f"at {at}")
    elif isinstance(x, Iterable) and not isinstance(x, str):
        assert isinstance(y, Iterable) and not isinstance(y, str), (
            f"at {at}: a sequence against {type(y).__name__}"
        )
        xs, ys = list(x), list(y)
        assert len(xs) == len(ys), f"at {at}: {len(xs)} elements against {len(ys)}"
        for k, (a, b) in enumerate(zip(xs, ys, strict=True)):
            _compare(a, b, rtol, atol, f"{where}[{k}]")
    else:
        import jax

        xs, x_tree = jax.tree.flatten(x)
        if len(xs) == 1 and xs[0] is x:  # not a container: compared by equality
            assert x == y, f"at {at}: {x!r} != {y!r}"
            return
        ys, y_tree = jax.tree.flatten(y)
        assert x_tree == y_tree, f"at {at}: structure {x_tree} != {y_tree}"
        for k, (a, b) in enumerate(zip(xs, ys, strict=True)):
            _compare(a, b, rtol, atol, f"{where}.leaf{k}")


class HloParser:
    """Alpa's helpers that read the entry computation of HLO text: its
    parameter line and ROOT line, and the array shapes (``f32[2,4]``) of the
    parameters and of the root tuple, in order."""

    @staticmethod
    def get_param_line(text: str) -> str:
        """The ``ENTRY`` line (the entry computation's parameters)."""
        entry = text[text.find("ENTRY") :]
        return entry.split("\n", 1)[0]

    @staticmethod
    def get_root_line(text: str) -> str:
        """The entry computation's ``ROOT`` line."""
        entry = text[text.find("ENTRY") :]
        root = entry[entry.find("ROOT") :]
        return root.split("\n", 1)[0]

    @staticmethod
    def parse_param_shapes(text: str) -> tuple[str, ...]:
        """The parameters' array types on an ``ENTRY`` line, layouts dropped."""
        import re

        params = text[text.find("(") + 1 : text.rfind("->")]
        return tuple(re.findall(r"\b[a-z]+\d*\[[\d,]*\]", params))

    @staticmethod
    def parse_root_shapes(text: str) -> tuple[str, ...]:
        """The array types of a ``ROOT`` tuple line's result, layouts dropped."""
        import re

        result = text[text.find("=") + 1 :]
        result = result[: result.find("tuple(")] if "tuple(" in result else result
        return tuple(re.findall(r"\b[a-z]+\d*\[[\d,]*\]", result))
