"""The ``p2`` auto-sharding cost model: collectives priced on the hardware, by placement."""

from __future__ import annotations

import jax
import numpy as np
import pytest
from xdsl.dialects.builtin import FlatSymbolRefAttr, ModuleOp
from zoo_fixtures import max_abs_diff, reference_outputs, tiny_step

from alpa_ir import import_jax
from alpa_ir.autosharding.cost_model import AlphaBetaCostModel
from alpa_ir.autosharding.planner import OBJECTIVE_ATTR
from alpa_ir.backends.spmd import compile_spmd
from alpa_ir.dialects.attrs import TIME_ATTR
from alpa_ir.dialects.lax_attrs import ints_of
from alpa_ir.dialects.mesh import MESH_ATTR, LogicalMeshOp
from alpa_ir.errors import AlpaError
from alpa_ir.hardware.device_mesh import LogicalDeviceMesh, function_mesh
from alpa_ir.ir.module_utils import main_function
from alpa_ir.ir.text import parse_module, print_module
from alpa_ir.p2.choice import ReductionPricer
from alpa_ir.p2.cost_model import P2CostModel
from alpa_ir.p2.ir_collectives import mesh_collectives
from alpa_ir.p2.placement import ParallelismMatrix, device_array
from alpa_ir.p2.plan_time import plan_comm_seconds
from alpa_ir.p2.semantics import Collective
from alpa_ir.p2.simulator import Simulator
from alpa_ir.p2.system import custom_system
from alpa_ir.passmanager.pass_manager import PassManager
from alpa_ir.plugins.registry import default_registry
from alpa_ir.runtime.devices import jax_mesh, mesh_axis_names

SYSTEM = custom_system((2, 4))
ROW_MAJOR = LogicalDeviceMesh((2, 4))  # axis 0 across the 2 nodes, axis 1 inside
SWAPPED = LogicalDeviceMesh(  # axis 0 inside a node, axis 1 split 2 x 2 over nodes and GPUs
    (2, 4), devices=tuple(device_array(ParallelismMatrix(((1, 2), (2, 2)))).reshape(-1))
)
MB = 2**20


def test_all_reduce_is_priced_by_its_best_program_on_the_placement() -> None:
    model = P2CostModel(SYSTEM)
    pricer = ReductionPricer(SYSTEM, "ring", 5)
    across = model.all_reduce(ROW_MAJOR, 4 * MB, (0,))
    inside = model.all_reduce(SWAPPED, 4 * MB, (0,))
    best = pricer.best(ParallelismMatrix(((2, 1), (1, 4))), (0,), 4 * MB)[1]
    assert across == pytest.approx(best * 1e6 + 0.01)
    assert inside < across / 5  # the same all-reduce, inside a node
    flat = AlphaBetaCostModel()  # blind to the placement
    assert flat.all_reduce(ROW_MAJOR, 4 * MB, (0,)) == flat.all_reduce(SWAPPED, 4 * MB, (0,))
    assert model.all_reduce(ROW_MAJOR, 4 * MB, (0,)) > model.all_reduce(ROW_MAJOR, MB, (0,))


def test_gather_scatter_and_all_to_all_are_simulated_on_their_groups() -> None:
    model = P2CostModel(SYSTEM)
    sim = Simulator(SYSTEM)
    groups = np.array([[0, 1, 2, 3], [4, 5, 6, 7]])  # axis 1 of the row-major mesh
    gather = sim.program_time([(Collective.ALL_GATHER, groups)], MB)  # MB in, 4 MB out
    assert model.all_gather(ROW_MAJOR, 4 * MB, (1,)) == pytest.approx(gather * 1e6 + 0.1)
    scatter = sim.program_time([(Collective.REDUCE_SCATTER, groups)], 4 * MB)
    assert model.reduce_scatter(ROW_MAJOR, 4 * MB, (1,)) == pytest.approx(scatter * 1e6 + 0.001)
    a2a = sim.all_to_all_time(groups, 4 * MB)
    assert model.all_to_all(ROW_MAJOR, 4 * MB, (1,)) == pytest.approx(a2a * 1e6 + 0.001)
    # over axis 1 of the swapped mesh, half of every group's traffic crosses the network
    assert model.all_to_all(SWAPPED, 4 * MB, (1,)) > 5 * model.all_to_all(ROW_MAJOR, 4 * MB, (1,))
    assert model.all_gather(ROW_MAJOR, 4 * MB, ()) == 0.0


