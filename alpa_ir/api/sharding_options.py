"""The options of the intra-operator planner and the pipeline string each
builds: shared by the parallel methods (:mod:`alpa_ir.api.shard_parallel`) and the named
pipelines of the built-in plugin, without importing either."""

from __future__ import annotations

import warnings
from dataclasses import dataclass
from typing import Literal


@dataclass
class AutoShardingOption:
    """Options of the intra-operator planner (the ``auto-sharding`` pass).

    Mutable, as Alpa's: Alpa's users and tests set fields on an option (and on
    a method) before they parallelize (``option.prefer_reduce_scatter = True``);
    the option is read when the step is compiled, as in Alpa. Alpa's fields
    come first, in Alpa's order (``AutoShardingOption(False)`` is Alpa's
    ``enable_auto_sharding=False``), then this planner's own."""

    enable_auto_sharding: bool = True
    """False: no ILP; the specs of a :class:`ManualShardingOption` are only
    propagated (by XLA's SPMD partitioner), as Alpa's ``enable_auto_sharding=False``."""
    allow_all_gather: bool = True
    allow_all_to_all: bool = True
    allow_replicated_parameters: bool = True
    force_data_parallel: bool = False
    force_batch_dim_to_mesh_dim: int | None = None
    """Split the batch dimension of every op over this mesh axis (Alpa's option)."""
    force_zero_stage_3: bool = False
    """Alpa's ZeRO-3: the parameters stay sharded too, all-gathered where read
    (``reduce_scatter="zero3"``)."""
    force_zero_stage_3_all_gather_threshold: int = 1 << 25
    """Alpa's all-gather combiner threshold: XLA combines here; a value set is warned of."""
    prefer_reduce_scatter: bool = False
    allow_mixed_mesh_shape: bool = True
    """Allow a tensor dimension split over both axes of a 2-d mesh (S01). On
    by default, unlike Alpa: without it a 2-d mesh cannot express data
    parallelism over all its devices, and the ILP returned plans its own cost
    model rates worse than data parallel (a conv + attention classifier on a
    (2, 4) mesh: 51,058 against 11,962)."""
    allow_recompute_heavy_op: bool = False
    """Alpa's replicated dot computation: a matmul or convolution may leave a mesh
    axis unused, each device of that axis computing the same thing."""
    force_simple_heuristic: str = ""
    """Alpa's heuristic instead of the ILP: any name means :attr:`heuristic`."""
    all_reduce_threshold: int = 1 << 60
    """Alpa's all-reduce combiner threshold: XLA combines here; a value set is warned of."""
    solver: str = "cbc"
    time_limit: float = 600.0
    memory_budget: float | None = None
    heuristic: bool = False
    """Alpa's "Heuristic" baseline: shard the largest dimension of every input."""
    reduce_scatter: Literal["auto", "none", "zero2", "zero3"] = "auto"
    """The post-ILP rewrite of gradient all-reduces: ``auto`` is Alpa's
    (ZeRO-2 with :attr:`prefer_reduce_scatter`, ZeRO-3 with
    :attr:`force_zero_stage_3`, else none: one all-reduce per gradient, which
    XLA combines); ``zero2``/``zero3`` always, ``none`` never."""
    cost_model: str = "auto"
    """The communication cost model: ``auto`` prices a mesh of GPUs with
    ``calibrated`` and any other with Alpa's ``alpha-beta`` (by name for Alpa's
    formulas)."""
    repeated_layers: Literal["auto", "share", "separate"] = "auto"
    """One ILP variable for the copies of a node in identical layers ("share"),
    none ("separate", exact), or "share" for large graphs only ("auto")."""
    check_baselines: bool = True
    """After the solve, price the data-parallel and heuristic plans in the
    ILP's own problem and warn if the plan costs more than either (a solver
    bug; the statistics ``baseline-*`` keep the prices). Two more solves."""

    def pipeline(self, num_micro_batches: int) -> str:
        _warn_unused(self)
        # Alpa: ZeRO-3 is data parallel; data parallel forbids all-gather and
        # all-to-all (no activation may leave its batch split)
        data_parallel = self.force_data_parallel or self.force_zero_stage_3
        opts = {
            "solver": self.solver,
            "time-limit": self.time_limit,
            "memory-budget": float(self.memory_budget or 0.0),
            "allow-all-gather": self.allow_all_gather and not data_parallel,
            "allow-all-to-all": self.allow_all_to_all and not data_parallel,
            "allow-replicated-parameters": self.allow_replicated_parameters,
            "allow-mixed-mesh-shape": self.allow_mixed_mesh_shape,
            "allow-recompute-heavy-op": self.allow_recompute_heavy_op,
            "force-batch-dim-to-mesh-dim": -1
            if self.force_batch_dim_to_mesh_dim is None
            else self.force_batch_dim_to_mesh_dim,
            "prefer-reduce-scatter": self.prefer_reduce_scatter,
            "force-data-parallel": data_parallel,
            "strategy-space": "heuristic"
            if self.heuristic or self.force_simple_heuristic
            else "ilp",
            "cost-model": self.cost_model,
            "repeated-layers": self.repeated_layers,
            "check-baselines": self.check_baselines,
            "compute-grad-scale": float(num_micro_batches),
        }
        text = " ".join(f"{k}={_option(v)}" for k, v in opts.items())
        passes = ["merge-trivial-ops", f"auto-sharding{{{text}}}"]
        mode = "zero3" if self.force_zero_stage_3 else self.reduce_scatter
        if mode not in ("auto", "none"):  # auto: auto-sharding's prefer-reduce-scatter
            passes.append(f"reduce-scatter-rewrite{{mode={mode}}}")
        return "builtin.module(" + ",".join(passes) + ")"


_NO_MEANING = {
    "force_zero_stage_3_all_gather_threshold": "XLA's all-gather combiner decides",
    "all_reduce_threshold": "XLA's all-reduce combiner decides",
}


def _warn_unused(option: AutoShardingOption) -> None:
    default = AutoShardingOption.__dataclass_fields__
    for name, why in _NO_MEANING.items():
        if getattr(option, name) != default[name].default:
            warnings.warn(f"AutoShardingOption.{name} has no effect here: {why}", stacklevel=3)


def _option(value: object) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


def data_parallel_option(reduce_scatter: Literal["none", "zero2", "zero3"]) -> AutoShardingOption:
    """Batch split over all devices, parameters replicated, one all-reduce per
    gradient. The plan is made on the mesh flattened to one axis (see
    :func:`alpa_ir.api.plan_step.compile_step`) and without all-gather and all-to-all, so no
    activation can leave its batch split (with all-gather allowed the ILP finds
    cheaper model-parallel plans for small models). Known gap: Wide-ResNet has
    no plan under these options (PlanError).

    ZeRO-2 and ZeRO-3 are set by Alpa's flags (``prefer_reduce_scatter``,
    ``force_zero_stage_3``), as Alpa's ``Zero2Parallel``/``Zero3Parallel`` set
    them, so that code reading ``method.as_option`` sees what the method does."""
    return AutoShardingOption(
        force_data_parallel=True,
        allow_all_gather=False,
        allow_all_to_all=False,
        prefer_reduce_scatter=reduce_scatter == "zero2",
        force_zero_stage_3=reduce_scatter == "zero3",
        reduce_scatter="none" if reduce_scatter == "none" else "auto",
    )


def heuristic_option() -> AutoShardingOption:
    """Alpa's "Heuristic" baseline: the largest dimension of every input split,
    the rest planned to match."""
    return AutoShardingOption(heuristic=True, reduce_scatter="none", allow_mixed_mesh_shape=True)
