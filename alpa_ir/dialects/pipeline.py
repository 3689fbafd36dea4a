"""The ``pipeline`` dialect: a pipeline plan (stages on submeshes), cross-mesh
transfers with their tile plans, and the static per-mesh instruction lists of
a schedule.

``construct-stages`` writes ``pipeline.plan`` and one ``pipeline.stage`` per
stage (its layers, its logical mesh, and the functions holding its forward,
backward and apply-grad computation); ``cross-mesh-resharding`` writes a
``pipeline.transfer`` per tensor that crosses meshes; ``emit-instructions``
writes a ``pipeline.program`` per mesh whose body is its instruction list::

    pipeline.program {mesh = @mesh0} {
      pipeline.run {function = @stage0_forward, micro_batch = 0}
      pipeline.send {transfer = @t0, micro_batch = 0}
      pipeline.free {transfer = @t0, micro_batch = 0}
    }
"""

from __future__ import annotations

import math
import re
from typing import ClassVar

from xdsl.dialects.builtin import (
    ArrayAttr,
    DenseArrayBase,
    DictionaryAttr,
    FlatSymbolRefAttr,
    IntegerAttr,
    ModuleOp,
    StringAttr,
)
from xdsl.ir import Dialect
from xdsl.irdl import irdl_op_definition, opt_prop_def, prop_def, region_def, traits_def
from xdsl.traits import NoTerminator, SymbolOpInterface
from xdsl.utils.exceptions import VerifyException

from alpa_ir.dialects.lax_attrs import ints_of
from alpa_ir.dialects.sharding import ShardingSpecAttr
from alpa_ir.dialects.syntax import PropertiesOp, PropertiesSymbolOp
from alpa_ir.errors import AlpaError

SCHEDULES = ("gpipe", "1f1b", "interleaved-1f1b", "zb-h1", "zb-v", "inference")
"""The built-in schedules (:mod:`alpa_ir.pipeline.schedule_kinds`); a plugin may
add more, so the plan accepts any kebab-case name and its readers check it."""
_SCHEDULE_NAME = re.compile(r"[a-z0-9]+(-[a-z0-9]+)*")


@irdl_op_definition
class PlanOp(PropertiesSymbolOp):
    """The pipeline plan: its stages in order, micro-batch count and schedule.
    ``in_flight`` (optional, one per stage): the micro-batches each stage may
    hold in flight, from its memory; zero-bubble schedules defer W within it.
    ``phase_times`` (optional, three or five per stage): each stage's forward,
    B and W seconds per micro-batch as planned, and optionally the seconds its
    forward input and its gradient input take to arrive; the zero-bubble
    schedules build their order with them (without: unit times)."""

    name = "pipeline.plan"
    sym_name = prop_def(StringAttr)
    stages = prop_def(ArrayAttr[FlatSymbolRefAttr])
    num_micro_batches = prop_def(IntegerAttr)
    schedule = prop_def(StringAttr)
    in_flight = opt_prop_def(DenseArrayBase)
    phase_times = opt_prop_def(DenseArrayBase)
    traits = traits_def(SymbolOpInterface())
    PROPERTY_ORDER: ClassVar[tuple[str, ...]] = (
        "stages",
        "num_micro_batches",
        "schedule",
        "in_flight",
        "phase_times",
    )

    def in_flight_caps(self) -> tuple[int, ...] | None:
        return None if self.in_flight is None else tuple(ints_of(self.in_flight))

    def stage_phase_times(self) -> tuple[tuple[float, ...], ...] | None:
        """``phase_times`` per stage: (forward, B, W[, forward in, gradient in])."""
        if self.phase_times is None:
            return None
        flat = [float(x) for x in self.phase_times.get_values()]
        n = len(flat) // max(1, len(self.stages.data))
        return tuple(tuple(flat[i : i + n]) for i in range(0, len(flat), n)) if n else ()

    def verify_(self) -> None:
        if not _SCHEDULE_NAME.fullmatch(self.schedule.data):
            raise VerifyException(
                f"schedule '{self.schedule.data}' is not a schedule name (kebab-case, like "
                f"{', '.join(SCHEDULES)})"
            )
        if int(self.num_micro_batches.value.data) < 1:
            raise VerifyException("num_micro_batches must be at least 1")
        caps = self.in_flight_caps()
        if caps is not None and (len(caps) != len(self.stages.data) or min(caps, default=1) < 1):
            raise VerifyException(
                f"in_flight needs one count >= 1 per stage ({len(self.stages.data)}), got "
                f"{list(caps)}"
            )
        if self.phase_times is not None:
            flat = [float(x) for x in self.phase_times.get_values()]
            n = len(self.stages.data)
            if len(flat) not in (3 * n, 5 * n) or not all(
                math.isfinite(x) and x >= 0 for x in flat
            ):
                raise VerifyException(
                    f"phase_times needs a forward, B and W time >= 0 per stage, and optionally "
                    f"two transfer times ({3 * n} or {5 * n} numbers), got {flat}"
                )


