"""Tests of alpa_ir.algorithms.cluster_operators (Eq. 6) against brute-force enumeration."""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from alpa_ir.algorithms import ClusteringResult, cluster_operators
from alpa_ir.algorithms.operator_clustering import clustering_objective
from alpa_ir.errors import AlpaError, PlanError

Tensor = tuple[int, int | Sequence[int], float]


def consumers_of(tensor: Tensor) -> list[int]:
    target = tensor[1]
    return [target] if isinstance(target, int) else list(target)


def bytes_received(tensors: Sequence[Tensor], first: int, last: int) -> float:
    """C(first, last) by definition: tensors made before the layer, used inside it, once each."""
    return float(
        sum(
            size
            for producer, _, size in tensors
            if producer < first
            and any(first <= u <= last for u in consumers_of((producer, _, size)))
        )
    )


def brute_force(
    flops: Sequence[float],
    tensors: Sequence[Tensor],
    num_layers: int,
    cap: float,
    allowed: Sequence[bool] | None = None,
) -> tuple[float, float] | None:
    """Lexicographic min of (max bytes received, Σ layer FLOPs²) over all clusterings."""
    num_ops = len(flops)
    starts = [i for i in range(1, num_ops) if allowed is None or allowed[i]]
    best = None
    for cuts in itertools.combinations(starts, num_layers - 1):
        bounds = [0, *cuts, num_ops]
        layers = [(bounds[j], bounds[j + 1] - 1) for j in range(num_layers)]
        layer_flops = [float(sum(flops[a : b + 1])) for a, b in layers]
        if any(f > cap for f in layer_flops):
            continue
        key = (
            max(bytes_received(tensors, a, b) for a, b in layers),
            sum(f * f for f in layer_flops),
        )
        best = key if best is None or key < best else best
    return best


def check_result(
    result: ClusteringResult,
    flops: Sequence[float],
    tensors: Sequence[Tensor],
    num_layers: int,
    expected: tuple[float, float],
    allowed: Sequence[bool] | None = None,
) -> None:
    layers = list(result.layers)
    assert len(layers) == num_layers
    assert layers[0][0] == 0 and layers[-1][1] == len(flops) - 1
    for (_, last), (first, _) in itertools.pairwise(layers):
        assert first == last + 1
    for first, last in layers:
        assert first <= last
        assert allowed is None or first == 0 or allowed[first]
        assert sum(flops[first : last + 1]) <= result.flop_bound
    assert result.layer_flops == tuple(float(sum(flops[a : b + 1])) for a, b in layers)
    assert result.bytes_received == tuple(bytes_received(tensors, a, b) for a, b in layers)
    assert result.objective == max(result.bytes_received)
    assert (result.objective, sum(f * f for f in result.layer_flops)) == expected


@st.composite
def instances(draw: st.DrawFn):
    """Small integer instances: lots of ties in bytes and in FLOPs."""
    num_ops = draw(st.integers(1, 8))
    flops = draw(st.lists(st.integers(0, 6).map(float), min_size=num_ops, max_size=num_ops))
    tensors: list[Tensor] = []
    if num_ops >= 2:
        for _ in range(draw(st.integers(0, 10))):
            producer = draw(st.integers(0, num_ops - 2))
            later = list(range(producer + 1, num_ops))
            users = draw(st.lists(st.sampled_from(later), min_size=1, max_size=3, unique=True))
            target: int | list[int] = users[0] if len(users) == 1 else users
            tensors.append((producer, target, float(draw(st.integers(0, 8)))))
    num_layers = draw(st.integers(1, num_ops))
    delta = draw(st.sampled_from([0.0, 0.25, 0.5, 1.0, 4.0]))
    allowed = None
    if draw(st.booleans()):
        allowed = [True, *draw(st.lists(st.booleans(), min_size=num_ops - 1, max_size=num_ops - 1))]
    return flops, tensors, num_layers, delta, allowed


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(instances())
def test_equals_brute_force(instance) -> None:
    flops, tensors, num_layers, delta, allowed = instance
    mask = None if allowed is None else np.array(allowed)
    if allowed is not None and num_layers > sum(allowed):
        with pytest.raises(AlpaError, match="allowed_boundaries"):
            cluster_operators(flops, tensors, num_layers, delta, allowed_boundaries=mask)
        return
    cap = (1 + delta) * sum(flops) / num_layers
    expected = brute_force(flops, tensors, num_layers, cap, allowed)
    if expected is None:
        with pytest.raises(PlanError, match="smallest δ"):
            cluster_operators(flops, tensors, num_layers, delta, allowed_boundaries=mask)
        relaxed = cluster_operators(
            flops, tensors, num_layers, delta, allowed_boundaries=mask, relax_delta=True
        )
        assert relaxed.delta_relaxed and relaxed.delta > delta
        # The relaxed bound is the least that admits a clustering, and the result is optimal there.
        assert (
            brute_force(flops, tensors, num_layers, relaxed.flop_bound * (1 - 1e-9), allowed)
            is None
        )
        expected = brute_force(flops, tensors, num_layers, relaxed.flop_bound, allowed)
        assert expected is not None
        check_result(relaxed, flops, tensors, num_layers, expected, allowed)
        return
    result = cluster_operators(flops, tensors, num_layers, delta, allowed_boundaries=mask)
    assert not result.delta_relaxed and result.delta == delta
    check_result(result, flops, tensors, num_layers, expected, allowed)
    assert result.objective == clustering_objective(
        flops, tensors, num_layers, delta, allowed_boundaries=mask
    )


