"""alpa_ir: an automatic parallelizing compiler for JAX training steps (import alpa_ir).

Public API (imported lazily, so that ``import alpa_ir`` stays cheap for tools
that need no JAX):

- ``import_jax(fn, *example_args)`` -> module; ``str(module)`` is its text,
  ``parse_module(text)`` the way back.
- ``execute(module, *args, backend="xla")`` runs a module; ``compile_module``
  returns a reusable executable.
- ``parallelize(fn, method=ShardParallel(...))``: plan and run a training step
  on the local devices (methods ``ShardParallel``, ``DataParallel``,
  ``Zero2Parallel``, ``Zero3Parallel``, ``HeuristicParallel``, ``ManualShardParallel``).
- ``compile(fn, *args, method=...)`` -> ``Plan``: the plan without running it
  (modules, pass pipeline, statistics, predicted memory and step time;
  printable, ``save``/``Plan.load``, ``executable()``).
- ``save_checkpoint(path, state, step)``, ``restore_checkpoint(path, target)``:
  plan-independent checkpoints of (sharded) training states.
- ``train(step, state, batch_fn, method=..., num_steps=..., checkpoint_dir=...,
  checkpoint_every=...)``: the training loop, with checkpoints; it resumes
  from ``checkpoint_dir`` and survives a lost Ray host (re-plans, restores,
  replays; ``RecoveryOption``).
- ``hlo_collectives(text)``: the collectives of compiled HLO text.
- ``mark_pipeline_boundary``, ``grad``, ``value_and_grad``: markers for steps.
- ``get_3d_parallel_method(num_micro_batches, dp, op, pp)``: Megatron-style 3-D
  parallelism (a ``PipeshardParallel``, or ``ShardParallel`` when pp = 1).
- Alpa's names for pipelines and meshes: ``PipeshardParallel``, the layer
  options ``ManualLayerOption``/``AutoLayerOption``, the stage options
  ``UniformStageOption``/``ManualStageOption``/``AutoStageOption``,
  ``ManualShardingOption``, ``stage_dp`` (the stage DP of Eq. 2-5),
  ``PhysicalDeviceMesh`` and ``get_global_physical_mesh``: an Alpa program
  runs with ``import alpa_ir as alpa``.
"""

from __future__ import annotations

import importlib
from typing import Any

_EXPORTS: dict[str, str] = {
    "import_jax": "alpa_ir.frontend.jaxpr_import",
    "parse_module": "alpa_ir.ir.text",
    "print_module": "alpa_ir.ir.text",
    "execute": "alpa_ir.api.run_module",
    "compile_module": "alpa_ir.api.run_module",
    "mark_pipeline_boundary": "alpa_ir.frontend.markers",
    "manual_layer_construction": "alpa_ir.frontend.markers",
    "grad": "alpa_ir.frontend.markers",
    "value_and_grad": "alpa_ir.frontend.markers",
    "AlpaError": "alpa_ir.errors",
    "hlo_collectives": "alpa_ir.costs.collective_accounting",
    "parallelize": "alpa_ir.api.parallel",
    "compile": "alpa_ir.api.plan",
    "Plan": "alpa_ir.api.plan",
    "ShardParallel": "alpa_ir.api.shard_parallel",
    "DataParallel": "alpa_ir.api.shard_parallel",
    "Zero2Parallel": "alpa_ir.api.shard_parallel",
    "Zero3Parallel": "alpa_ir.api.shard_parallel",
    "HeuristicParallel": "alpa_ir.api.shard_parallel",
    "ManualShardParallel": "alpa_ir.api.shard_parallel",
    "CreateStateParallel": "alpa_ir.api.follow_parallel",
    "FollowParallel": "alpa_ir.api.follow_parallel",
    "plan_to_method": "alpa_ir.api.parallel_plan",
    "DataLoader": "alpa_ir.api.data_loader",
    "MeshDriverDataLoader": "alpa_ir.api.data_loader",
    "AutoShardingOption": "alpa_ir.api.sharding_options",
    "get_3d_parallel_method": "alpa_ir.api.three_d",
    "PipeshardParallel": "alpa_ir.api.pipeshard",
    "LocalPipelineParallel": "alpa_ir.api.pipeshard",
    "ManualLayerOption": "alpa_ir.api.pipeshard",
    "AutoLayerOption": "alpa_ir.api.pipeshard",
    "UniformStageOption": "alpa_ir.api.pipeshard",
    "ManualStageOption": "alpa_ir.api.pipeshard",
    "AutoStageOption": "alpa_ir.api.pipeshard",
    "ManualShardingOption": "alpa_ir.api.manual_sharding",
    "stage_dp": "alpa_ir.algorithms.stage_dp",
    "LogicalDeviceMesh": "alpa_ir.hardware.device_mesh",
    "PhysicalDeviceMesh": "alpa_ir.hardware.device_mesh",
    "get_global_physical_mesh": "alpa_ir.compat.device_cluster",
    "get_global_virtual_physical_mesh": "alpa_ir.compat.device_cluster",
    "set_global_virtual_physical_mesh": "alpa_ir.compat.device_cluster",
    "prefetch": "alpa_ir.compat.device_cluster",
    "init": "alpa_ir.api.runtime_api",
    "shutdown": "alpa_ir.api.runtime_api",
    "save_checkpoint": "alpa_ir.api.checkpoint",
    "restore_checkpoint": "alpa_ir.api.checkpoint",
    "HloStatus": "alpa_ir.api.hlo_status",
    "train": "alpa_ir.api.train",
    "RecoveryOption": "alpa_ir.api.train",
    "global_config": "alpa_ir.api.global_config",
    "set_seed": "alpa_ir.api.random_seed",
    "DeviceCluster": "alpa_ir.compat.device_cluster",
    "get_global_cluster": "alpa_ir.compat.device_cluster",
    "LocalPhysicalDeviceMesh": "alpa_ir.compat.device_cluster",
    "DistributedArray": "alpa_ir.compat.device_cluster",
}

__version__ = "0.1.0"

__all__ = sorted(_EXPORTS)


_SUBMODULES = frozenset({"testing", "util", "device_mesh", "model"})
"""Alpa's helper modules, reached as attributes as in Alpa (``alpa.util.benchmark_func``)."""


def __getattr__(name: str) -> Any:
    if name in _SUBMODULES:
        return importlib.import_module(f"alpa_ir.{name}")
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'alpa_ir' has no attribute '{name}'")
    return getattr(importlib.import_module(module), name)


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_EXPORTS) | _SUBMODULES)
