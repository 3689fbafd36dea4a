"""Collective prices against the hardware model (issue #25): the ``calibrated`` cost model
agrees with the P² simulator on every GPU preset's meshes, and ``alpha-beta`` stays Alpa's."""

from __future__ import annotations

import numpy as np
import pytest
from xdsl.dialects.builtin import FlatSymbolRefAttr, ModuleOp
from zoo_fixtures import tiny_step

from alpa_ir import import_jax
from alpa_ir.autosharding.cost_model import AlphaBetaCostModel, collective_bytes_on_wire
from alpa_ir.errors import AlpaError
from alpa_ir.hardware.clusters import get_cluster
from alpa_ir.hardware.device_mesh import LogicalDeviceMesh, function_mesh
from alpa_ir.ir.module_utils import main_function
from alpa_ir.p2.calibrated import CalibratedCostModel, system_of_cluster
from alpa_ir.p2.ir_collectives import mesh_collectives
from alpa_ir.p2.semantics import Collective
from alpa_ir.p2.simulator import Simulator
from alpa_ir.p2.system import custom_system, gcp_a100, gcp_v100
from alpa_ir.p2.system_clusters import p2_cluster_presets
from alpa_ir.passmanager.pass_manager import PassManager
from alpa_ir.plugins.registry import default_registry
from alpa_ir.tools.bench_cost_model_prices import PRESETS, axis_sets, in_microseconds, main, meshes

MB = 2**20
KINDS = ("all_gather", "reduce_scatter", "all_reduce", "all_to_all")
PLAIN = {
    "all_gather": Collective.ALL_GATHER,
    "reduce_scatter": Collective.REDUCE_SCATTER,
    "all_reduce": Collective.ALL_REDUCE,
}


def _groups(mesh: LogicalDeviceMesh, axes: tuple[int, ...]) -> np.ndarray:
    ids = np.array(mesh.devices).reshape(mesh.shape)
    rest = [a for a in range(len(mesh.shape)) if a not in axes]
    return ids.transpose(rest + list(axes)).reshape(-1, mesh.axes_size(axes))


def _simulated_us(sim: Simulator, kind: str, mesh: LogicalDeviceMesh, nbytes: float, axes) -> float:
    """The simulator's time (µs) for ``nbytes`` as the cost-model protocol counts them."""
    groups = _groups(mesh, axes)
    if kind == "all_to_all":
        return sim.all_to_all_time(groups, nbytes) * 1e6
    if kind == "all_gather":
        nbytes /= groups.shape[1]  # the simulator takes the pieces
    return sim.program_time([(PLAIN[kind], groups)], nbytes) * 1e6


@pytest.mark.parametrize("preset", PRESETS)
def test_calibrated_prices_agree_with_the_simulator_on_every_preset_axis(preset: str) -> None:
    """Every kind over every axis set of every view of the one-node and whole-cluster
    submeshes: within 10 % at 256 MB (bandwidth) and at 1 MB (latency-dominated: the
    hop latencies are in α, so these agree too)."""
    cluster = get_cluster(preset, presets=default_registry().cluster_presets)
    model = CalibratedCostModel.for_cluster(cluster)
    sim = Simulator(system_of_cluster(cluster))
    checked = 0
    for mesh in meshes(preset):
        for axes in axis_sets(mesh.shape):
            for kind in KINDS:
                for nbytes in (MB, 256 * MB):
                    want = _simulated_us(sim, kind, mesh, float(nbytes), axes)
                    got = getattr(model, kind)(mesh, nbytes, axes)
                    assert got == pytest.approx(want, rel=0.1), (mesh.shape, axes, kind, nbytes)
                    checked += 1
    assert checked >= 8 * 19


