"""The ``simulate`` backend: iteration time and per-device peak memory of a
planned pipeline module, without executing anything, for any cluster size.

The simulation itself is :mod:`alpa_ir.pipeline.pipeline_simulation` (re-exported
here); this module reads a :class:`SimPlan` from an outlined module
(:func:`plan_from_module`: each stage function priced by a stage cost model,
each ``pipeline.transfer`` by the link it crosses) and serves it as a backend.
"""

from __future__ import annotations

import math
from dataclasses import replace

from xdsl.dialects import func
from xdsl.dialects.builtin import DenseArrayBase, IntegerAttr, ModuleOp

from alpa_ir.costs.stage_cost import StageCost, StageCostModel
from alpa_ir.dialects.attrs import BATCH_ATTR, CROSS_BYTES_ATTR
from alpa_ir.dialects.lax_attrs import ints_of
from alpa_ir.dialects.mesh import LogicalMeshOp
from alpa_ir.dialects.pipeline import TransferOp, plan_stages
from alpa_ir.dialects.types import dtype_of, shape_of
from alpa_ir.errors import AlpaError
from alpa_ir.hardware.clusters import Cluster
from alpa_ir.hardware.device_mesh import LogicalDeviceMesh
from alpa_ir.ir.module_utils import main_function, symbol_op, top_level_ops
from alpa_ir.pipeline.outlined_pipeline import read_pipeline
from alpa_ir.pipeline.pipeline_simulation import (
    GiB,
    SimPlan,
    SimResult,
    SimStage,
    SimTask,
    SimTransfer,
    eq2_latency,
    simulate,
)