@irdl_op_definition
class StageOp(PropertiesSymbolOp):
    """One pipeline stage: layers ``[first, last]``, its logical mesh, and the
    functions of its forward, backward and apply-grad parts. After
    ``split-backward``, ``backward_weight`` names the part of the backward that
    only computes weight gradients (W), which may run any time after the
    backward (B) of the same micro-batch.

    ``apply_grad_rounds`` lists further apply-grad functions, run in order
    after ``apply_grad`` once all gradients are there: an optimizer update that
    couples stages (a global gradient norm, an all-finite test) computes its
    parts on each stage in one round and combines them in the next; a round
    reads results of earlier rounds, on its own mesh or sent from another."""

    name = "pipeline.stage"
    sym_name = prop_def(StringAttr)
    layers = prop_def(DenseArrayBase)
    mesh = prop_def(FlatSymbolRefAttr)
    forward = opt_prop_def(FlatSymbolRefAttr)
    backward = opt_prop_def(FlatSymbolRefAttr)
    backward_weight = opt_prop_def(FlatSymbolRefAttr)
    apply_grad = opt_prop_def(FlatSymbolRefAttr)
    apply_grad_rounds = opt_prop_def(ArrayAttr[FlatSymbolRefAttr])
    traits = traits_def(SymbolOpInterface())
    PROPERTY_ORDER: ClassVar[tuple[str, ...]] = (
        "layers",
        "mesh",
        "forward",
        "backward",
        "backward_weight",
        "apply_grad",
        "apply_grad_rounds",
    )

    def phase_functions(self) -> list[tuple[str, str]]:
        """``(phase, function name)`` of every function of the stage in run
        order; the apply-grad rounds all have phase ``apply_grad``."""
        out = [
            (phase, ref.root_reference.data)
            for phase in ("forward", "backward", "backward_weight", "apply_grad")
            if (ref := getattr(self, phase)) is not None
        ]
        if self.apply_grad_rounds is not None:
            out += [("apply_grad", ref.root_reference.data) for ref in self.apply_grad_rounds.data]
        return out

    def verify_(self) -> None:
        layers = ints_of(self.layers)
        if len(layers) != 2 or layers[0] > layers[1] or layers[0] < 0:
            raise VerifyException(f"stage @{self.sym_name.data}: layers must be [first, last]")