def test_alpha_beta_is_alpas_formulas_unchanged() -> None:
    """``alpha-beta`` keeps Alpa's prices, tie-breakers and the half all-to-all."""
    mesh = LogicalDeviceMesh((2, 4), alpha=(1.0, 2.0), beta=(1.0, 0.1))
    model = AlphaBetaCostModel()
    assert model.name == "alpha-beta"
    b = 800.0
    assert model.all_gather(mesh, b, (0,)) == pytest.approx(1 + 0.5 * b + 0.1)
    assert model.all_reduce(mesh, b, (0,)) == pytest.approx(1 + 2 * 0.5 * b + 0.01)
    assert model.reduce_scatter(mesh, b, (1,)) == pytest.approx(2 + 0.1 * 0.75 * b + 0.001)
    assert model.all_to_all(mesh, b, (1,)) == pytest.approx(2 + 0.1 * 3 / 16 * b * 2 + 0.001)
    # over both axes: one ring of 8, the slowest axis's α and β
    assert model.all_gather(mesh, b, (0, 1)) == pytest.approx(2 + 7 / 8 * b + 0.1)
    assert model.all_to_all(mesh, b, (0, 1)) == pytest.approx(2 + 7 / 16 * b + 0.001)
    registry = default_registry()
    assert registry.get("cost_models", "alpha-beta")() == model


def test_alpha_beta_all_to_all_is_half_the_wire_on_one_switch() -> None:
    """On one NVSwitch node the α-β all-to-all is (n−1)/(2n)·B·β: half the simulated time
    at bandwidth-dominated sizes; ``calibrated`` prices all (n−1)/n·B."""
    cluster = get_cluster("gcp-a100-16x2", presets=p2_cluster_presets())
    mesh = cluster.logical_mesh((2, 16))
    sim = Simulator(gcp_a100(2))
    alpha_beta = AlphaBetaCostModel().all_to_all(in_microseconds(mesh), 256 * MB, (1,))
    simulated = _simulated_us(sim, "all_to_all", mesh, 256 * MB, (1,))
    assert alpha_beta / simulated == pytest.approx(0.5, rel=0.01)
    calibrated = CalibratedCostModel.for_cluster(cluster)
    assert calibrated.all_to_all(mesh, 256 * MB, (1,)) / simulated == pytest.approx(1.0, rel=1e-3)


def test_calibrated_is_alpha_beta_on_wire_bytes_with_fitted_alpha_and_beta() -> None:
    """A ring of 16 on one 270 GB/s NVSwitch node: α = 15 hops × 3 µs, β = 1 / 270 GB/s per
    byte on the wire, for every kind (all-to-all: one hop)."""
    cluster = get_cluster("gcp-a100-16x2", presets=p2_cluster_presets())
    mesh = cluster.logical_mesh((2, 16))
    model = CalibratedCostModel.for_cluster(cluster)
    for kind in ("all_gather", "reduce_scatter", "all_to_all"):
        alpha, beta = model.alpha_beta(kind, mesh, (1,))
        assert beta == pytest.approx(1 / 270e9, rel=1e-6)
        assert alpha == pytest.approx(3e-6 if kind == "all_to_all" else 15 * 3e-6)
        wire = collective_bytes_on_wire(kind.replace("_", "-"), 64 * MB, 16)
        tie = {"all_gather": 0.1, "reduce_scatter": 0.001, "all_to_all": 0.001}[kind]
        price = getattr(model, kind)(mesh, 64 * MB, (1,))
        assert price == pytest.approx((alpha + beta * wire) * 1e6 + tie)
    alpha, beta = model.alpha_beta("all_reduce", mesh, (1,))
    assert (alpha, beta) == (pytest.approx(30 * 3e-6), pytest.approx(1 / 270e9, rel=1e-6))


