"""Dead code, removed before the ILP sees it, as XLA removes it before Alpa's.

Alpa's auto-sharding pass runs on HLO that XLA's ``HloDCE`` has already
cleaned: an op whose results nothing returned depends on (Flax's ``init``
runs the model's forward pass and drops its output; a training step that
returns only the new state drops its loss) is not in the problem. Left in,
it is not free: a dead forward pass that reads freshly initialised weights
keeps them whole (sharding them would cost its matmuls a collective), and a
dead loss keeps the activations it sums whole. Made free but kept (so its
collectives are still written and priced), it makes the plan's price and the
ILP's objective disagree (#43: ``9a17bcc``, reverted in ``c729588``).

So the planner erases it first. Erased are the ops with the ``Pure`` trait
(the lax primitives of kinds elementwise, layout, reduction and contraction,
constants, collectives) other than a user's sharding hint (a
``with_sharding_constraint`` is kept, with what it reads, as the planner
keeps its spec). Random draws, pipeline markers, ops without results and any
op not known to be free of effects stay, and with them what they read.
"""

from __future__ import annotations

from xdsl.dialects import func
from xdsl.ir import Block, Operation
from xdsl.traits import Pure

from alpa_ir.autosharding.hints import HINT_PARAMS
from alpa_ir.dialects.lax import LaxOp


def _erasable(op: Operation) -> bool:
    if isinstance(op, LaxOp) and op.primitive_name in HINT_PARAMS:
        return False  # a user's sharding hint is kept, as the planner keeps its spec
    return bool(op.results) and op.has_trait(Pure) and not isinstance(op, func.ReturnOp)


def dead_ops(block: Block) -> list[Operation]:
    """The ops of ``block`` that can be erased (module docstring), producers
    last: those with the ``Pure`` trait whose results no live op of the block
    reads (a use inside a region counts as a use by the region's op)."""
    live: set[Operation] = set()
    dead: list[Operation] = []
    for op in reversed(list(block.ops)):
        if not _erasable(op):
            live.add(op)
            continue
        used = False
        for result in op.results:
            for use in result.uses:
                user: Operation | None = use.operation
                while user is not None and user.parent_block() is not block:
                    user = user.parent_op()  # a use inside a region: its op in the block
                if user is None or user in live:
                    used = True
                    break
            if used:
                break
        if used:
            live.add(op)
        else:
            dead.append(op)
    return dead


def erase_dead_code(function: func.FuncOp) -> int:
    """Erase the dead ops of ``function``'s body (:func:`dead_ops`); the number erased."""
    dead = dead_ops(function.body.block)
    for op in dead:  # consumers first: nothing erased is still read
        op.detach()
        op.erase()
    return len(dead)