@irdl_op_definition
class TransferOp(PropertiesSymbolOp):
    """A tensor crossing from one mesh to another: source and destination
    specs, and the tile plan (a list of point-to-point sends, each a
    dictionary of source device, destination devices, tile slice and bytes)."""

    name = "pipeline.transfer"
    sym_name = prop_def(StringAttr)
    value = prop_def(StringAttr)
    src_mesh = prop_def(FlatSymbolRefAttr)
    dst_mesh = prop_def(FlatSymbolRefAttr)
    src_spec = prop_def(ShardingSpecAttr)
    dst_spec = prop_def(ShardingSpecAttr)
    tiles = opt_prop_def(ArrayAttr[DictionaryAttr])
    traits = traits_def(SymbolOpInterface())
    PROPERTY_ORDER: ClassVar[tuple[str, ...]] = (
        "value",
        "src_mesh",
        "dst_mesh",
        "src_spec",
        "dst_spec",
        "tiles",
    )


@irdl_op_definition
class ProgramOp(PropertiesOp):
    """The static instruction list of one mesh."""

    name = "pipeline.program"
    mesh = prop_def(FlatSymbolRefAttr)
    body = region_def("single_block")
    traits = traits_def(NoTerminator())
    PROPERTY_ORDER: ClassVar[tuple[str, ...]] = ("mesh",)


class InstructionOp(PropertiesOp):
    """Base of the instructions; ``micro_batch`` is absent for per-step work."""

    PROPERTY_ORDER: ClassVar[tuple[str, ...]] = ("function", "transfer", "buffers", "micro_batch")


@irdl_op_definition
class RunOp(InstructionOp):
    """Run one stage function on this mesh for one micro-batch."""

    name = "pipeline.run"
    function = prop_def(FlatSymbolRefAttr)
    micro_batch = opt_prop_def(IntegerAttr)


@irdl_op_definition
class SendOp(InstructionOp):
    """Send this mesh's tiles of a transfer."""

    name = "pipeline.send"
    transfer = prop_def(FlatSymbolRefAttr)
    micro_batch = opt_prop_def(IntegerAttr)


@irdl_op_definition
class RecvOp(InstructionOp):
    """Receive this mesh's tiles of a transfer."""

    name = "pipeline.recv"
    transfer = prop_def(FlatSymbolRefAttr)
    micro_batch = opt_prop_def(IntegerAttr)


@irdl_op_definition
class BroadcastOp(InstructionOp):
    """All-gather received tiles across the destination mesh (local all-gather)."""

    name = "pipeline.broadcast"
    transfer = prop_def(FlatSymbolRefAttr)
    micro_batch = opt_prop_def(IntegerAttr)


@irdl_op_definition
class FreeOp(InstructionOp):
    """Free buffers that are dead from here on."""

    name = "pipeline.free"
    buffers = prop_def(ArrayAttr[StringAttr])
    micro_batch = opt_prop_def(IntegerAttr)


def plan_of(module: ModuleOp) -> PlanOp | None:
    """The module's ``pipeline.plan`` (the first, if several), or None."""
    return next((op for op in module.ops if isinstance(op, PlanOp)), None)


def plan_stages(module: ModuleOp) -> list[StageOp]:
    """The ``pipeline.stage`` ops the module's plan names, in the plan's order."""
    plan = plan_of(module)
    if plan is None:
        raise AlpaError("the module has no pipeline.plan")
    by_name = {op.sym_name.data: op for op in module.ops if isinstance(op, StageOp)}
    stages = []
    for ref in plan.stages.data:
        name = ref.root_reference.data
        if name not in by_name:
            raise AlpaError(f"pipeline.plan @{plan.sym_name.data} names no stage @{name}")
        stages.append(by_name[name])
    return stages


Pipeline = Dialect(
    "pipeline",
    [PlanOp, StageOp, TransferOp, ProgramOp, RunOp, SendOp, RecvOp, BroadcastOp, FreeOp],
    [],
)

__all__ = [
    "SCHEDULES",
    "BroadcastOp",
    "FreeOp",
    "InstructionOp",
    "Pipeline",
    "PlanOp",
    "ProgramOp",
    "RecvOp",
    "RunOp",
    "SendOp",
    "StageOp",
    "TransferOp",
    "plan_of",
    "plan_stages",
]