def test_gcp_presets_keep_their_p2_systems() -> None:
    """A GCP cluster preset is priced on its own P² system (the V100 NVLink ring and host
    PCIe paths), any other on one switched interconnect per level."""
    assert system_of_cluster(get_cluster("gcp-v100-8x2", presets=p2_cluster_presets())) == gcp_v100(
        2
    )
    assert system_of_cluster(
        get_cluster("gcp-a100", presets=p2_cluster_presets(), num_nodes=3)
    ) == gcp_a100(3)
    dgx = system_of_cluster(get_cluster("dgx-a100"))
    assert dgx.hierarchy == (4, 8)
    assert [link.topology for link in dgx.interconnects] == ["switch", "switch"]
    model = CalibratedCostModel.for_cluster(
        get_cluster("gcp-v100-8x2", presets=p2_cluster_presets())
    )
    mesh = get_cluster("gcp-v100-8x2", presets=p2_cluster_presets()).logical_mesh((4, 4))
    # GPUs 0 and 4 are no NVLink neighbours: host memory over PCIe, far slower than 0-1
    assert model.all_reduce(mesh, 256 * MB, (0,)) > 10 * model.all_reduce(
        get_cluster("gcp-v100-8x2", presets=p2_cluster_presets()).logical_mesh((8, 2)),
        256 * MB,
        (1,),
    )


def test_calibrated_is_registered_and_binds_to_the_module() -> None:
    registry = default_registry()
    unbound = registry.get("cost_models", "calibrated")()
    assert isinstance(unbound, CalibratedCostModel) and unbound.system is None
    with pytest.raises(AlpaError, match="cost model calibrated needs a system"):
        unbound.all_gather(LogicalDeviceMesh((2, 4)), MB, (0,))
    cluster = get_cluster("gcp-v100-8x2", presets=p2_cluster_presets())
    mesh = cluster.logical_mesh((2, 8))
    mesh_op = mesh.to_op("mesh")
    mesh_op.properties["cluster"] = FlatSymbolRefAttr("c")
    module = ModuleOp([cluster.to_op("c"), mesh_op])
    bound = unbound.for_module(module, mesh_op, "")
    assert bound == CalibratedCostModel(gcp_v100(2)) != unbound
    assert hash(bound) == hash(CalibratedCostModel(gcp_v100(2)))
    assert unbound.for_module(module, mesh_op, "gcp-a100-16x2").system == gcp_a100(2)
    bare = LogicalDeviceMesh((2, 4)).to_op("mesh")
    with pytest.raises(AlpaError, match="no system for mesh @mesh"):
        unbound.for_module(ModuleOp([bare]), bare, "")
    with pytest.raises(AlpaError, match="outside system"):
        CalibratedCostModel(custom_system((2, 2))).all_gather(LogicalDeviceMesh((2, 4)), MB, (0,))


def test_auto_sharding_minimizes_the_calibrated_price() -> None:
    """``auto-sharding{cost-model=calibrated}``: the objective is the calibrated price (µs)
    of the collectives the plan inserts (up to the ILP's tie-breaking penalties)."""
    fn, args = tiny_step("mlp-tiny")
    module = import_jax(fn, *args, donate_argnums=(0,), batch_argnums=(1,))
    pipeline = (
        "builtin.module(merge-trivial-ops,"
        "auto-sharding{mesh-shape=2,4 cost-model=calibrated system=custom-2x4})"
    )
    PassManager(default_registry(), pipeline).run(module)
    function = main_function(module)
    mesh = function_mesh(module, function)
    assert mesh is not None
    model = CalibratedCostModel(custom_system((2, 4)))
    names = {v: k for k, v in PLAIN.items()}
    total = 0.0
    for c in mesh_collectives(function, mesh.shape, "test"):
        total += getattr(model, names[c.kind])(mesh, c.nbytes, c.axes)
    objective = function.attributes["sharding.objective"].value.data  # type: ignore[attr-defined]
    assert total > 0
    assert objective == pytest.approx(total, rel=1e-3)


def test_the_price_table_tool_runs(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--presets", "gcp-a100-16x2", "--summary"]) == 0
    out = capsys.readouterr().out
    assert "cost model alpha-beta" in out and "cost model calibrated" in out
    assert "A2A@256MB 1.00..1.00 (25/25)" in out
