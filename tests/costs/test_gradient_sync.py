"""The gradients' reductions are priced once per step, not per micro-batch
(``StageCost.gradient_sync_time``): under gradient accumulation the runtime
sums the gradients over the micro-batches and reduces them over the mesh once."""

from __future__ import annotations

from dataclasses import replace

import pytest
from stage_fixtures import _deep_module

from alpa_ir.costs.analytical_stage_cost import AnalyticalStageCostModel
from alpa_ir.costs.function_plan import accumulation_of
from alpa_ir.costs.stage_cost import StageCostOptions
from alpa_ir.dialects.attrs import ACCUMULATED_ATTR
from alpa_ir.hardware.clusters import get_cluster
from alpa_ir.ir.module_utils import main_function
from alpa_ir.pipeline.layer_ranges import LayerRanges


def _layer() -> tuple[object, tuple[int, ...]]:
    ranges = LayerRanges(main_function(_deep_module()))
    lr = ranges.function(0, 0)  # the first layer reads the batch
    return lr.function, lr.param_args


def test_a_layer_marks_its_accumulated_results() -> None:
    """The weight gradient goes to apply-grad only: accumulated; the
    activation and the input gradient go to other layers: per micro-batch."""
    function, _ = _layer()
    attr = function.attributes[ACCUMULATED_ATTR]  # type: ignore[attr-defined]
    marked = [int(k) for k in attr.get_values()]  # type: ignore[attr-defined]
    results = function.function_type.outputs.data  # type: ignore[attr-defined]
    assert 0 < len(marked) < len(results)
    part = accumulation_of(function)  # type: ignore[arg-type]
    assert part is not None and len(part.accumulated) == len(marked)


def test_data_parallel_gradients_are_reduced_once_per_step() -> None:
    """On a data-parallel view across nodes, the weight gradient's all-reduce
    is gradient sync: out of the per-micro-batch communication, one B-th of it
    in the latency."""
    function, params = _layer()
    cluster = get_cluster("alpa-testbed", num_nodes=2)
    mesh = cluster.logical_mesh((2, 1), (0, 8))  # one GPU on each node
    base = StageCostOptions(force_batch_dim_to_mesh_dim=0)
    one = AnalyticalStageCostModel(base).stage_cost(function, mesh, cluster, params)  # type: ignore[arg-type]
    many = AnalyticalStageCostModel(replace(base, num_micro_batches=8)).stage_cost(
        function,  # type: ignore[arg-type]
        mesh,
        cluster,
        params,
    )
    assert many.gradient_sync_time > 0
    assert many.gradient_sync_time == pytest.approx(one.gradient_sync_time)
    per_micro_batch = many.compute_time + many.memory_time + many.communication_time
    assert many.latency == pytest.approx(per_micro_batch + many.gradient_sync_time / 8)
    assert many.latency < one.latency


def test_bad_micro_batch_counts_are_refused() -> None:
    from alpa_ir.errors import AlpaError

    with pytest.raises(AlpaError, match="num_micro_batches must be >= 1"):
        StageCostOptions(num_micro_batches=0)


def test_the_profile_s_overlap_hides_part_of_the_sync() -> None:
    from alpa_ir.hardware.device_profile import Overlap

    function, params = _layer()
    cluster = get_cluster("alpa-testbed", num_nodes=2)
    assert cluster.profile is not None
    hidden = cluster.with_profile(replace(cluster.profile, overlap=Overlap(gradient_sync=0.75)))
    mesh = cluster.logical_mesh((2, 1), (0, 8))
    options = StageCostOptions(force_batch_dim_to_mesh_dim=0, num_micro_batches=2)
    plain = AnalyticalStageCostModel(options).stage_cost(function, mesh, cluster, params)  # type: ignore[arg-type]
    overlapped = AnalyticalStageCostModel(options).stage_cost(
        function,  # type: ignore[arg-type]
        hidden.logical_mesh((2, 1), (0, 8)),
        hidden,
        params,
    )
    assert overlapped.gradient_sync_time == pytest.approx(plain.gradient_sync_time)
    assert plain.latency - overlapped.latency == pytest.approx(
        0.75 * plain.gradient_sync_time / 2, rel=1e-6
    )
