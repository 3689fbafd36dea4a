"""One Ray actor per host: the host's devices in one JAX multi-controller world.

A :class:`HostWorker` owns every device of its Ray node (on CPU the node's
``alpa_cpu_device`` count, set as ``--xla_force_host_platform_device_count``
in its environment; on GPU the node's GPUs). The workers of a step join one
JAX world (``jax.distributed.initialize``, the coordinator at worker 0's
address); a mesh's SPMD program is then called by every worker on global
arrays, each worker holding the shards on its own devices, and XLA runs the
program's collectives across processes: gloo on CPU, NCCL on GPU. Nothing
here moves tensors by hand.

The program is compiled on the worker by the backend's compiler (passed in
``load``: the runtime never compiles by itself). Inputs arrive whole (numpy)
and each worker places its shards; each worker returns its shards of the
outputs, put together by the driver.

The workers of a cluster are shared by every executable (a train step, an
eval step, ``create_state``: :mod:`alpa_ir.backends.ray_host_pool`): each
loads its programs under a key of its own and unloads them when it closes.
A mesh may cover only some hosts of the world; the other workers take no
part in its programs.
"""

from __future__ import annotations

import os
import socket
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from alpa_ir.errors import AlpaError

HostProgram = tuple[Callable[..., Sequence[Any]], tuple[Any, ...]]
"""A compiled SPMD program on global devices and the sharding of each input."""
CompileHostProgram = Callable[[str, Sequence[Any], dict[str, Any]], HostProgram]
"""The backend's compiler: ``(module text, the mesh's devices in mesh order,
options) -> program``."""