def plan_from_module(
    module: ModuleOp, cluster: Cluster, cost_model: StageCostModel | None = None
) -> SimPlan:
    """The :class:`SimPlan` of an outlined module (the pipeline IR contract): each
    stage's forward, backward and apply-grad functions priced by ``cost_model``
    (default: the analytical model) on its logical mesh, with α/β re-derived from
    ``cluster``; the parameters of a function are the call's operands that are
    non-batch arguments of ``@main``; a stage's persistent memory and activations
    are its forward function's (else its backward's). A ``pipeline.transfer``
    costs ``α + β·bytes`` (``pipeline.cross_bytes``, else the value's bytes) on the
    link between the first devices of its meshes, and counts at the stage
    boundary it crosses (forward values forward, backward values back; with
    several stages on its destination mesh, toward the nearest that reads it).
    Devices that share their host's cores (the profile's ``solo_speedup``)
    share them in the simulation too."""
    from alpa_ir.costs.analytical_stage_cost import AnalyticalStageCostModel

    model = cost_model or AnalyticalStageCostModel()
    pipeline = read_pipeline(module, where="simulate")
    plan = pipeline.plan
    main = main_function(module)
    batch_attr = main.attributes.get(BATCH_ATTR)
    batch = set(ints_of(batch_attr)) if isinstance(batch_attr, DenseArrayBase) else set()
    # the arguments of @main a call reads that are not batch rows (its parameters)
    arguments = {f"main:{k}" for k in range(len(main.args)) if k not in batch}
    stage_of: dict[str, int] = {}
    mesh_stages: dict[str, list[int]] = {}
    meshes: list[LogicalDeviceMesh] = []
    stages: list[SimStage] = []
    for index, stage in enumerate(plan_stages(module)):
        mesh_name = stage.mesh.root_reference.data
        mesh_op = symbol_op(module, mesh_name, LogicalMeshOp)
        assert isinstance(mesh_op, LogicalMeshOp)
        mesh = cluster.logical_mesh(mesh_op.mesh_shape, mesh_op.device_ids)
        meshes.append(mesh)
        mesh_stages.setdefault(mesh_name, []).append(index)
        costs: dict[str, StageCost] = {}
        for phase, name in stage.phase_functions():
            stage_of[name] = index
            function = symbol_op(module, name, func.FuncOp)
            assert isinstance(function, func.FuncOp)
            call = pipeline.calls.get(name)
            operands = call.operands if call is not None else ()
            params = [k for k, v in enumerate(operands) if v in arguments]
            cost = model.stage_cost(function, mesh, cluster, params)
            if phase in costs:  # a later apply-grad round runs after the first
                cost = replace(cost, latency=costs[phase].latency + cost.latency)
            costs[phase] = cost
        main_cost = costs.get("forward") or costs.get("backward")
        stages.append(
            SimStage(
                forward=costs["forward"].latency if "forward" in costs else 0.0,
                backward=costs["backward"].latency if "backward" in costs else 0.0,
                backward_weight=(
                    costs["backward_weight"].latency if "backward_weight" in costs else 0.0
                ),
                apply_grad=costs["apply_grad"].latency if "apply_grad" in costs else 0.0,
                persistent_memory=main_cost.memory.persistent if main_cost else 0.0,
                activation_memory=main_cost.memory.activations if main_cost else 0.0,
                device_memory=cluster.device_memory,
                num_devices=mesh.size,
            )
        )
    num = len(stages)
    readers_of = {v: {c.stage for c in calls} for v, calls in pipeline.consumers.items()}
    forward, backward = [0.0] * (num - 1), [0.0] * (num - 1)
    for transfer in top_level_ops(module, TransferOp):
        assert isinstance(transfer, TransferOp)
        callee, _, result = transfer.value.data.partition(":")
        if callee not in stage_of:
            continue  # an argument of @main: placed by the driver
        src = stage_of[callee]
        on_dst = mesh_stages[transfer.dst_mesh.root_reference.data]
        readers = [s for s in readers_of.get(transfer.value.data, ()) if s in on_dst] or on_dst
        dst = min(readers, key=lambda s: (abs(s - src), s))  # the nearest reading stage
        if src == dst:
            continue
        nbytes_attr = transfer.attributes.get(CROSS_BYTES_ATTR)
        if isinstance(nbytes_attr, IntegerAttr):
            nbytes = float(nbytes_attr.value.data)
        else:
            function = symbol_op(module, callee, func.FuncOp)
            assert isinstance(function, func.FuncOp)
            ty = function.function_type.outputs.data[int(result)]
            nbytes = float(math.prod(shape_of(ty)) * dtype_of(ty).itemsize)
        link = cluster.logical_mesh((2,), (meshes[src].devices[0], meshes[dst].devices[0]))  # type: ignore[index]
        seconds = link.alpha[0] + link.beta[0] * nbytes  # type: ignore[index]
        if dst > src:
            forward[dst - 1] += seconds
        else:
            backward[dst] += seconds
    return SimPlan(
        tuple(stages),
        int(plan.num_micro_batches.value.data),
        plan.schedule.data,
        tuple(forward),
        tuple(backward),
        virtual_stages=num // len(mesh_stages),
        in_flight_caps=plan.in_flight_caps(),
        phase_times=plan.stage_phase_times(),
        solo_speedup=cluster.profile.solo_speedup if cluster.profile is not None else 1.0,
    )


class SimulateBackend:
    """Backend ``simulate``: estimates instead of executing (see the module docstring)."""

    name = "simulate"

    def simulate(self, plan: SimPlan, *, check_memory: bool = True) -> SimResult:
        return simulate(plan, check_memory=check_memory)

    def compile(self, module: ModuleOp, cluster: Cluster | None = None) -> SimResult:
        """Estimate an outlined module on ``cluster`` (default: its ``mesh.cluster``)."""
        cluster = cluster or Cluster.of_module(module)
        if cluster is None:
            raise AlpaError(
                "simulate: the module has no mesh.cluster; pass a cluster "
                "(alpa_ir.hardware.clusters.get_cluster)"
            )
        return simulate(plan_from_module(module, cluster))


__all__ = [
    "GiB",
    "SimPlan",
    "SimResult",
    "SimStage",
    "SimTask",
    "SimTransfer",
    "SimulateBackend",
    "eq2_latency",
    "plan_from_module",
    "simulate",
]
