"""A mesh worker: one Ray actor per mesh, owning that mesh's devices.

The worker is created with ``XLA_FLAGS=--xla_force_host_platform_device_count=N``
in its runtime environment, so its process has exactly the N CPU devices of
its mesh (the mesh's device ids map to local devices 0..N-1). It receives its
program once (:meth:`MeshWorker.load`: the module text, the
:class:`~alpa_ir.runtime.program.StepProgram` and its peers), compiles the
stage functions it runs, and then runs steps: :meth:`MeshWorker.run_step`
interprets its instruction list (:mod:`alpa_ir.runtime.interpreter`) with
the :class:`RayTransport`.

:class:`RayTransport`: SEND hands the buffer, as a numpy array, to the
destination mesh's worker in a call of its ``deliver`` method (which runs on
another thread of that actor, beside its step). Ray moves the array through
its object store (arrays above Ray's inline limit, 100 KiB by default, are
put there by the sender and fetched by the receiver; smaller ones travel
inside the call, which measured 3-4x less overhead per transfer than an
explicit ``ray.put`` of every buffer). RECV waits for the delivery with a
timeout, never forever. A NCCL transport for GPU workers implements the same
``send``/``recv`` pair.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Mapping
from typing import Any

import numpy as np

from alpa_ir.errors import AlpaError
from alpa_ir.pipeline.instructions import Key
from alpa_ir.runtime.interpreter import CompileFunctions
from alpa_ir.runtime.program import StepProgram, Transfer

MAX_CONCURRENCY = 4
"""Threads per worker actor: one runs the step, the others take deliveries."""


class Inbox:
    """Arrays delivered to this worker, keyed by (step, transfer, micro-batch)."""

    def __init__(self) -> None:
        self._items: dict[tuple[int, str, int | None], Any] = {}
        self._ready = threading.Condition()
        self._aborted = ""

    def put(self, key: tuple[int, str, int | None], item: Any) -> None:
        with self._ready:
            self._items[key] = item
            self._ready.notify_all()

    def take(self, key: tuple[int, str, int | None], timeout_s: float) -> Any:
        deadline = time.monotonic() + timeout_s
        with self._ready:
            while key not in self._items:
                if self._aborted:
                    raise AlpaError(self._aborted)
                left = deadline - time.monotonic()
                if left <= 0:
                    raise AlpaError(
                        f"transfer {key[1]} (micro-batch {key[2]}) did not arrive within "
                        f"{timeout_s:.0f} s"
                    )
                self._ready.wait(min(left, 1.0))
            return self._items.pop(key)

    def abort(self, reason: str) -> None:
        with self._ready:
            self._aborted = reason
            self._ready.notify_all()


class RayTransport:
    """Tensors between mesh workers through Ray's object store."""

    def __init__(self, peers: Mapping[str, Any], inbox: Inbox, timeout_s: float) -> None:
        import ray

        self.ray = ray
        self.peers = dict(peers)
        self.inbox = inbox
        self.timeout_s = timeout_s
        self.step = 0
        self.deliveries: list[tuple[str, Any]] = []

    def send(self, transfer: Transfer, micro_batch: int | None, value: Any) -> None:
        peer = self.peers[transfer.dst_mesh]
        ref = peer.deliver.remote(self.step, transfer.name, micro_batch, np.asarray(value))
        self.deliveries.append((transfer.dst_mesh, ref))

    def recv(self, transfer: Transfer, micro_batch: int | None) -> Any:
        return self.inbox.take((self.step, transfer.name, micro_batch), self.timeout_s)

    def finish(self) -> None:
        """Wait until every delivery of this step has been accepted; a peer
        that died meanwhile is an AlpaError naming its mesh."""
        from ray.exceptions import GetTimeoutError, RayActorError

        pending, self.deliveries = self.deliveries, []
        deadline = time.monotonic() + self.timeout_s
        for mesh, ref in pending:
            try:
                self.ray.get(ref, timeout=max(deadline - time.monotonic(), 0.0))
            except RayActorError as err:
                raise AlpaError(
                    f"the mesh worker of @{mesh} died before taking transfer(s) of step {self.step}"
                ) from err
            except GetTimeoutError as err:
                raise AlpaError(
                    f"the mesh worker of @{mesh} did not take its transfers within "
                    f"{self.timeout_s:.0f} s"
                ) from err


class MeshWorker:
    """The body of the Ray actor of one mesh (wrapped by ``ray.remote`` at creation)."""

    def __init__(self, mesh: str, num_devices: int) -> None:
        import jax

        devices = jax.devices()
        if len(devices) < num_devices:
            raise AlpaError(
                f"mesh worker @{mesh} needs {num_devices} devices, its process has {len(devices)}"
            )
        self.mesh = mesh
        self.devices = devices[:num_devices]
        self.inbox = Inbox()
        self.interpreter: Any = None
        self.transport: RayTransport | None = None

    def ready(self) -> int:
        """The worker's process id, once it is up."""
        return os.getpid()

    def load(
        self,
        module_text: str,
        program: StepProgram,
        peers: Mapping[str, Any],
        timeout_s: float,
        compile_functions: CompileFunctions,
    ) -> int:
        """Take the program (once) and compile this mesh's stage functions with
        the backend's ``compile_functions``; returns how many were compiled."""
        from alpa_ir.ir.text import parse_module
        from alpa_ir.runtime.interpreter import MeshInterpreter

        module = parse_module(module_text)
        jax_mesh, functions = compile_functions(module, program, self.mesh, self.devices)
        self.transport = RayTransport(peers, self.inbox, timeout_s)
        self.interpreter = MeshInterpreter(program, self.mesh, jax_mesh, functions, self.transport)
        return len(functions)

    def events(self) -> list[Any]:
        """When each instruction of the last recorded step ran (``RuntimeEvent``s)."""
        return list(self.interpreter.events or ()) if self.interpreter is not None else []

    def deliver(self, step: int, transfer: str, micro_batch: int | None, value: Any) -> None:
        self.inbox.put((step, transfer, micro_batch), value)

    def abort(self, reason: str) -> None:
        """Make a step waiting for a transfer fail now."""
        self.inbox.abort(reason)

    def run_step(
        self, step: int, inputs: Mapping[Key, Any], record: bool = False
    ) -> dict[str, np.ndarray]:
        """Run the instruction list once; the step's outputs that live here, as
        numpy. With ``record`` the step's instructions are timed (:meth:`events`)."""
        if self.interpreter is None or self.transport is None:
            raise AlpaError(f"mesh worker @{self.mesh} has no program; load one first")
        self.interpreter.events = [] if record else None
        self.transport.step = step
        outputs = self.interpreter.run(inputs)
        self.transport.finish()
        return {k: np.asarray(v) for k, v in outputs.items()}
