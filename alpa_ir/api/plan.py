"""``alpa_ir.compile``: a step's plan without running it.

``compile(fn, *args, method=...)`` imports the step and runs the method's
pass pipeline, as ``parallelize`` does, but compiles nothing for the devices:
it returns a :class:`Plan` that holds the imported module, the pass pipeline
(``alpa-opt --pass-pipeline=...`` replays it), the planned module, the pass
statistics and what the plan predicts (memory per device; for automatic
pipeline stages, the simulated step time the planner chose them with). A
plan prints as a summary, saves to a folder and loads back
(:meth:`Plan.save`, :meth:`Plan.load`), and turns into the method's
executable on this process's devices (:meth:`Plan.executable`) while it
holds the step it was made from: the planned module is compiled as it is,
not planned again.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from xdsl.dialects.builtin import ModuleOp

from alpa_ir.api.donation import DonateArgnums, resolve_donate_argnums
from alpa_ir.errors import AlpaError
from alpa_ir.frontend.arguments import StaticArgnums
from alpa_ir.hardware.memory_budget import format_gib
from alpa_ir.passmanager.pass_statistics import PassStatistic

_FILES = ("input_module.mlir", "pass_pipeline.txt", "module.mlir", "plan.json")


@dataclass(frozen=True)
class Plan:
    """A planned step (module docstring)."""

    method: str
    """The method that planned it, as written (``ShardParallel(...)``)."""
    input_module: ModuleOp
    """The step as imported, before any pass."""
    pass_pipeline: str
    """The pipeline that turns ``input_module`` into ``module``."""
    module: ModuleOp
    """The planned module."""
    statistics: tuple[PassStatistic, ...] = ()
    """What the passes recorded (ILP sizes, solve times, ...)."""
    peak_memory: tuple[float, ...] = ()
    """Predicted bytes per device: one figure per mesh (a pipeline: per stage)."""
    step_time: float | None = None
    """Predicted seconds per step: for automatic stages the simulated time
    ``construct-stages`` chose them with; for one mesh (``ShardParallel``,
    ``DataParallel``, ``Zero3Parallel``, ...) the planned program priced on its
    mesh of the local devices (:func:`planned_step_time`); None where nothing
    timed the plan (given pipeline stages, the ray backend)."""
    _build: Callable[[], Any] | None = field(default=None, repr=False, compare=False)

    def __str__(self) -> str:
        lines = [f"plan of {self.method}", f"  pass pipeline: {self.pass_pipeline}"]
        if self.peak_memory:
            peaks = ", ".join(format_gib(p) for p in self.peak_memory)
            lines.append(f"  predicted memory per device: {peaks}")
        if self.step_time is not None:
            lines.append(f"  simulated step time: {self.step_time:.6g} s")
        solve = sum(s.value for s in self.statistics if s.name == "solve-time")
        if solve:
            lines.append(f"  ILP solve time: {solve:.3g} s")
        return "\n".join(lines)

    def executable(self) -> Any:
        """The method's executable of this plan on this process's devices (a
        plan loaded from a folder has no step to run: replay it instead)."""
        if self._build is None:
            raise AlpaError(
                "Plan.executable: this plan was loaded from a folder and holds no step; "
                "compile the step again, or replay the plan with alpa-opt"
            )
        return self._build()

    def save(self, folder: str | os.PathLike[str]) -> Path:
        """Write the plan under ``folder`` (created): the two modules, the pass
        pipeline and ``plan.json`` (method, predictions, statistics)."""
        path = Path(folder)
        path.mkdir(parents=True, exist_ok=True)
        (path / "input_module.mlir").write_text(str(self.input_module) + "\n")
        (path / "pass_pipeline.txt").write_text(self.pass_pipeline + "\n")
        (path / "module.mlir").write_text(str(self.module) + "\n")
        meta = {
            "method": self.method,
            "peak_memory": list(self.peak_memory),
            "step_time": self.step_time,
            "statistics": [asdict(s) for s in self.statistics],
        }
        (path / "plan.json").write_text(json.dumps(meta, indent=1) + "\n")
        return path

    @staticmethod
    def load(folder: str | os.PathLike[str]) -> Plan:
        """The plan :meth:`save` wrote under ``folder``."""
        from alpa_ir.ir.text import parse_module

        path = Path(folder)
        missing = [name for name in _FILES if not (path / name).is_file()]
        if missing:
            raise AlpaError(f"Plan.load: {path} has no {', '.join(missing)} (not a saved plan)")
        try:
            meta = json.loads((path / "plan.json").read_text())
            statistics = tuple(PassStatistic(**s) for s in meta["statistics"])
            method, peaks, time = meta["method"], meta["peak_memory"], meta["step_time"]
        except (ValueError, KeyError, TypeError) as error:
            raise AlpaError(f"Plan.load: {path / 'plan.json'} is not a plan's: {error}") from None
        return Plan(
            method,
            parse_module((path / "input_module.mlir").read_text()),
            (path / "pass_pipeline.txt").read_text().strip(),
            parse_module((path / "module.mlir").read_text()),
            statistics,
            tuple(float(p) for p in peaks),
            None if time is None else float(time),
        )


def compile(
    fn: Callable[..., Any],
    *args: Any,
    method: Any = None,
    static_argnums: StaticArgnums = "auto",
    donate_argnums: DonateArgnums = "auto",
    batch_argnums: Sequence[int] = (1,),
) -> Plan:
    """Plan ``fn`` for ``args`` with ``method`` (default ``ShardParallel()``;
    arguments as :func:`~alpa_ir.api.parallel.parallelize` takes them) and
    return the :class:`Plan`; nothing is compiled for the devices or run."""
    from alpa_ir.api.parallel import _check_method, _is_pipeshard
    from alpa_ir.api.plan_step import plan_step, sharded_executable
    from alpa_ir.api.shard_parallel import ShardParallel

    method = method if method is not None else ShardParallel()
    _check_method(method)
    options = {
        "donate_argnums": resolve_donate_argnums(donate_argnums, len(args)),
        "batch_argnums": batch_argnums,
        "static_argnums": static_argnums,
    }
    if _is_pipeshard(method):
        return _pipeline_plan(fn, args, method, options)
    planned = plan_step(fn, args, method, **options)  # type: ignore[arg-type]
    return Plan(
        repr(method),
        planned.input_module,
        planned.pass_pipeline,
        planned.module,
        planned.statistics,
        (planned.peak_memory(),),
        None if planned.backend == "ray" else planned_step_time(planned.module),
        lambda: sharded_executable(planned, method, args),  # type: ignore[arg-type]
    )


def planned_step_time(module: ModuleOp, cluster: Any = None, options: Any = None) -> float | None:
    """The predicted seconds of a single-mesh plan's step: its planned ``@main``
    priced by the analytical stage cost model
    (:meth:`~alpa_ir.costs.analytical_stage_cost.AnalyticalStageCostModel.price_planned`,
    the prices the planner plans with, operator fusion on as ``alpa-bench``
    prices) on its mesh of ``cluster`` (default: the local devices,
    ``local-cpu``, α/β re-derived from it; a cluster with a device profile,
    ``Cluster.with_profile``, is priced by the profile). None when ``@main``
    has no mesh."""
    from alpa_ir.costs.analytical_stage_cost import AnalyticalStageCostModel
    from alpa_ir.costs.stage_cost import StageCostOptions
    from alpa_ir.dialects.mesh import LogicalMeshOp, mesh_name_of
    from alpa_ir.hardware.clusters import local_cpu
    from alpa_ir.ir.module_utils import main_function, symbol_op

    function = main_function(module)
    name = mesh_name_of(function)
    mesh_op = symbol_op(module, name, LogicalMeshOp) if name else None
    if not isinstance(mesh_op, LogicalMeshOp):
        return None
    cluster = cluster if cluster is not None else local_cpu()
    mesh = cluster.logical_mesh(mesh_op.mesh_shape, mesh_op.device_ids)
    model = AnalyticalStageCostModel(options or StageCostOptions(fusion=True))
    return model.price_planned(function, mesh, cluster).latency


def _pipeline_plan(
    fn: Callable[..., Any], args: tuple[Any, ...], method: Any, options: dict[str, Any]
) -> Plan:
    from alpa_ir.api.pipeshard_executable import pipeshard_executable, plan_pipeshard

    planned = plan_pipeshard(fn, args, method, **options)
    return Plan(
        repr(method),
        planned.input_module,
        planned.pass_pipeline,
        planned.module,
        planned.statistics,
        tuple(p.peak for p in planned.stage_peaks()),
        _planned_time(planned.module),
        lambda: pipeshard_executable(planned),
    )


def _planned_time(module: ModuleOp) -> float | None:
    """The seconds per step ``construct-stages`` chose the plan with: the
    simulated time of the chosen schedule, else the stage DP's latency (None for
    given stages: nothing timed them)."""
    from xdsl.dialects.builtin import DictionaryAttr, FloatAttr

    from alpa_ir.dialects.pipeline import PlanOp
    from alpa_ir.ir.module_utils import top_level_ops
    from alpa_ir.pipeline.stage_construction import LATENCY_ATTR, SCHEDULES_ATTR

    for plan in top_level_ops(module, PlanOp):
        assert isinstance(plan, PlanOp)
        times = plan.attributes.get(SCHEDULES_ATTR)  # schedule=auto: each candidate's
        chosen = times.data.get(plan.schedule.data) if isinstance(times, DictionaryAttr) else None
        if not isinstance(chosen, FloatAttr):
            chosen = plan.attributes.get(LATENCY_ATTR)  # the stage DP's own
        if isinstance(chosen, FloatAttr):
            return float(chosen.value.data)
    return None


__all__ = ["Plan", "compile", "planned_step_time"]
