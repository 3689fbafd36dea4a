"""A model of repeated blocks costed from a shortened trace: the expanded
``layer-sum`` table equals the table of the whole model's trace, entry for
entry, and the expansion is refused where the short model shows no repetition."""

from __future__ import annotations

import numpy as np
import pytest

from alpa_ir.costs.analytical_stage_cost import AnalyticalStageCostModel
from alpa_ir.costs.stage_cost import StageCostOptions
from alpa_ir.costs.stage_table import StageCostTable, cost_table
from alpa_ir.ir.module_utils import main_function
from alpa_ir.pipeline.layer_phases import layer_phase_flops
from alpa_ir.pipeline.layer_ranges import LayerRanges
from alpa_ir.pipeline.repeated_layers import SHORT_BLOCKS, RepeatedLayers, short_blocks
from alpa_ir.pipeline.stage_construction import plan_stages
from alpa_ir.tools.bench_suite import bench_cluster, trace

BLOCKS = 9


@pytest.fixture(scope="module")
def traced() -> tuple[LayerRanges, LayerRanges]:
    """gpt-tiny with 9 blocks traced whole and with SHORT_BLOCKS blocks."""
    whole = LayerRanges(main_function(trace("gpt-tiny", 2, BLOCKS + 1, None, BLOCKS)))
    short = LayerRanges(main_function(trace("gpt-tiny", 2, SHORT_BLOCKS + 1, None, SHORT_BLOCKS)))
    return whole, short


def _table(ranges: LayerRanges, model: AnalyticalStageCostModel) -> StageCostTable:
    cluster = bench_cluster("dgx-a100", 4)
    return cost_table(
        ranges,
        cluster,
        model,
        cost_mode="layer-sum",
        progress=False,
        phase_flops=layer_phase_flops(ranges),
    )


def test_the_expanded_table_is_the_whole_models(
    traced: tuple[LayerRanges, LayerRanges],
) -> None:
    whole, short = traced
    repeated = RepeatedLayers.of(short, whole.num_layers)
    assert repeated is not None
    assert np.array_equal(repeated.edges, whole.edge_bytes())
    # one model: the layers the two traces share are planned once
    model = AnalyticalStageCostModel(StageCostOptions(num_micro_batches=2, time_limit=10.0))
    expected = _table(whole, model)
    expanded = repeated.expand_table(_table(short, model))
    assert expanded is not None and expanded.num_layers == whole.num_layers == BLOCKS + 1
    assert expanded.costs == expected.costs
    assert expanded.internal is not None and expected.internal is not None
    for got, want in zip(expanded.internal, expected.internal, strict=True):
        assert np.array_equal(got, want)
    assert np.array_equal(expanded.phase_flops, expected.phase_flops)  # type: ignore[arg-type]
    # fewer pairs costed for the same table (three kinds of layer either way)
    assert expanded.pairs_costed < expected.pairs_costed
    # and so the same stages (the stage DP on either table)
    found = plan_stages(expanded, 4, "1f1b")
    assert found.stages == plan_stages(expected, 4, "1f1b").stages
    assert found.latency == plan_stages(expected, 4, "1f1b").latency


class _Layers:
    """Layer-to-layer bytes of a step without its ops: one kind of interior layer."""

    def __init__(self, edges: np.ndarray) -> None:
        self.num_layers = edges.shape[0]
        self._edges = edges

    def fingerprint(self, first: int, last: int) -> str:
        return "block"

    def edge_bytes(self) -> np.ndarray:
        return self._edges


def _chain(num: int) -> np.ndarray:
    edges = np.zeros((num, num))
    for k in range(1, num):
        edges[k, k - 1] = edges[k - 1, k] = 8.0
    return edges


def test_a_chain_of_layers_expands_and_dense_skips_are_refused() -> None:
    num = SHORT_BLOCKS + 1
    for not_deeper in (num, num - 1):
        assert RepeatedLayers.of(_Layers(_chain(num)), not_deeper) is None  # type: ignore[arg-type]
    assert RepeatedLayers.of(_Layers(_chain(num - 1)), 20) is None  # type: ignore[arg-type]
    repeated = RepeatedLayers.of(_Layers(_chain(num)), 20)  # type: ignore[arg-type]
    assert repeated is not None and np.array_equal(repeated.edges, _chain(20))
    # every layer reads every earlier one (a DenseNet): a deeper model's layers
    # receive more than any short layer does, so the table cannot be expanded
    dense = np.tril(np.full((num, num), 8.0), -1)
    assert RepeatedLayers.of(_Layers(dense), 20) is None  # type: ignore[arg-type]
    # bytes that differ within one class (the 2nd and 4th layers' inputs)
    uneven = _chain(num)
    uneven[4, 3] = 16.0
    assert RepeatedLayers.of(_Layers(uneven), 20) is None  # type: ignore[arg-type]


def test_short_blocks_only_for_a_layer_per_block() -> None:
    from alpa_ir.models.registry import get_config

    config = get_config("megatron-1t")
    assert short_blocks(config, config.num_layers + 1) == SHORT_BLOCKS
    assert short_blocks(config, 8) is None  # other layers than one per block
    assert short_blocks(get_config("gpt-tiny"), 3) is None  # too few blocks
    assert short_blocks(get_config("wresnet-tiny"), 3) is None  # no repeated block count


def test_llama_layers_stand_for_the_whole_model_and_moe_is_traced_whole() -> None:
    """Llama's blocks (RoPE, grouped-query attention) repeat: the short trace's
    layers have the whole model's structure, bytes and FLOPs by role; MoE's
    alternating blocks do not, and the expansion is refused."""
    whole = LayerRanges(main_function(trace("llama-tiny", 2, BLOCKS + 1, None, BLOCKS)))
    short = LayerRanges(main_function(trace("llama-tiny", 2, SHORT_BLOCKS + 1, None, SHORT_BLOCKS)))
    repeated = RepeatedLayers.of(short, whole.num_layers)
    assert repeated is not None
    assert np.array_equal(repeated.edges, whole.edge_bytes())
    assert np.array_equal(repeated.expand_rows(layer_phase_flops(short)), layer_phase_flops(whole))
    for k in range(whole.num_layers):
        source = repeated.source(k)
        assert whole.fingerprint(k, k) == short.fingerprint(source, source)
    moe = LayerRanges(main_function(trace("moe-tiny", 2, SHORT_BLOCKS + 1, None, SHORT_BLOCKS)))
    assert RepeatedLayers.of(moe, BLOCKS + 1) is None
