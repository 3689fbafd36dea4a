"""The profiling stage cost model: compile a stage's function on the local
devices and time it, as Alpa's stage construction does (it compiles and runs
every stage-mesh pair on the cluster's meshes).

For a (function, logical mesh) pair:

* **Plan.** The function is auto-sharded on the mesh exactly as the
  analytical model does (:func:`alpa_ir.costs.function_plan.plan_function`: the
  mesh's α/β in the ILP).
* **Latency.** The planned function is compiled as one SPMD program on the
  first ``mesh.size`` local devices (:func:`alpa_ir.backends.spmd.compile_spmd`)
  and run on zero inputs laid out as the plan says: ``warmup`` runs, then the
  median of ``repeat`` timed runs. The time is the one of *these* devices:
  on this machine's CPU devices the figure ranks plans for the local devices
  (``local-cpu``), not for a GPU cluster preset.
* **Memory.** Parameters, gradients and optimizer state from the plan's
  local shapes and the model's factors (the analytical model's accounting,
  :class:`~alpa_ir.costs.stage_cost.StageMemory`); the activations a micro-batch
  keeps are XLA's temporary buffer size of the compiled program
  (``memory_analysis().temp_size_in_bytes``), like Alpa's profiled
  intermediate size.

Results are cached like the analytical model's: per structural fingerprint of
the function, mesh shape and α/β, options and parameter arguments.
"""

from __future__ import annotations

import math
import statistics
import time
from collections.abc import Sequence
from dataclasses import dataclass, field

import jax
import numpy as np
from jax.sharding import Mesh
from xdsl.dialects import func
from xdsl.ir import SSAValue

from alpa_ir.costs.function_fingerprint import function_fingerprint
from alpa_ir.costs.function_plan import param_args_of, plan_function
from alpa_ir.costs.stage_cost import (
    CacheStats,
    StageCost,
    StageCostOptions,
    StageMemory,
    cached_cost,
)
from alpa_ir.dialects.sharding import spec_of_value
from alpa_ir.dialects.types import dtype_of, shape_of
from alpa_ir.errors import AlpaError
from alpa_ir.hardware.clusters import Cluster
from alpa_ir.hardware.device_mesh import LogicalDeviceMesh


@dataclass
class ProfilingStageCostModel:
    """Stage costs measured on the local devices (module docstring)."""

    options: StageCostOptions = field(default_factory=StageCostOptions)
    warmup: int = 1
    repeat: int = 3
    name: str = "profile"
    stats: CacheStats = field(default_factory=CacheStats)
    _cache: dict[tuple[object, ...], StageCost] = field(default_factory=dict, repr=False)

    def __post_init__(self) -> None:
        if self.repeat < 1 or self.warmup < 0:
            raise AlpaError(
                f"profile stage cost: repeat must be >= 1 and warmup >= 0, "
                f"got {self.repeat} and {self.warmup}"
            )

    def stage_cost(
        self,
        function: func.FuncOp,
        mesh: LogicalDeviceMesh,
        cluster: Cluster,
        param_args: Sequence[int] | None = None,
    ) -> StageCost:
        params = param_args_of(function, param_args)
        key = (
            function_fingerprint(function),
            mesh.shape,
            mesh.alpha,
            mesh.beta,
            self.options,
            params,
        )
        return cached_cost(
            self._cache, self.stats, key, lambda: self._measure(function, mesh, params)
        )

    def _measure(
        self, function: func.FuncOp, mesh: LogicalDeviceMesh, params: tuple[int, ...]
    ) -> StageCost:
        from alpa_ir.backends.spmd import compile_spmd

        available = jax.devices()
        if mesh.size > len(available):
            raise AlpaError(
                f"profile stage cost: a mesh of {mesh.size} devices {list(mesh.shape)} cannot "
                f"be profiled on the {len(available)} local devices"
            )
        planned = plan_function(function, mesh, self.options)
        module = planned.parent_op()
        names = tuple(mesh.axis_names or (f"m{k}" for k in range(len(mesh.shape))))
        devices = np.array(available[: mesh.size], dtype=object).reshape(mesh.shape)
        run, in_shardings = compile_spmd(module, planned, Mesh(devices, names), names)  # type: ignore[arg-type]
        args = [
            jax.device_put(np.zeros(shape_of(a.type), dtype_of(a.type)), s)
            for a, s in zip(planned.args, in_shardings, strict=True)
        ]
        compiled = run.lower(*args).compile()  # type: ignore[attr-defined]
        for _ in range(self.warmup):
            jax.block_until_ready(compiled(*args))
        times = []
        for _ in range(self.repeat):
            start = time.perf_counter()
            jax.block_until_ready(compiled(*args))
            times.append(time.perf_counter() - start)
        latency = statistics.median(times)
        analysis = compiled.memory_analysis()
        temp = float(getattr(analysis, "temp_size_in_bytes", 0) or 0)
        return StageCost(
            latency=latency,
            compute_time=latency,
            memory_time=0.0,
            communication_time=0.0,
            flops=0.0,
            memory=self._memory(planned, mesh.shape, params, temp),
        )

    def _memory(
        self, planned: func.FuncOp, shape: tuple[int, ...], params: tuple[int, ...], temp: float
    ) -> StageMemory:
        def nbytes(value: SSAValue) -> float:
            local = spec_of_value(value, planned).local_shape(shape_of(value.type), shape)
            return float(math.prod(local) * dtype_of(value.type).itemsize)

        parameters = sum(nbytes(planned.args[k]) for k in params)
        return StageMemory(
            parameters=parameters,
            gradients=parameters * self.options.gradient_factor,
            optimizer_state=parameters * self.options.optimizer_state_factor,
            activations=temp,
        )
