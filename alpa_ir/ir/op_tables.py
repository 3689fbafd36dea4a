"""IR sent to another process as an *op table*: a nested tuple per op (its
name, operand numbers, result types, attributes, properties, location,
successors and regions) over one list of the distinct attributes, pickled.

xDSL prints and parses IR text op by op in Python. For one of GPT-2
small's layer functions (1,450 ops): 0.075 s to print, 0.23 to 0.75 s to
parse in a fresh process; as an op table, 0.02 s to build and 0.015 s to
rebuild. The rebuilt IR prints exactly as the original did (locations and
name hints included). The costing workers receive their functions this way
(:mod:`alpa_ir.costs.costing_workers`).

An op's class is looked up by name in the receiver's context, as its parser
would; attributes are pickled, so an attribute class the receiving
interpreter cannot import cannot be sent. Values are numbered in the order
they are defined. IR that uses a value before the op defining it in walk
order (a multi-block region whose blocks are not in dominance order), or a
value from outside the op sent, raises :class:`NotTabulable`; the caller
sends text instead.
"""

from __future__ import annotations

import pickle
from typing import Any

from xdsl.context import Context
from xdsl.ir import Attribute, Block, Operation, Region, SSAValue


class NotTabulable(Exception):
    """IR an op table cannot hold (module docstring)."""


_Table = tuple[Any, ...]


class _Encoder:
    def __init__(self) -> None:
        self.attributes: list[Attribute] = []
        self._attribute_index: dict[Attribute, int] = {}
        self._values: dict[SSAValue, int] = {}
        self._blocks: dict[Block, int] = {}

    def attribute(self, attribute: Attribute) -> int:
        index = self._attribute_index.get(attribute)
        if index is None:
            index = self._attribute_index[attribute] = len(self.attributes)
            self.attributes.append(attribute)
        return index

    def define(self, value: SSAValue) -> None:
        self._values[value] = len(self._values)

    def named(self, items: dict[str, Attribute]) -> tuple[tuple[str, int], ...]:
        return tuple((name, self.attribute(a)) for name, a in items.items())

    def op(self, op: Operation) -> _Table:
        try:
            operands = tuple(self._values[v] for v in op.operands)
        except KeyError:
            raise NotTabulable(
                f"'{op.name}' uses a value defined after it or outside the IR sent"
            ) from None
        try:
            successors = tuple(self._blocks[b] for b in op.successors)
        except KeyError:
            raise NotTabulable(f"'{op.name}' branches out of its region") from None
        regions = tuple(self.region(r) for r in op.regions)
        for result in op.results:
            self.define(result)
        return (
            op.name,
            operands,
            tuple((self.attribute(r.type), r.name_hint) for r in op.results),
            self.named(op.properties),
            self.named(op.attributes),
            self.attribute(op.location),
            successors,
            regions,
        )

    def region(self, region: Region) -> _Table:
        for block in region.blocks:  # numbered first: a branch may go forward
            self._blocks[block] = len(self._blocks)
        return tuple(self.block(block) for block in region.blocks)

    def block(self, block: Block) -> _Table:
        args = []
        for arg in block.args:
            self.define(arg)
            args.append((self.attribute(arg.type), arg.name_hint, self.attribute(arg.location)))
        return (self._blocks[block], tuple(args), tuple(self.op(op) for op in block.ops))


class _Decoder:
    def __init__(self, attributes: list[Attribute], context: Context) -> None:
        self.attributes = attributes
        self.context = context
        self.values: list[SSAValue] = []
        self.blocks: dict[int, Block] = {}
        self._classes: dict[str, type[Operation]] = {}

    def op(self, table: _Table) -> Operation:
        name, operands, results, properties, attributes, location, successors, regions = table
        attrs = self.attributes
        cls = self._classes.get(name)
        if cls is None:
            cls = self._classes[name] = self.context.get_op(name)
        built_regions = [self.region(r) for r in regions]
        op = cls.create(
            operands=[self.values[k] for k in operands],
            result_types=[attrs[t] for t, _ in results],
            properties={name: attrs[k] for name, k in properties},
            attributes={name: attrs[k] for name, k in attributes},
            location=attrs[location],
            successors=[self.blocks[k] for k in successors],
            regions=built_regions,
        )
        for result, (_, hint) in zip(op.results, results, strict=True):
            result.name_hint = hint
            self.values.append(result)
        return op

    def region(self, blocks: _Table) -> Region:
        built = []
        for number, args, _ in blocks:  # made first: a branch may go forward
            block = Block(arg_types=[self.attributes[t] for t, _, _ in args])
            self.blocks[number] = block
            built.append(block)
        for block, (_, args, ops) in zip(built, blocks, strict=True):
            for arg, (_, hint, location) in zip(block.args, args, strict=True):
                arg.name_hint = hint
                arg.location = self.attributes[location]
                self.values.append(arg)
            block.add_ops(self.op(op) for op in ops)
        return Region(built)


def dump_op(op: Operation) -> bytes:
    """``op`` (regions and all) as a pickled op table; :class:`NotTabulable`
    for IR a table cannot hold. ``op`` uses no value defined outside it."""
    encoder = _Encoder()
    table = encoder.op(op)
    try:
        return pickle.dumps((encoder.attributes, table), protocol=pickle.HIGHEST_PROTOCOL)
    except (pickle.PicklingError, TypeError, AttributeError) as error:
        raise NotTabulable(f"an attribute cannot be pickled: {error}") from None


def load_op(data: bytes, context: Context) -> Operation:
    """The op :func:`dump_op` tabulated, rebuilt (detached), its ops' classes
    those ``context`` names."""
    attributes, table = pickle.loads(data)
    return _Decoder(attributes, context).op(table)


__all__ = ["NotTabulable", "dump_op", "load_op"]
