"""The pytree codec: structures as text and back (decode_treedef never imports
or runs code named in the text), structure keys, static leaves, leaf names."""

from __future__ import annotations

import dataclasses
from typing import Any, NamedTuple

import jax
import numpy as np
import pytest

from alpa_ir.errors import AlpaError
from alpa_ir.frontend.pytree_codec import (
    decode_treedef,
    encode_treedef,
    flat_names,
    same_structure,
    static_leaves,
    structure_key,
)


class Pair(NamedTuple):
    first: Any
    second: Any


@jax.tree_util.register_dataclass
@dataclasses.dataclass
class Params:
    w: Any
    b: Any


class Opaque:
    """A node whose auxiliary data is no literal (an object, like a TrainState's apply_fn)."""

    def __init__(self, x: Any, tag: object) -> None:
        self.x, self.tag = x, tag


jax.tree_util.register_pytree_node(
    Opaque, lambda o: ((o.x,), o.tag), lambda tag, children: Opaque(children[0], tag)
)

TREE = {"params": Params(w=np.ones(2), b=[np.zeros(1), None]), "pair": Pair(1.0, (2.0, 3.0))}


def test_a_structure_reads_back_as_the_same_treedef() -> None:
    treedef = jax.tree.structure(TREE)
    text = encode_treedef(treedef)
    assert "Params" in text and "Pair" in text and "'params'" in text
    assert decode_treedef(text) == treedef
    assert same_structure(text, treedef)


def test_an_opaque_node_is_described_and_rebuilt_from_a_known_tree() -> None:
    tree = Opaque(np.ones(2), object())
    treedef = jax.tree.structure(tree)
    text = encode_treedef(treedef)
    assert "opaque: <object object at" in text
    assert decode_treedef(text, known=[treedef]) == treedef
    # the key leaves the description (it may hold an address) out
    other = jax.tree.structure(Opaque(np.ones(2), object()))
    assert structure_key(treedef) == structure_key(other)


def test_structures_that_differ_have_different_keys() -> None:
    a = jax.tree.structure({"w": 1, "b": 2})
    b = jax.tree.structure({"w": 1, "c": 2})
    c = jax.tree.structure({"w": 1, "b": (2,)})
    assert len({structure_key(a), structure_key(b), structure_key(c)}) == 3
    assert not same_structure(encode_treedef(a), b)


def test_static_leaves_are_marked_with_their_values() -> None:
    treedef = jax.tree.structure((np.ones(2), "relu", 0.5))
    text = encode_treedef(treedef, statics={1: "relu", 2: 0.5})
    assert static_leaves(text) == {1: "'relu'", 2: "0.5"}
    assert static_leaves(encode_treedef(treedef)) == {}


def test_text_that_is_no_literal_is_refused_without_running_it() -> None:
    with pytest.raises(AlpaError, match=r"^malformed pytree text: __import__\('os'\)"):
        decode_treedef("__import__('os').system('false')")


def test_unknown_node_types_are_not_imported() -> None:
    text = "('alpa_ir_no_such_module:Thing', None, ('*',))"
    with pytest.raises(AlpaError, match="'alpa_ir_no_such_module:Thing': it is not loaded"):
        decode_treedef(text)
    # a loaded class that is no pytree node type: one error, not JAX's RuntimeError
    text = "('json.decoder:JSONDecoder', None, ('*',))"
    with pytest.raises(AlpaError, match=r"cannot rebuild pytree node 'json\.decoder:JSONDecoder'"):
        decode_treedef(text)


def test_leaf_names_follow_key_paths() -> None:
    names = flat_names((TREE, np.ones(3)), ["state", "batch"])
    assert names == [
        "state.pair.first",
        "state.pair.second.0",
        "state.pair.second.1",
        "state.params.w",
        "state.params.b.0",
        "batch",
    ]
