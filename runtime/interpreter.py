"""The instruction interpreter of one mesh: the semantics of RUN, SEND, RECV,
BROADCAST and FREE in one place, for every driver.

A :class:`MeshInterpreter` executes the instruction list of its mesh (see
:mod:`alpa_ir.runtime.program`) over a buffer store keyed by (value name,
micro-batch). How tensors cross meshes is a :class:`Transport`:

- :class:`LocalTransport`: in one process, a mailbox of device arrays; its
  ``recv`` returns None while the value has not been sent, and
  :func:`run_interleaved` steps the meshes' interpreters round-robin until
  all are done (a deadlock is an error, never a hang);
- the host transport (:mod:`alpa_ir.runtime.host_pipeline`): in a JAX world
  of several processes, a SEND is one XLA program over both meshes' devices
  (gloo between processes on CPU, NCCL on GPU) and RECV takes its result.

Semantics:

- RUN f at micro-batch m reads each operand's buffer (the value's own, an
  argument of ``@main``, or the transfer that brought it), places it as f's
  SPMD program expects, and stores f's results at m. A result needed once
  per step (accumulated) is added to its per-step buffer instead (kept at m
  too only when read per micro-batch); reading that per-step buffer gives
  the mean over the micro-batches for a result that depends on the batch,
  else the first micro-batch's value; a batch-shaped result that ``@main``
  returns (``StepProgram.concatenated``) is concatenated instead; a result
  whose sum over the mesh was deferred is then reduced once
  (``CompiledFunction.finish``).
- SEND t at m hands the buffer of t's value at m to the transport.
- RECV t at m takes it from the transport and places it on this mesh with
  the spec t arrives in (the receive spec of the local all-gather rewrite
  when t has a tile plan, else its destination spec), as buffer t at m. The
  tile-plan transport (:class:`alpa_ir.runtime.transfers.TilePlanTransport`)
  delivers exactly that layout; a transport that moves whole tensors gets it
  placed.
- BROADCAST t at m all-gathers buffer t over the plan's (tensor dim, mesh
  axes) on this mesh, an XLA collective (a jitted ``shard_map``), into t's
  destination spec; a transfer without a gather has nothing to do.
- FREE drops buffers.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec
from xdsl.dialects.builtin import ModuleOp

from alpa_ir.errors import AlpaError
from alpa_ir.pipeline.instructions import Instruction, Key
from alpa_ir.runtime.program import Call, MeshInfo, StepProgram, Transfer


class Transport(Protocol):
    """Moves tensors between meshes."""

    def send(self, transfer: Transfer, micro_batch: int | None, value: Any) -> None: ...

    def recv(self, transfer: Transfer, micro_batch: int | None) -> Any | None:
        """The value, or None while it has not arrived (non-blocking transports)."""
        ...


@dataclass(frozen=True)
class CompiledFunction:
    """A stage function compiled for a mesh: ``run(*placed) -> results``.
    ``finish``: per result index, the program that completes a result whose
    sum over the mesh was deferred past the micro-batches (``run`` returns
    each device's partial sum; ``finish`` reduces their accumulation once)."""

    run: Callable[..., Sequence[Any]]
    in_shardings: tuple[Any, ...]
    finish: Mapping[int, Callable[[Any], Any]] = field(default_factory=dict)
    finish_shardings: Mapping[int, Any] = field(default_factory=dict)
    """Per index of ``finish``, the sharding its program returns the result in."""
    finish_inputs: Mapping[int, Any] = field(default_factory=dict)
    """Per index of ``finish``, its input (``jax.ShapeDtypeStruct`` with its
    sharding), to lower the program without a step's values."""
    accumulators: tuple[int, ...] = ()
    """The result indices ``run`` sums over the micro-batches in place
    (:meth:`~alpa_ir.runtime.program.StepProgram.summed_in_place`): it takes
    their running sums first (donated, not in :attr:`in_shardings`) and
    returns ``sum + result`` in their place."""
    acc_structs: tuple[Any, ...] = ()
    """Per index of :attr:`accumulators`, its running sum's shape, dtype and
    sharding (``jax.ShapeDtypeStruct``), to lower ``run``."""
    zeros: Callable[[], Sequence[Any]] | None = None
    """The zero running sums the first micro-batch adds to."""


CompileFunctions = Callable[
    [ModuleOp, StepProgram, str, Sequence[Any]], tuple[Mesh, dict[str, CompiledFunction]]
]
"""A backend's compiler of one mesh's stage functions: ``(module, program, mesh,
devices) -> (jax mesh, compiled function per name)``; the runtime never
compiles by itself."""


def sharding_of(info: MeshInfo, mesh: Mesh, dims: tuple[tuple[int, ...], ...]) -> NamedSharding:
    names = info.axis_names
    spec = PartitionSpec(
        *[
            None if not d else names[d[0]] if len(d) == 1 else tuple(names[a] for a in d)
            for d in dims
        ]
    )
    return NamedSharding(mesh, spec)


@dataclass(frozen=True)
class RuntimeEvent:
    """One executed instruction of a mesh: RUN (target: a call), SEND or RECV
    (target: a transfer), with its micro-batch and wall-clock seconds."""

    mesh: str
    kind: str
    target: str
    micro_batch: int | None
    start: float
    end: float


class MeshInterpreter:
    """Executes one mesh's instruction list, step after step."""

    def __init__(
        self,
        program: StepProgram,
        mesh: str,
        jax_mesh: Mesh,
        functions: Mapping[str, CompiledFunction],
        transport: Transport,
    ) -> None:
        self.program = program
        self.mesh = mesh
        self.jax_mesh = jax_mesh
        self.functions = functions
        self.transport = transport
        self.instructions = program.instructions[mesh]
        self.buffers: dict[Key, Any] = {}
        self.sums: dict[str, Any] = {}
        self.counts: dict[str, int] = {}
        self.pc = 0
        self.gathers: dict[str, Callable[[Any], Any]] = {}
        self.events: list[RuntimeEvent] | None = None
        """When a list: each RUN, SEND and RECV executed is appended with its wall
        times (a RUN waits for its results, so recording slows the step)."""

    def start(self, inputs: Mapping[Key, Any]) -> None:
        """Begin a step with these argument buffers of ``@main``."""
        self.buffers = dict(inputs)
        self.sums, self.counts = {}, {}
        self.pc = 0

    @property
    def done(self) -> bool:
        return self.pc == len(self.instructions)

    def advance(self) -> bool:
        """Execute until the end (True) or a RECV whose value has not arrived (False)."""
        while self.pc < len(self.instructions):
            ins = self.instructions[self.pc]
            try:
                progressed = self.execute(ins)
            except AlpaError as err:
                raise AlpaError(f"mesh @{self.mesh}, {ins}: {err}") from err
            if not progressed:
                return False
            self.pc += 1
        return True

    def run(self, inputs: Mapping[Key, Any]) -> dict[str, Any]:
        """A whole step with a blocking transport; the outputs living on this mesh."""
        self.start(inputs)
        if not self.advance():
            raise AlpaError(f"mesh @{self.mesh}: the transport returned nothing for a RECV")
        return self.outputs()

    def outputs(self) -> dict[str, Any]:
        return {v: self.read((v, None)) for v in self.program.mesh_outputs(self.mesh)}

    def execute(self, ins: Instruction) -> bool:
        if self.events is None:
            return self._execute(ins)
        start = time.time()  # wall clock: comparable between processes
        progressed = self._execute(ins)
        if progressed and ins.kind in ("run", "send", "recv"):
            self.events.append(
                RuntimeEvent(self.mesh, ins.kind, ins.target, ins.micro_batch, start, time.time())
            )
        return progressed

    def _execute(self, ins: Instruction) -> bool:
        mb = ins.micro_batch
        if ins.kind == "run":
            results = self._run(self.program.calls[ins.target], mb)
            if self.events is not None:
                jax.block_until_ready(results)
        elif ins.kind == "send":
            transfer = self.program.transfers[ins.target]
            self.transport.send(transfer, mb, self.read((transfer.value, mb)))
        elif ins.kind == "recv":
            transfer = self.program.transfers[ins.target]
            value = self.transport.recv(transfer, mb)
            if value is None:
                return False
            self.buffers[(transfer.name, mb)] = self._place(transfer, value)
        elif ins.kind == "broadcast":
            transfer = self.program.transfers[ins.target]
            if transfer.gather:
                key = (transfer.name, mb)
                self.buffers[key] = self._gather(transfer)(self.buffers[key])
        elif ins.kind == "free":
            for name in ins.buffers:
                self.buffers.pop((name, mb), None)
                if mb is None:
                    self.sums.pop(name, None)
        return True

    def _place(self, transfer: Transfer, value: Any) -> Any:
        info = self.program.meshes[self.mesh]
        return jax.device_put(value, sharding_of(info, self.jax_mesh, transfer.arrival_dims))

    def _gather(self, transfer: Transfer) -> Callable[[Any], Any]:
        """The compiled all-gather of ``transfer`` on this mesh (built once)."""
        from alpa_ir.dialects.sharding import ShardingSpec
        from alpa_ir.runtime.transfers import all_gather_program

        program = self.gathers.get(transfer.name)
        if program is None:
            program = all_gather_program(
                self.jax_mesh,
                ShardingSpec(transfer.arrival_dims),
                ShardingSpec(transfer.dst_dims),
                transfer.gather,
            )
            self.gathers[transfer.name] = program
        return program

    def _run(self, call: Call, micro_batch: int | None) -> Any:
        compiled = self.functions[call.function]
        args = [self.read(k) for k in self.program.operand_keys(call, micro_batch)]
        placed = jax.device_put(args, list(compiled.in_shardings))
        sums: list[Any] = []
        if compiled.accumulators:  # summed in place: the running sums go first, donated
            names = [call.results[k] for k in compiled.accumulators]
            if any(self.counts.get(v, 0) == 0 for v in names):
                assert compiled.zeros is not None
                sums = list(compiled.zeros())
            else:
                sums = [self.sums[v] for v in names]
        results = compiled.run(*sums, *placed)
        program = self.program
        for k, (value, result) in enumerate(zip(call.results, results, strict=True)):
            if k in compiled.accumulators:
                self.sums[value] = result
                self.counts[value] = self.counts.get(value, 0) + 1
                continue
            if micro_batch is not None and value in program.accumulated:
                self._accumulate(value, result, k in call.per_micro_batch)
                if value not in program.read_per_micro_batch:
                    continue
            self.buffers[(value, micro_batch)] = result
        return results

    def _accumulate(self, value: str, result: Any, varies: bool) -> None:
        count = self.counts.get(value, 0)
        if value in self.program.concatenated:  # the micro-batches' slices, in order
            self.sums[value] = [result] if count == 0 else [*self.sums[value], result]
        elif count == 0:
            self.sums[value] = result
        elif varies:
            self.sums[value] = self.sums[value] + result
        self.counts[value] = count + 1

    def read(self, key: Key) -> Any:
        if key in self.buffers:
            return self.buffers[key]
        value, micro_batch = key
        if micro_batch is None and value in self.sums:
            b = self.program.num_micro_batches
            if self.counts[value] != b:
                raise AlpaError(
                    f"{value} is read once per step after {self.counts[value]} of {b} micro-batches"
                )
            producer = self.program.producer(value)
            assert producer is not None
            total = self.sums[value]
            index = producer.results.index(value)
            if value in self.program.concatenated:
                total = jnp.concatenate(total, axis=0)
            elif b > 1 and index in producer.per_micro_batch:
                total = (total / b).astype(total.dtype)
            finish = self.functions[producer.function].finish.get(index)
            if finish is not None:  # the sum over the mesh, once per step
                total = finish(total)
            self.buffers[key] = total
            return total
        where = "" if micro_batch is None else f" of micro-batch {micro_batch}"
        raise AlpaError(f"buffer {value}{where} is not on mesh @{self.mesh}")


class LocalTransport:
    """In one process: sent values wait in a mailbox until received."""

    def __init__(self) -> None:
        self.mailbox: dict[tuple[str, int | None], Any] = {}

    def send(self, transfer: Transfer, micro_batch: int | None, value: Any) -> None:
        self.mailbox[(transfer.name, micro_batch)] = value

    def recv(self, transfer: Transfer, micro_batch: int | None) -> Any | None:
        return self.mailbox.pop((transfer.name, micro_batch), None)


def run_interleaved(
    interpreters: Sequence[MeshInterpreter], inputs: Mapping[str, Mapping[Key, Any]]
) -> dict[str, Any]:
    """One step of all meshes in this process: each advances until it waits
    for a value, round-robin, until all are done."""
    for it in interpreters:
        it.start(inputs.get(it.mesh, {}))
    pending = list(interpreters)
    while pending:
        before = [it.pc for it in pending]
        still = [it for it in pending if not it.advance()]
        # a deadlock: a whole round in which no mesh executed an instruction
        if still and [it.pc for it in pending] == before:
            waits = ", ".join(f"@{it.mesh} at {it.instructions[it.pc]}" for it in still)
            raise AlpaError(f"the instruction lists deadlock: {waits}")
        pending = still
    outputs: dict[str, Any] = {}
    for it in interpreters:
        outputs.update(it.outputs())
    return outputs


def split_inputs(program: StepProgram, flat: Sequence[Any], mesh: str) -> dict[Key, Any]:
    """The argument buffers of ``mesh``: batch arguments split into micro-batches."""
    b = program.num_micro_batches
    out: dict[Key, Any] = {}
    for value, micro_batch in program.mesh_inputs(mesh):
        x = flat[int(value.split(":")[1])]
        if micro_batch is not None:
            size = np.shape(x)[0] // b
            x = x[micro_batch * size : (micro_batch + 1) * size]
        out[(value, micro_batch)] = x
    return out


def gather_outputs(
    program: StepProgram, flat: Sequence[Any], values: Mapping[str, Any]
) -> list[Any]:
    """``@main``'s results in order (an argument returned as is comes from ``flat``)."""
    out = []
    for v in program.outputs:
        if v.startswith("main:"):
            out.append(flat[int(v.split(":")[1])])
        else:
            out.append(values[v])
    return out
