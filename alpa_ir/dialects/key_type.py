"""The element type of JAX's typed PRNG keys: ``!lax.key<fry>``.

A key array (``jax.random.key(0)``, or the typed keys that ``random_wrap``
makes of a raw ``uint32[2]`` key inside ``jax.random.split``) has JAX's
extended dtype ``key<impl>``, where ``impl`` is the tag of its PRNG
implementation (``fry`` for threefry2x32, ``rbg``, ``urbg``). In the IR it is
the element type of an ordinary tensor: ``tensor<2x!lax.key<fry>>``. This
module needs nothing but xDSL, so that :mod:`alpa_ir.dialects.types` can map it
without importing a dialect.
"""

from __future__ import annotations

from collections.abc import Sequence

from xdsl.dialects.builtin import StringAttr
from xdsl.ir import Attribute, ParametrizedAttribute, TypeAttribute
from xdsl.irdl import irdl_attr_definition
from xdsl.parser import AttrParser
from xdsl.printer import Printer

KEY_WORDS = 2
"""uint32 words per key of the implementations JAX ships (threefry2x32: 2;
rbg and unsafe_rbg keys have 4, see :data:`KEY_SHAPES`)."""

KEY_SHAPES: dict[str, tuple[int, ...]] = {"fry": (2,), "rbg": (4,), "urbg": (4,)}
"""The raw ``uint32`` shape of one key, by implementation tag."""


@irdl_attr_definition
class KeyType(ParametrizedAttribute, TypeAttribute):
    """A typed PRNG key of implementation ``impl`` (JAX's ``key<impl>`` dtype)."""

    name = "lax.key"
    impl: StringAttr

    @classmethod
    def parse_parameters(cls, parser: AttrParser) -> Sequence[Attribute]:
        parser.parse_punctuation("<")
        impl = parser.parse_identifier()
        parser.parse_punctuation(">")
        if impl not in KEY_SHAPES:
            parser.raise_error(
                f"unknown PRNG implementation '{impl}'; expected one of {', '.join(KEY_SHAPES)}"
            )
        return [StringAttr(impl)]

    def print_parameters(self, printer: Printer) -> None:
        printer.print_string(f"<{self.impl.data}>")

    @property
    def tag(self) -> str:
        return self.impl.data

    @property
    def itemsize(self) -> int:
        """Bytes of one key."""
        size = 4
        for d in KEY_SHAPES[self.tag]:
            size *= d
        return size
