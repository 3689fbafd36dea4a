"""A strategy graph read on a copy of its function.

A strategy graph (:mod:`alpa_ir.autosharding.graph`) names the ops and values
of the function it was built for, and writing a plan
(:func:`~alpa_ir.autosharding.apply_plan.apply_plan`) changes that function.
To write a second plan from the same graph, the function is copied before the
first plan is written (:func:`copy_module`), and the graph is read on the copy
(:meth:`ModuleCopy.graph_of_choice`): each node keeps only its chosen strategy,
renamed onto the copy's ops and values (:class:`RenamedStrategy`, on lookup).
Building the graph again for the copy would give the same strategies: this is
what it costs to skip that.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from xdsl.dialects import func
from xdsl.dialects.builtin import ModuleOp
from xdsl.ir import Operation, SSAValue

from alpa_ir.autosharding.graph import Node, StrategyGraph
from alpa_ir.autosharding.node_strategy import GroupRenaming, RenamedStrategy
from alpa_ir.ir.module_utils import main_function


@dataclass(frozen=True)
class ModuleCopy:
    """``module``, a copy of a module taken before its ``@main`` was changed,
    and the renaming from the original's ``@main`` onto the copy's."""

    module: ModuleOp
    renaming: GroupRenaming

    @property
    def function(self) -> func.FuncOp:
        """The copy's ``@main``."""
        return main_function(self.module)

    def graph_of_choice(
        self, graph: StrategyGraph, choice: Sequence[int]
    ) -> tuple[StrategyGraph, list[int]]:
        """``graph`` (built for the original ``@main``) read on the copy, with
        ``choice``'s strategy the only one of each node, and the choice of
        that graph (the first strategy of every node): what ``apply_plan``
        needs to write ``choice`` into the copy (it reads no edges)."""
        r = self.renaming
        nodes = [
            Node(
                node.index,
                node.name,
                [r.new_op[op] for op in node.ops],
                arg=None if node.arg is None else r.new_value[node.arg],
                strategies=[RenamedStrategy(node.strategies[c], r)],
            )
            for node, c in zip(graph.nodes, choice, strict=True)
        ]
        alias = {r.new_value[k]: r.new_value[v] for k, v in graph.alias.items()}
        uses = [(r.new_op[op], k, r.new_value[v]) for op, k, v in graph.uses]
        node_of_value = {r.new_value[v]: n for v, n in graph.node_of_value.items()}
        return StrategyGraph(nodes, {}, node_of_value, alias, uses), [0] * len(nodes)


def copy_module(module: ModuleOp) -> ModuleCopy:
    """A copy of ``module`` with the renaming of its ``@main``'s ops and values
    (block arguments of every region included) onto the copy's."""
    copy = module.clone()
    ops: dict[Operation, Operation] = {}
    values: dict[SSAValue, SSAValue] = {}
    for old, new in zip(main_function(module).walk(), main_function(copy).walk(), strict=True):
        ops[old] = new
        values.update(zip(old.results, new.results, strict=True))
        for old_region, new_region in zip(old.regions, new.regions, strict=True):
            for old_block, new_block in zip(old_region.blocks, new_region.blocks, strict=True):
                values.update(zip(old_block.args, new_block.args, strict=True))
    return ModuleCopy(copy, GroupRenaming.of_maps(ops, values))


__all__ = ["ModuleCopy", "copy_module"]
