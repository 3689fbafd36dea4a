"""The pytree structures a module's ``@main`` records, for calling it with the user's pytrees."""

from __future__ import annotations

from xdsl.dialects import func
from xdsl.dialects.builtin import StringAttr

from alpa_ir.frontend.jaxpr_import import IN_TREE_ATTR, OUT_TREE_ATTR
from alpa_ir.frontend.pytree_codec import TreeTexts


def tree_texts(function: func.FuncOp) -> TreeTexts:
    """The pytree structures @main records (``alpa.in_tree``, ``alpa.out_tree``)."""

    def text(attr: str) -> str | None:
        value = function.attributes.get(attr)
        return value.data if isinstance(value, StringAttr) else None

    return TreeTexts(text(IN_TREE_ATTR), text(OUT_TREE_ATTR))