def test_a_mesh_that_is_no_placement_is_still_priced() -> None:
    """A placed mesh flattened to one axis keeps its devices in an order no matrix of (1, 8)
    has: its all-reduce is one plain all-reduce over all devices."""
    model = P2CostModel(SYSTEM)
    flat = LogicalDeviceMesh((1, 8), devices=SWAPPED.devices)
    assert model.matrix(flat) is None
    want = Simulator(SYSTEM).allreduce_time(np.array([list(SWAPPED.devices)]), MB)
    assert model.all_reduce(flat, MB, (1,)) == pytest.approx(want * 1e6 + 0.01)


def test_bad_meshes_and_missing_system_are_clear_errors() -> None:
    with pytest.raises(AlpaError, match="has 4 devices but system 'custom-2x4' has 8"):
        P2CostModel(SYSTEM).all_reduce(LogicalDeviceMesh((2, 2)), MB, (0,))
    with pytest.raises(AlpaError, match="cost model p2 needs a system"):
        P2CostModel().all_reduce(ROW_MAJOR, MB, (0,))
    with pytest.raises(AlpaError, match="max-size 0"):
        P2CostModel(SYSTEM, max_size=0)


def _plan(cost_model: str, system: str = "custom-2x4") -> object:
    fn, args = tiny_step("mlp-tiny")
    module = import_jax(fn, *args, donate_argnums=(0,), batch_argnums=(1,))
    option = f" system={system}" if system else ""
    pipeline = (
        "builtin.module(merge-trivial-ops,"
        f"auto-sharding{{mesh-shape=2,4 cost-model={cost_model}{option}}})"
    )
    PassManager(default_registry(), pipeline).run(module)
    return module


def test_auto_sharding_with_p2_minimizes_the_p2_price_of_its_collectives() -> None:
    """The ILP's objective under ``cost-model=p2`` is the p2 price (µs) of the collectives the
    plan inserts; the flat model's plan costs more on this system."""
    model = P2CostModel(SYSTEM)

    def price(module: object) -> float:
        function = main_function(module)  # type: ignore[arg-type]
        mesh = function_mesh(module, function)
        assert mesh is not None
        total = 0.0
        for c in mesh_collectives(function, mesh.shape, "test"):
            assert c.kind is Collective.ALL_REDUCE
            total += model.all_reduce(mesh, c.nbytes, c.axes)
        return total

    planned = _plan("p2")
    objective = main_function(planned).attributes["sharding.objective"].value.data  # type: ignore[attr-defined]
    assert objective == pytest.approx(price(planned), abs=1e-3)
    assert price(_plan("alpha-beta")) > 1.4 * price(planned)


def test_auto_sharding_with_p2_needs_a_system() -> None:
    with pytest.raises(AlpaError, match="no system for mesh @mesh"):
        _plan("p2", system="")


# ------------------------------------------------------------- synthesize-placement{objective=plan}


def _unplanned_on_mesh(shape: tuple[int, ...]) -> ModuleOp:
    fn, args = tiny_step("mlp-tiny")
    module = import_jax(fn, *args, donate_argnums=(0,), batch_argnums=(1,))
    function = main_function(module)
    module.body.block.insert_op_before(LogicalDeviceMesh(shape).to_op("mesh"), function)
    function.attributes[MESH_ATTR] = FlatSymbolRefAttr("mesh")
    return module


