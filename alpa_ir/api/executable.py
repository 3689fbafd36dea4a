"""What every executable of a planned step is: its modules, its pass pipeline
and the methods a user calls on it, whichever method planned it.

:class:`~alpa_ir.api.sharded_executable.ShardedExecutable` (one mesh) and
:class:`~alpa_ir.api.pipeshard_executable.PipeshardExecutable` (pipeline
stages on submeshes) derive from :class:`PlannedExecutable`: the planned
``module``, the ``input_module`` it was planned from and the
``pass_pipeline`` that replays it (``alpa-opt``), the pass statistics, and
one signature for calling, explaining, drawing and dumping the plan.
"""

from __future__ import annotations

import os
from abc import ABC, abstractmethod
from typing import Any

from xdsl.dialects.builtin import ModuleOp

from alpa_ir.frontend.arguments import CompiledSignature


class PlannedExecutable(ABC):
    """A step planned by a pass pipeline and compiled by a backend."""

    def __init__(
        self,
        module: ModuleOp,
        signature: CompiledSignature,
        input_module: ModuleOp | None = None,
        pass_pipeline: str = "",
    ) -> None:
        self.module = module
        """The planned module: ``input_module`` after every pass of ``pass_pipeline``."""
        self.signature = signature
        self.in_tree, self.out_tree = signature.in_tree, signature.out_tree
        self.input_module = input_module
        """The step's module as imported, before any pass."""
        self.pass_pipeline = pass_pipeline
        """The exact pipeline that turns ``input_module`` into ``module``
        (``alpa-opt --pass-pipeline=...`` replays it)."""
        self.pass_statistics: tuple[Any, ...] = ()
        """What the passes recorded while planning (ILP size, solve time; see
        :mod:`alpa_ir.passmanager.pass_statistics`)."""

    @property
    def remote(self) -> Any:
        """The Ray executable when the step runs on the ray backend, else None."""
        return None

    def close(self) -> None:
        """Release the Ray workers of a step on the ray backend (they forget its
        programs and stay for the cluster's other executables)."""
        if self.remote is not None:
            self.remote.close()

    def sync(self) -> None:
        """Alpa's: wait until the steps this executable launched have finished
        (to time them). A step on the ray backend returns when its workers
        have; on this process's devices JAX dispatches asynchronously, and a
        device runs its programs in order, so a tiny computation is run and
        waited for on every local device."""
        if self.remote is not None:
            return
        import jax
        import numpy as np

        for device in jax.local_devices():
            (jax.device_put(np.zeros((), np.int32), device) + 1).block_until_ready()

    def sync_move_workers(self) -> None:
        """Wait until the checkpoints saved with a ``local_cache_dir`` are moved
        into their directories (Alpa's; :mod:`alpa_ir.api.checkpoint.cache_moves`)."""
        from alpa_ir.api.checkpoint.cache_moves import sync_moves

        sync_moves()

    @abstractmethod
    def __call__(self, *args: Any) -> Any:
        """Run one step on the step's full argument list."""

    @abstractmethod
    def plan_text(self) -> str:
        """The plan in words: meshes, devices and the largest inputs' shardings."""

    @abstractmethod
    def why_text(self, top: int = 3) -> str:
        """Why the plan costs what it costs: its largest communication terms."""

    @abstractmethod
    def plot(self, kind: str, path: str | os.PathLike[str]) -> Any:
        """Draw the plan (``devices``, ``shardings``, ``communication``, ...) into ``path``."""

    @abstractmethod
    def get_input_shardings(self) -> Any:
        """Where each input array lives, as a pytree like the arguments."""

    @abstractmethod
    def get_input_avals(self) -> Any:
        """A ``jax.ShapeDtypeStruct`` (shape, dtype, sharding) per input array."""

    @abstractmethod
    def hlo_files(self, *args: Any) -> dict[str, str]:
        """The compiled HLO of each program, by file name under ``hlo/``."""

    @abstractmethod
    def get_total_allocation_size(self) -> int:
        """Bytes one device allocates to run the step (Alpa's
        ``get_total_allocation_size``), from XLA's memory analysis of the
        compiled programs (:func:`allocation_bytes`)."""

    def preshard_dynamic_args(self, *args: Any) -> tuple[Any, ...]:
        """The step's dynamic arguments (static ones left out) placed where the
        step reads them (Alpa's ``preshard_dynamic_args``): a later call with
        them moves nothing. On the ray backend the hosts place their inputs
        themselves, so the arguments come back as given."""
        import jax

        dynamic = self.signature.dynamic(args)
        self.signature.flatten(args)  # the arguments the step was compiled for
        if self.remote is not None:
            return dynamic
        shardings = iter(
            jax.tree.leaves(
                self.get_input_shardings(), is_leaf=lambda x: isinstance(x, jax.sharding.Sharding)
            )
        )
        leaves, tree = jax.tree.flatten(dynamic)
        static = {k for k, _ in self.signature.static_leaves}
        placed = [
            x if k in static else jax.device_put(x, next(shardings)) for k, x in enumerate(leaves)
        ]
        return tuple(jax.tree.unflatten(tree, placed))

    method: Any = None
    """The parallel method ``parallelize`` compiled the step with."""

    def get_parallel_plan(self) -> Any:
        """The plan the step was compiled with, its choices fixed (Alpa's;
        :mod:`alpa_ir.api.parallel_plan`): ``plan_to_method(plan)`` compiles it
        again."""
        from alpa_ir.api.parallel_plan import parallel_plan

        return parallel_plan(self)

    def dump_debug_info(self, folder: str, *args: Any) -> Any:
        """Write the imported module, the pass pipeline, the planned module, the
        plan, the compiled HLO and Alpa's files (memory, placements) under ``folder`` (see :mod:`alpa_ir.api.debug_info`;
        ``args``: example arguments where compiling needs them)."""
        from alpa_ir.api.debug_info import alpa_files, write_debug_info

        files = {"module.mlir": str(self.module), "plan.txt": self.plan_text()}
        if self.input_module is not None:
            files["input_module.mlir"] = str(self.input_module)
        if self.pass_pipeline:
            files["pass_pipeline.txt"] = self.pass_pipeline
        files.update(self.hlo_files(*args))
        files.update(alpa_files(self))
        return write_debug_info(folder, files)


def allocation_bytes(compiled: Any) -> int:
    """Bytes one device allocates for a compiled XLA program: its arguments,
    its outputs (less those written into donated arguments) and its
    temporaries, by XLA's memory analysis."""
    stats = compiled.memory_analysis()
    return int(
        stats.argument_size_in_bytes
        + stats.output_size_in_bytes
        - stats.alias_size_in_bytes
        + stats.temp_size_in_bytes
    )


__all__ = ["PlannedExecutable", "allocation_bytes"]
