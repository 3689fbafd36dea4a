"""Alpa's ``get_last_dp_result()``: the stages the last automatic stage
construction of this session chose.

Alpa keeps them in module globals of ``stage_construction``, written when its
DP (``AutoStageOption``) slices a pipeline. Here they belong to the Ray session
that ``alpa_ir.init(cluster="ray")`` started or joined: when a step compiled
by ``parallelize`` had its stages chosen by ``construct-stages``, they are kept
in that session's key-value store (:func:`~alpa_ir.runtime.ray_cluster.session_put`,
as the global meshes of :mod:`alpa_ir.api.session_meshes`), so they end with
``shutdown()`` and nothing is held in this process. Stages given by hand
(``ManualStageOption``, ``UniformStageOption``) leave the last result as it
was, as in Alpa.

Without Ray there is no session to keep them: :func:`get_last_dp_result`
then returns Alpa's value before any automatic stage construction (five
Nones) and warns in one line.
"""

from __future__ import annotations

import json
import math
import sys
import warnings
from typing import Any

from xdsl.dialects.builtin import ModuleOp

from alpa_ir.dialects.mesh import LogicalMeshOp
from alpa_ir.dialects.pipeline import plan_stages
from alpa_ir.hardware.clusters import Cluster
from alpa_ir.hardware.device_mesh import LogicalDeviceMesh
from alpa_ir.ir.module_utils import symbol_op

DP_RESULT = "last_dp_result"
"""The session key of the last automatic stage construction's result."""

NO_RESULT: tuple[None, None, None, None, None] = (None, None, None, None, None)
"""Alpa's value before any automatic stage construction."""


def _ray_up() -> bool:
    ray = sys.modules.get("ray")
    return ray is not None and bool(ray.is_initialized())


def dp_result_of(planned: Any) -> dict[str, Any] | None:
    """The DP result of a planned pipeline (an executable or a ``Plan``: its
    ``module`` and ``pass_pipeline``) whose stages ``construct-stages`` chose,
    None for anything else: per stage its forward layer ids, its physical
    submesh (hosts, devices per host of the cluster it was planned on), its
    logical mesh shape and its auto-sharding option changes (none: every stage
    is planned with the method's ``AutoShardingOption``)."""
    module = getattr(planned, "module", None)
    if not isinstance(module, ModuleOp):
        return None
    if "construct-stages" not in str(getattr(planned, "pass_pipeline", "")):
        return None
    cluster = Cluster.of_module(module)
    per_host = cluster.devices_per_node if cluster is not None else 0
    layer_ids, physical, logical = [], [], []
    for stage in plan_stages(module):
        first, last = (int(x) for x in stage.layers.get_values())
        mesh = symbol_op(module, stage.mesh.root_reference.data, LogicalMeshOp)
        assert isinstance(mesh, LogicalMeshOp)
        shape = [int(s) for s in LogicalDeviceMesh.from_op(mesh).shape]
        size = math.prod(shape)
        layer_ids.append(list(range(first, last + 1)))
        if per_host and size > per_host and size % per_host == 0:
            physical.append([size // per_host, per_host])
        else:
            physical.append([1, size])
        logical.append(shape)
    if not layer_ids:
        return None
    return {
        "forward_stage_layer_ids": layer_ids,
        "submesh_shapes": physical,
        "logical_mesh_shapes": logical,
        "autosharding_option_dicts": [{} for _ in layer_ids],
    }


def record_dp_result(executable: Any) -> None:
    """Keep ``executable``'s DP result (:func:`dp_result_of`) as this Ray
    session's last one; nothing when its stages were not chosen automatically
    or when Ray is not up."""
    result = dp_result_of(executable)
    if result is None or not _ray_up():
        return
    from alpa_ir.runtime.ray_cluster import session_put

    session_put(DP_RESULT, json.dumps(result))


def get_last_dp_result() -> tuple[Any, Any, Any, Any, Any]:
    """Alpa's ``get_last_dp_result()`` (module docstring): ``(compute cost
    file, forward_stage_layer_ids, submesh_shapes, logical_mesh_shapes,
    autosharding_option_dicts)`` of the last automatic stage construction of
    this Ray session, each a list with one entry per stage (shapes as tuples);
    the compute cost file is None (no cost table is written to a file). Before
    any automatic stage construction, and without Ray (with a warning), five
    Nones."""
    if not _ray_up():
        warnings.warn(
            "get_last_dp_result: the result is kept by the Ray session; without Ray "
            "(alpa_ir.init(cluster='ray')) it is five Nones",
            UserWarning,
            stacklevel=2,
        )
        return NO_RESULT
    from alpa_ir.runtime.ray_cluster import session_get

    text = session_get(DP_RESULT)
    if text is None:
        return NO_RESULT
    record = json.loads(text)
    return (
        None,
        record["forward_stage_layer_ids"],
        [tuple(s) for s in record["submesh_shapes"]],
        [tuple(s) for s in record["logical_mesh_shapes"]],
        record["autosharding_option_dicts"],
    )


__all__ = ["DP_RESULT", "NO_RESULT", "dp_result_of", "get_last_dp_result", "record_dp_result"]