def test_result_unpacks_as_layers_and_objective() -> None:
    result = cluster_operators([1.0, 1.0, 1.0, 1.0], [(0, 1, 5.0), (1, 2, 1.0), (2, 3, 5.0)], 2)
    layers, objective = result
    assert (layers, objective) == (result.layers, result.objective)
    assert layers == ((0, 1), (2, 3))  # cut the 1-byte edge
    assert objective == 1.0


def test_variance_breaks_ties() -> None:
    """No communication at all: every clustering ties on bytes; the balanced one wins."""
    result = cluster_operators([1.0] * 6, [], 2, delta=1.0)
    assert result.layers == ((0, 2), (3, 5))
    assert result.flops_variance == 0.0
    result = cluster_operators([4.0, 1.0, 1.0, 1.0, 1.0], [], 2, delta=1.0)
    assert result.layers == ((0, 0), (1, 4))


def test_variance_tie_break_is_global_not_per_prefix() -> None:
    """A prefix with more bytes but lower Σ FLOPs² must win when a later layer sets the max.

    3 layers, cap 6.5 FLOPs. Ops 0..2 as two layers: [0] [1 2] receives 3 bytes
    (FLOPs 1, 6), [0 1] [2] receives 5 bytes (FLOPs 4, 3). The last layer [3 4]
    receives 5 bytes either way, so both tie on bytes and [0 1] [2] [3 4] has the
    lower variance; a DP that keeps only the lexicographically best prefix
    (3 bytes) would return [0] [1 2] [3 4].
    """
    flops = [1.0, 3.0, 3.0, 4.0, 2.0]
    tensors: list[Tensor] = [(0, 1, 3.0), (1, 2, 5.0), (2, 3, 5.0), (3, 4, 5.0)]
    result = cluster_operators(flops, tensors, 3, delta=0.5)
    expected = brute_force(flops, tensors, 3, 1.5 * 13 / 3)
    assert expected == (5.0, 16.0 + 9.0 + 36.0)
    check_result(result, flops, tensors, 3, expected)
    assert result.layers == ((0, 1), (2, 2), (3, 4))


def test_tensor_with_many_consumers_counts_once_per_layer() -> None:
    flops = [1.0, 1.0, 1.0, 1.0]
    shared = cluster_operators(flops, [(0, [1, 2, 3], 4.0)], 2, delta=1.0)
    split = cluster_operators(flops, [(0, 1, 4.0), (0, 2, 4.0), (0, 3, 4.0)], 2, delta=1.0)
    assert shared.objective == 4.0  # any second layer receives the tensor once
    assert split.objective == 4.0  # the 1-op layer (3, 3) receives one copy...
    assert split.layers == ((0, 2), (3, 3))  # ...which needs the unbalanced split


def test_one_operator_above_the_bound_raises_or_relaxes() -> None:
    flops = [10.0, 1.0, 1.0, 1.0]
    with pytest.raises(
        PlanError, match=r"heaviest operator 0 has 10.*smallest δ that works is 2\.07"
    ):
        cluster_operators(flops, [], 4, delta=0.5)
    relaxed = cluster_operators(flops, [], 4, delta=0.5, relax_delta=True)
    assert relaxed.delta_relaxed
    assert relaxed.flop_bound == 10.0
    assert math.isclose(relaxed.delta, 10.0 * 4 / 13 - 1)
    assert relaxed.layers == ((0, 0), (1, 1), (2, 2), (3, 3))


def test_allowed_boundaries_restrict_layer_starts() -> None:
    flops = [1.0] * 6
    edges = [(0, 1, 1.0), (1, 2, 1.0), (2, 3, 9.0), (3, 4, 1.0), (4, 5, 1.0)]
    free = cluster_operators(flops, edges, 2, delta=1.0)
    assert free.objective == 1.0
    assert free.layers in {((0, 1), (2, 5)), ((0, 3), (4, 5))}
    mask = np.array([True, False, False, True, False, False])
    forced = cluster_operators(flops, edges, 2, delta=1.0, allowed_boundaries=mask)
    assert forced.layers == ((0, 2), (3, 5))
    assert forced.objective == 9.0


