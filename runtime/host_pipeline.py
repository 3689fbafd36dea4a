"""A pipeline step on one host of a multi-controller JAX world.

Every host worker (:mod:`alpa_ir.runtime.host_worker`) owns its host's
devices, and a mesh of the plan may span hosts. A mesh's stage functions are
SPMD programs over the mesh's global devices: every process owning one of
them calls each program, and XLA runs the collectives between processes.
For that, all hosts walk the step's instructions in one global order
(:func:`global_order`: the order in which :func:`~alpa_ir.runtime.interpreter.run_interleaved`
executes them in one process) and each host executes those that touch its
devices:

- RUN, BROADCAST, FREE and RECV of a mesh: the hosts owning that mesh's
  devices, each through its :class:`~alpa_ir.runtime.interpreter.MeshInterpreter`
  of the mesh (same semantics as in one process);
- SEND of a transfer: the hosts owning a source or a destination device
  call the transfer's one program over both meshes
  (:mod:`alpa_ir.runtime.collective_transfers`); the destination hosts
  keep its result for the RECV that follows in the order. A transfer whose
  devices all belong to one host stays a local device copy there (the tile
  plan's pieces ``device_put`` onto their destination devices, as in one
  process: :class:`~alpa_ir.runtime.transfers.TilePlanTransport`).

Collectives spanning processes are thus issued in the same order by every
process that takes part (no deadlock), and nothing moves through the driver
or Ray's object store. The program needs the world's devices by plan id
(ids counted host by host) and the module, from which it takes each moved
value's element type.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from xdsl.dialects import func
from xdsl.dialects.builtin import ModuleOp

from alpa_ir.dialects.types import dtype_of
from alpa_ir.errors import AlpaError
from alpa_ir.ir.module_utils import main_function, symbol_op
from alpa_ir.pipeline.instructions import Key
from alpa_ir.runtime.collective_transfers import CollectiveTransfer, collective_transfer
from alpa_ir.runtime.interpreter import CompileFunctions, MeshInterpreter, RuntimeEvent
from alpa_ir.runtime.program import StepProgram, Transfer
from alpa_ir.runtime.transfers import TilePlanTransport

Step = tuple[str, int]
"""One instruction of the global order: (mesh, index in the mesh's list)."""


@dataclass(frozen=True)
class KeyData:
    """A PRNG key array on its way to a host: its key data and implementation
    (a key array has no numpy form)."""

    data: np.ndarray
    impl: str

    @staticmethod
    def of(value: Any) -> Any:
        """``value`` as numpy, or as KeyData when it is a key array."""
        if jnp.issubdtype(getattr(value, "dtype", np.float32), jax.dtypes.prng_key):
            return KeyData(np.asarray(jax.random.key_data(value)), str(jax.random.key_impl(value)))
        return np.asarray(value)

    def key(self) -> Any:
        return jax.random.wrap_key_data(self.data, impl=self.impl)


@dataclass(frozen=True)
class Shards:
    """The shards of an output one host holds: (box of global indices, data)
    pairs; a PRNG key array's are its key data, with the key implementation."""

    pieces: list[tuple[tuple[tuple[int, int], ...], np.ndarray]]
    key_impl: str | None = None


def global_order(program: StepProgram) -> tuple[Step, ...]:
    """All meshes' instructions in one sequential order: the meshes take
    turns, each running until it reaches a RECV whose SEND has not run."""
    pcs = {mesh: 0 for mesh in program.meshes}
    sent: set[tuple[str, int | None]] = set()
    order: list[Step] = []
    while any(pcs[m] < len(program.instructions[m]) for m in pcs):
        moved = False
        for mesh, instructions in program.instructions.items():
            while pcs[mesh] < len(instructions):
                ins = instructions[pcs[mesh]]
                if ins.kind == "recv" and (ins.target, ins.micro_batch) not in sent:
                    break
                if ins.kind == "send":
                    sent.add((ins.target, ins.micro_batch))
                order.append((mesh, pcs[mesh]))
                pcs[mesh] += 1
                moved = True
        if not moved:
            waits = ", ".join(
                f"@{m} at {program.instructions[m][pc]}"
                for m, pc in pcs.items()
                if pc < len(program.instructions[m])
            )
            raise AlpaError(f"the instruction lists deadlock: {waits}")
    return tuple(order)


def _value_type(module: ModuleOp, value: str) -> Any:
    callee, index = value.rsplit(":", 1)
    function = main_function(module) if callee == "main" else symbol_op(module, callee, func.FuncOp)
    assert isinstance(function, func.FuncOp)
    types = function.function_type.inputs if callee == "main" else function.function_type.outputs
    return types.data[int(index)]


class HostTransport:
    """SEND and RECV of the host workers: one collective program per transfer
    that crosses hosts, a local device copy for one inside this host."""

    def __init__(self, program: StepProgram, module: ModuleOp, devices: Mapping[int, Any]) -> None:
        self.program = program
        self.devices = devices
        self.me = jax.process_index()
        self.mailbox: dict[tuple[str, int | None], Any] = {}
        self.moves: dict[str, CollectiveTransfer] = {}
        """The compiled programs of the transfers that cross hosts."""
        self.local = TilePlanTransport(program, [devices[d] for d in sorted(devices)])
        """The transport of the transfers inside this host."""
        for transfer in program.transfers.values():
            if self.stays_here(transfer):
                continue
            if self.takes_part(transfer):
                self.moves[transfer.name] = self._compile(module, transfer)

    def owns(self, device_ids: Sequence[int]) -> bool:
        return any(self.devices[d].process_index == self.me for d in device_ids)

    def stays_here(self, transfer: Transfer) -> bool:
        """Whether every device of both meshes is this process's."""
        meshes = self.program.meshes
        ids = (*meshes[transfer.src_mesh].device_ids, *meshes[transfer.dst_mesh].device_ids)
        return all(self.devices[d].process_index == self.me for d in ids)

    def takes_part(self, transfer: Transfer) -> bool:
        meshes = self.program.meshes
        return self.owns(meshes[transfer.src_mesh].device_ids) or self.owns(
            meshes[transfer.dst_mesh].device_ids
        )

    def _compile(self, module: ModuleOp, transfer: Transfer) -> CollectiveTransfer:
        if transfer.plan is None:
            raise AlpaError(
                f"transfer {transfer.name} has no tile plan; the host runtime moves tensors by "
                "their plans (run cross-mesh-resharding)"
            )
        meshes = self.program.meshes
        return collective_transfer(
            transfer.plan,
            self.devices,
            meshes[transfer.src_mesh].axis_names,
            meshes[transfer.dst_mesh].axis_names,
            dtype_of(_value_type(module, transfer.value)),
        )

    def send(self, transfer: Transfer, micro_batch: int | None, value: Any) -> None:
        """Run the transfer's program (``value`` is None on a host that owns
        no source device); a destination host keeps the result."""
        if transfer.name not in self.moves:
            self.local.send(transfer, micro_batch, value)
            return
        got = self.moves[transfer.name](value)
        if got is not None:
            self.mailbox[(transfer.name, micro_batch)] = got

    def recv(self, transfer: Transfer, micro_batch: int | None) -> Any | None:
        if transfer.name not in self.moves:
            return self.local.recv(transfer, micro_batch)
        return self.mailbox.pop((transfer.name, micro_batch), None)


class HostPipeline:
    """The meshes of a pipeline step that touch this host, and its transfers."""

    def __init__(
        self,
        module: ModuleOp,
        program: StepProgram,
        order: Sequence[Step],
        devices: Mapping[int, Any],
        compile_functions: CompileFunctions,
    ) -> None:
        self.program = program
        self.order = tuple(order)
        self.transport = HostTransport(program, module, devices)
        self.interpreters: dict[str, MeshInterpreter] = {}
        for mesh, info in program.meshes.items():
            if self.transport.owns(info.device_ids):
                mesh_devices = [devices[d] for d in info.device_ids]
                jax_mesh, functions = compile_functions(module, program, mesh, mesh_devices)
                self.interpreters[mesh] = MeshInterpreter(
                    program, mesh, jax_mesh, functions, self.transport
                )

    def run(
        self, inputs: Mapping[str, Mapping[Key, Any]], record: bool = False
    ) -> tuple[dict[str, Shards], list[RuntimeEvent]]:
        """One step; the shards this host holds of each output of its meshes,
        and (``record``) when each of its instructions ran."""
        for mesh, it in self.interpreters.items():
            given = inputs.get(mesh, {})
            it.start({k: v.key() if isinstance(v, KeyData) else v for k, v in given.items()})
            it.events = [] if record else None
        for mesh, index in self.order:
            ins = self.program.instructions[mesh][index]
            it = self.interpreters.get(mesh)
            if ins.kind == "send":
                transfer = self.program.transfers[ins.target]
                if it is not None:
                    it.execute(ins)
                elif self.transport.takes_part(transfer):
                    self.transport.send(transfer, ins.micro_batch, None)
            elif it is not None and not it.execute(ins):
                raise AlpaError(f"mesh @{mesh}: {ins} found nothing sent")
        outputs: dict[str, Shards] = {}
        for it in self.interpreters.values():
            for value, array in it.outputs().items():
                outputs[value] = local_shards(array)
        events = [e for it in self.interpreters.values() for e in it.events or ()]
        return outputs, events


def local_shards(array: Any) -> Shards:
    """This process's shards of ``array`` (one per distinct box), as numpy."""
    key_impl = None
    if jnp.issubdtype(array.dtype, jax.dtypes.prng_key):
        key_impl = str(jax.random.key_impl(array))
        array = jax.random.key_data(array)
    seen: dict[tuple[tuple[int, int], ...], np.ndarray] = {}
    for shard in array.addressable_shards:
        box = tuple(
            (s.start or 0, size if s.stop is None else s.stop)
            for s, size in zip(shard.index, array.shape, strict=True)
        )
        if box not in seen:
            seen[box] = np.asarray(shard.data)
    return Shards(list(seen.items()), key_impl)


def assemble_shards(parts: Sequence[Shards]) -> Any:
    """The whole array from the shards the hosts hold (a key array for keys)."""
    pieces = [p for shards in parts for p in shards.pieces]
    if not pieces:
        raise AlpaError("no host returned a shard of an output")
    rank = len(pieces[0][0])
    shape = tuple(max(box[d][1] for box, _ in pieces) for d in range(rank))
    out = np.empty(shape, pieces[0][1].dtype)
    for box, data in pieces:
        out[tuple(slice(lo, hi) for lo, hi in box)] = data
    if parts[0].key_impl is not None:
        return jax.random.wrap_key_data(out, impl=parts[0].key_impl)
    return out