class HostWorker:
    """A Ray actor holding one host's devices (module docstring)."""

    def __init__(self, host: str, num_devices: int) -> None:
        self.host = host
        self.num_devices = num_devices
        self.process_id = -1
        self.world: tuple[str, ...] = ()
        """The Ray node ids of the world's processes, in process order."""
        self.programs: dict[str, HostProgram | None] = {}
        """Each executable's single-mesh program; None where its mesh has no
        device of this host."""
        self.pipelines: dict[str, Any] = {}
        """Each executable's pipeline step."""
        self.handle: Any = None

    def coordinator_address(self) -> str:
        """``ip:port`` of a free port on this host, for the JAX coordinator."""
        import ray

        ip = ray.util.get_node_ip_address()
        with socket.socket() as s:
            s.bind((ip, 0))
            return f"{ip}:{s.getsockname()[1]}"

    def connect(
        self, coordinator: str, num_processes: int, process_id: int, world: Sequence[str] = ()
    ) -> int:
        """Join the JAX world as process ``process_id`` (of the Ray nodes
        ``world``, in process order); returns this worker's process id."""
        import jax

        # between processes on CPU, XLA's collectives need gloo; inside one
        # process its own are faster (asking jax would start its backend)
        if num_processes > 1 and os.environ.get("JAX_PLATFORMS", "") == "cpu":
            jax.config.update("jax_cpu_collectives_implementation", "gloo")
        jax.distributed.initialize(coordinator, num_processes=num_processes, process_id=process_id)
        self.process_id = process_id
        self.world = tuple(world)
        try:
            local = len(jax.local_devices())
        except Exception as err:  # no devices of JAX_PLATFORMS here (an AssertionError on 0.10)
            platforms = os.environ.get("JAX_PLATFORMS", "") or "any"
            raise AlpaError(
                f"host {self.host}: JAX found no devices of platform {platforms} "
                f"({type(err).__name__}: {err})"
            ) from err
        if local != self.num_devices:
            raise AlpaError(f"host {self.host} sees {local} devices, expected {self.num_devices}")
        return os.getpid()

    def keep(self, handle: Any) -> None:
        """Hold a handle to this actor, so that it lives as long as the driver
        that started it (Ray collects an actor when its creator's handles are
        gone; the handles the cluster's other executables find by name do not
        count); it ends with the driver, or when killed."""
        self.handle = handle

    def world_nodes(self) -> tuple[str, ...]:
        """The Ray node ids of the world this worker joined (empty before)."""
        return self.world

    def unload(self, key: str) -> None:
        """Forget the programs of the executable ``key`` (it closed)."""
        self.programs.pop(key, None)
        self.pipelines.pop(key, None)

    def load(
        self,
        key: str,
        module_text: str,
        device_ids: Sequence[int],
        options: dict[str, Any],
        compile_program: CompileHostProgram,
    ) -> int:
        """Compile the step of the executable ``key`` for the mesh of global
        devices ``device_ids`` (ids counted process by process); returns how
        many of them are on this host (none: nothing is compiled here)."""
        import jax

        devices = world_devices()
        if max(device_ids) >= len(devices):
            raise AlpaError(
                f"the mesh needs device {max(device_ids)}; the world has {len(devices)}"
            )
        mesh_devices = [devices[k] for k in device_ids]
        here = sum(d.process_index == jax.process_index() for d in mesh_devices)
        self.programs[key] = compile_program(module_text, mesh_devices, options) if here else None
        return here

    def load_pipeline(
        self,
        key: str,
        module_text: str,
        program: Any,
        order: Sequence[tuple[str, int]],
        compile_functions: Any,
    ) -> list[str]:
        """Take the pipeline step of the executable ``key`` (a
        :class:`~alpa_ir.runtime.program.StepProgram` and the global
        instruction order) and compile the stage functions and transfers that
        touch this host; returns the meshes it runs."""
        from alpa_ir.ir.text import parse_module
        from alpa_ir.runtime.host_pipeline import HostPipeline

        devices = dict(enumerate(world_devices()))
        pipeline = HostPipeline(
            parse_module(module_text), program, order, devices, compile_functions
        )
        self.pipelines[key] = pipeline
        return list(pipeline.interpreters)

    def run_pipeline_step(self, key: str, inputs: dict[str, Any], record: bool = False) -> Any:
        """One pipeline step of the executable ``key``: the shards of the
        outputs this host holds and, with ``record``, when each of its
        instructions ran."""
        if key not in self.pipelines:
            raise AlpaError(f"host worker {self.host} has no pipeline {key}; load it first")
        return self.pipelines[key].run(inputs, record)

    def write_checkpoint(
        self,
        path: str,
        number: int,
        arrays: dict[str, np.ndarray],
        manifest: Any,
        write: Callable[..., Any],
    ) -> None:
        """Write a checkpoint with every host of the world, each array split
        over the world's devices (:func:`world_placed`), this host holding its
        devices' shards; ``write`` is the checkpoint writer (orbax: each
        process writes its own shards)."""
        write(path, number, {k: world_placed(v) for k, v in arrays.items()}, manifest)

    def run_step(self, key: str, flat: Sequence[np.ndarray]) -> list[Any]:
        """One call of the executable ``key``'s program on the whole inputs;
        this host's shards of each output (:class:`~alpa_ir.runtime.host_pipeline.Shards`)."""
        import jax

        from alpa_ir.runtime.host_pipeline import local_shards

        if key not in self.programs:
            raise AlpaError(f"host worker {self.host} has no program {key}; load it first")
        program = self.programs[key]
        if program is None:  # its mesh has no device here
            return []
        run, in_shardings = program
        arrays = [
            jax.make_array_from_callback(np.shape(x), s, lambda index, x=x: x[index])
            for x, s in zip(flat, in_shardings, strict=True)
        ]
        return [local_shards(y) for y in run(*arrays)]

    def pid(self) -> int:
        return os.getpid()


def world_devices() -> list[Any]:
    """Every device of the JAX world, host by host: the plan's device ids index it."""
    import jax

    return sorted(jax.devices(), key=lambda d: (d.process_index, d.id))


def world_placed(leaf: np.ndarray) -> Any:
    """A numpy array as a global array over every device of the world, split
    along its largest dimension they divide (else whole)."""
    import jax
    from jax.sharding import Mesh, NamedSharding, PartitionSpec

    devices = world_devices()
    mesh = Mesh(np.array(devices, dtype=object), ("world",))
    dims = [d for d in np.argsort(leaf.shape)[::-1] if leaf.shape[d] % len(devices) == 0]
    spec = [None] * leaf.ndim
    if dims and leaf.shape[dims[0]] > 0:
        spec[dims[0]] = "world"
    array = jax.make_array_from_callback(
        leaf.shape, NamedSharding(mesh, PartitionSpec(*spec)), lambda index: leaf[index],
        dtype=leaf.dtype,
    )  # fmt: skip
    return array