def test_operator_count_in_the_thousands() -> None:
    """A transformer-like chain: heavy matmuls, cheap element-wise ops, skip connections."""
    rng = np.random.default_rng(0)
    num_ops, num_layers = 3000, 24
    flops = np.where(rng.random(num_ops) < 0.2, rng.uniform(50, 100, num_ops), 0.1)
    edges: list[Tensor] = [(k, k + 1, float(rng.integers(1, 5))) for k in range(num_ops - 1)]
    edges += [(k, k + 7, 2.0) for k in range(0, num_ops - 7, 5)]
    result = cluster_operators(flops, edges, num_layers, delta=0.5)
    assert len(result.layers) == num_layers
    assert max(result.layer_flops) <= result.flop_bound
    # Only the chain edge (and skip edges) cross a cut: at least one chain edge per layer.
    assert 1.0 <= result.objective <= 4.0 + 2.0 * 2


@pytest.mark.parametrize(
    ("args", "kwargs", "message"),
    [
        (([1.0, 1.0], [], 3), {}, "only 2 operators"),
        (([1.0, 1.0], [], 0), {}, "num_layers"),
        (([1.0, 1.0], [], 1.0), {}, "num_layers"),
        (([], [], 1), {}, "non-empty"),
        (([1.0, -1.0], [], 1), {}, "flops"),
        (([1.0, math.nan], [], 1), {}, "flops"),
        (([1.0, 1.0], [(1, 0, 1.0)], 1), {}, "topological"),
        (([1.0, 1.0], [(0, 2, 1.0)], 1), {}, "topological"),
        (([1.0, 1.0], [(0, [], 1.0)], 1), {}, "topological"),
        (([1.0, 1.0], [(-1, 1, 1.0)], 1), {}, "source"),
        (([1.0, 1.0], [(0, 1, -1.0)], 1), {}, "bytes"),
        (([1.0, 1.0], [(0, 1, "big")], 1), {}, "bytes"),
        (([1.0, 1.0], [(0, "1", 2.0)], 1), {}, "topological"),
        (([1.0, 1.0], [(0, 1)], 1), {}, "edge 0"),
        (([1.0, 1.0], [], 1, -0.5), {}, "delta"),
        (([1.0, 1.0], [], 1, "0.5"), {}, "delta"),
        ((["x", 1.0], [], 1), {}, "flops"),
        (([1.0, 1.0], [], 1), {"allowed_boundaries": np.array([1, 0])}, "bool"),
        (([1.0, 1.0], [], 1), {"allowed_boundaries": np.array([True])}, "shape"),
        (([1.0, 1.0], [], 2), {"allowed_boundaries": np.array([True, False])}, "allows only 1"),
    ],
)
def test_bad_inputs_raise_alpa_error(args: tuple, kwargs: dict, message: str) -> None:
    with pytest.raises(AlpaError, match=message) as info:
        cluster_operators(*args, **kwargs)
    assert "\n" not in str(info.value)
    assert not isinstance(info.value, PlanError)


def test_fit_delta_keeps_a_heavy_head_in_one_layer() -> None:
    """Three cheap layers and a head of many layers' FLOPs: within δ = 0.5 the
    clustering must cut the head and a layer receives its wide intermediate;
    ``fit-delta`` raises δ until every layer receives only the narrow chain."""
    import jax
    import jax.numpy as jnp
    from xdsl.context import Context

    from alpa_ir.frontend.jaxpr_import import import_jax
    from alpa_ir.ir.module_utils import main_function
    from alpa_ir.passes.cluster_operators import ClusterOperators

    def loss(w: jax.Array, head: jax.Array, x: jax.Array) -> jax.Array:
        for k in range(3):
            x = jnp.tanh(x @ w[k])
        wide = jnp.tanh(x @ head)  # [8, 1024]: the head's FLOPs and bytes
        return jnp.sum(jnp.tanh(wide @ head.T))

    args = (jnp.zeros((3, 16, 16)), jnp.zeros((16, 1024)), jnp.zeros((8, 16)))

    def received(fit: bool) -> float:
        module = import_jax(loss, *args)
        ClusterOperators(layers=4, delta=0.5, fit_delta=fit).apply(Context(), module)
        layer_bytes = main_function(module).attributes["pipeline.layer_bytes"]
        return max(float(b.value.data) for b in layer_bytes.data)  # type: ignore[attr-defined]

    assert received(False) >= 8 * 1024 * 4  # a cut through the head
    assert received(True) <= 8 * 16 * 4 * 2  # only the chain (and the input) crosses