def test_plan_objective_places_and_plans_with_the_cheapest_plan() -> None:
    """objective=plan plans every placement with the p2 model and keeps the plan whose
    collectives take least: on 2 nodes of 4 it beats planning on the row-major order (by more
    than a microsecond), writes the placement and the plan's time, and the
    planned module runs on the 8 CPU devices with the single-device step's result."""
    registry = default_registry()
    module = _unplanned_on_mesh((2, 4))
    PassManager(
        registry,
        "builtin.module(merge-trivial-ops,synthesize-placement{system=custom-2x4 objective=plan})",
    ).run(module)
    row_major = _unplanned_on_mesh((2, 4))
    PassManager(
        registry,
        "builtin.module(merge-trivial-ops,auto-sharding{cost-model=p2 system=custom-2x4})",
    ).run(row_major)
    model = P2CostModel(SYSTEM)
    row_major_mesh = function_mesh(row_major, main_function(row_major))
    assert row_major_mesh is not None
    row_major_time = sum(
        plan_comm_seconds(main_function(row_major), row_major_mesh, model).values()
    )
    mesh_op = next(o for o in module.ops if isinstance(o, LogicalMeshOp))
    assert mesh_op.placement is not None
    matrix = ParallelismMatrix(tuple(ints_of(row) for row in mesh_op.placement.data))
    assert list(mesh_op.device_ids) == device_array(matrix).reshape(-1).tolist() != list(range(8))
    mesh = LogicalDeviceMesh.from_op(mesh_op)
    seconds = sum(plan_comm_seconds(main_function(module), mesh, model).values())
    assert mesh_op.attributes[TIME_ATTR].value.data == pytest.approx(seconds)  # type: ignore[attr-defined]
    assert seconds < row_major_time - 1e-6
    assert OBJECTIVE_ATTR in main_function(module).attributes  # the module is planned
    parsed = parse_module(print_module(module))
    run, shardings = compile_spmd(
        parsed, main_function(parsed), jax_mesh(mesh_op), mesh_axis_names(mesh_op)
    )
    _, args = tiny_step("mlp-tiny")
    outs = run(*jax.device_put(jax.tree.leaves(args), list(shardings)))
    want = reference_outputs("mlp-tiny")
    got = jax.tree.unflatten(jax.tree.structure(want), list(outs))
    assert max_abs_diff(got, want) <= 1e-4


@pytest.mark.parametrize(
    ("options", "planned", "message"),
    [
        ("objective=plan", True, "objective=plan auto-shards @main itself"),
        ("objective=plan algorithm=tree", False, "algorithm and max-size cannot be changed"),
    ],
)
def test_plan_objective_bad_input(options: str, planned: bool, message: str) -> None:
    module = _unplanned_on_mesh((2, 4))
    first = "auto-sharding," if planned else ""
    pipeline = f"builtin.module({first}synthesize-placement{{system=custom-2x4 {options}}})"
    with pytest.raises(AlpaError, match=message):
        PassManager(default_registry(), pipeline).run(module)


def test_simulated_all_to_all_loads_the_ports_it_crosses() -> None:
    """custom-2x4: 10 GB/s node ports, 100 GB/s GPU ports, 5 µs per hop. Inside a node a
    device sends 3/4 of its bytes through its own port; across the nodes every node's port
    carries half of each of its 4 devices' bytes."""
    sim = Simulator(SYSTEM)
    inside = sim.all_to_all_time(np.array([[0, 1, 2, 3], [4, 5, 6, 7]]), 4 * MB)
    assert inside == pytest.approx(5e-6 + 0.75 * 4 * MB / 100e9)
    across = sim.all_to_all_time(np.array([[0, 4], [1, 5], [2, 6], [3, 7]]), 4 * MB)
    assert across == pytest.approx(5e-6 + 4 * 0.5 * 4 * MB / 10e9)