def test_fit_delta_takes_the_least_delta_within_a_tolerance_of_the_widest(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A clustering whose largest layer input is 0.5 % above the widest δ's is
    as good as it (GPT-2's twelve blocks against one layer holding them all)."""
    import alpa_ir.passes.cluster_operators as pass_module
    from alpa_ir.algorithms.operator_clustering import ClusteringResult

    received = {0.5: 100.0, 1.0: 1005.0 / 100, 2.0: 10.0, 4.0: 10.0, 8.0: 10.0}

    def clustering(delta: float) -> ClusteringResult:
        return ClusteringResult(((0, 0),), received[delta], (1.0,), (0.0,), delta, False, 1.0)

    solved: list[float] = []  # the deltas whose layers were computed

    def fake(flops: object, edges: object, layers: int, delta: float, **_: object) -> object:
        solved.append(delta)
        return clustering(delta)

    def objective(flops: object, edges: object, layers: int, delta: float, **_: object) -> float:
        return received[delta]

    monkeypatch.setattr(pass_module, "cluster_operators", fake)
    monkeypatch.setattr(pass_module, "clustering_objective", objective)
    # one operator of 3 layers' FLOPs: fit-delta may try up to FIT_DELTA_MAX
    assert pass_module._fitted(clustering(0.5), [1.0], [], 3).delta == 1.0
    assert solved == [1.0]  # the widest δ's bytes alone, not its layers
    monkeypatch.setattr(pass_module, "FIT_DELTA_TOLERANCE", 0.0)
    assert pass_module._fitted(clustering(0.5), [1.0], [], 3).delta == 2.0  # exact equality
    received.update({2.0: 11.0, 4.0: 10.5})  # only the widest reaches its own bytes
    solved.clear()
    assert pass_module._fitted(clustering(0.5), [1.0], [], 3).delta == 8.0
    assert solved == [1.0, 2.0, 4.0, 8.0]


def test_fit_delta_keeps_the_balanced_layers_for_a_few_percent_fewer_bytes(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """MoE 380M at 32 micro-batches in 9 layers: δ = 8 receives 2 % fewer bytes
    than δ = 0.5 (49.3 against 50.3 MB) by putting every FLOP in one layer;
    the balanced layers stay."""
    import alpa_ir.passes.cluster_operators as pass_module
    from alpa_ir.algorithms.operator_clustering import ClusteringResult

    received = {0.5: 50.3, 1.0: 50.0, 2.0: 49.8, 4.0: 49.5, 8.0: 49.3}

    def clustering(delta: float) -> ClusteringResult:
        return ClusteringResult(((0, 0),), received[delta], (1.0,), (0.0,), delta, False, 1.0)

    def objective(flops: object, edges: object, layers: int, delta: float, **_: object) -> float:
        return received[delta]

    monkeypatch.setattr(pass_module, "clustering_objective", objective)
    assert pass_module._fitted(clustering(0.5), [1.0], [], 1).delta == 0.5


def test_fit_delta_raises_delta_only_as_far_as_a_few_heaviest_operators() -> None:
    """A step of many light operators (Wide-ResNet: the heaviest 0.59 of a
    layer) keeps δ near 0.5; a heavy head (GPT-3 350M's logits, 3.2 layers)
    may take a layer of several."""
    from alpa_ir.passes.cluster_operators import FIT_HEAVY_OPS, fit_delta_ceiling

    light = [0.59] + [1.0 / 3] * 48  # 17 layers of about 1.0 each
    assert fit_delta_ceiling(light, 17) < 1.0
    heavy = [3.2] + [1.0 / 3] * 72  # 25 layers: a head of 3.2 layers
    assert fit_delta_ceiling(heavy, 25) == pytest.approx(FIT_HEAVY_OPS * 3.2 * 25 / 27.2 - 1)
    assert fit_delta_ceiling(heavy, 25) > 7


def test_fit_delta_stops_at_its_ceiling(monkeypatch: pytest.MonkeyPatch) -> None:
    import alpa_ir.passes.cluster_operators as pass_module
    from alpa_ir.algorithms.operator_clustering import ClusteringResult

    tried: list[float] = []

    def clustering(delta: float) -> ClusteringResult:
        return ClusteringResult(((0, 0),), 100.0 / (1 + delta), (1.0,), (0.0,), delta, False, 1.0)

    def objective(flops: object, edges: object, layers: int, delta: float, **_: object) -> float:
        tried.append(delta)
        return 100.0 / (1 + delta)

    def fake(flops: object, edges: object, layers: int, delta: float, **_: object) -> object:
        return clustering(delta)

    monkeypatch.setattr(pass_module, "clustering_objective", objective)
    monkeypatch.setattr(pass_module, "cluster_operators", fake)
    flops = [1.0] * 10  # heaviest operator: 0.4 of a layer in 4 layers: ceiling 0.5
    assert pass_module._fitted(clustering(0.5), flops, [], 4).delta == 0.5
    assert tried == []
