"""The SPMD executor runs *any* plan exactly: pick a random strategy for every
node of the strategy graph, write the plan into the IR (specs, explicit
collectives, reshards), print and parse it, run it on 8 devices with
shard_map, and compare with the single-device step. This checks the sharding
rules, their local computations, resharding and the collectives, independent
of which plan the ILP would choose."""

from __future__ import annotations

import random

import jax
import pytest
from xdsl.dialects.builtin import FlatSymbolRefAttr
from zoo_fixtures import max_abs_diff, reference_outputs, tiny_step

import alpa_ir
from alpa_ir.autosharding.apply_plan import apply_plan
from alpa_ir.autosharding.cost_model import AlphaBetaCostModel
from alpa_ir.autosharding.graph import GraphBuilder
from alpa_ir.autosharding.resharding import ReshardCoster
from alpa_ir.backends.spmd import compile_spmd
from alpa_ir.dialects.mesh import MESH_ATTR, LogicalMeshOp
from alpa_ir.hardware.device_mesh import LogicalDeviceMesh
from alpa_ir.ir.module_utils import main_function
from alpa_ir.passmanager.pass_manager import PassManager
from alpa_ir.plugins.registry import default_registry
from alpa_ir.runtime.devices import jax_mesh, mesh_axis_names

CASES = [
    ("mlp-tiny", (2, 4), 0),
    ("gpt-tiny", (2, 4), 1),
    ("moe-tiny", (4, 2), 2),
    ("wresnet-tiny", (2, 4), 3),
    ("bert-tiny", (8,), 4),
]


@pytest.mark.parametrize(("name", "mesh_shape", "seed"), CASES)
def test_random_plan_matches_single_device(name, mesh_shape, seed):
    fn, args = tiny_step(name)
    module = alpa_ir.import_jax(fn, *args, donate_argnums=(0,), batch_argnums=(1,))
    PassManager(default_registry(), "builtin.module(merge-trivial-ops)").run(module)
    main = main_function(module)
    mesh = LogicalDeviceMesh(mesh_shape)
    module.body.block.insert_op_before(mesh.to_op("mesh"), main)
    main.attributes[MESH_ATTR] = FlatSymbolRefAttr("mesh")
    groups = {
        o: o.attributes["sharding.group"].value.data
        for o in main.body.block.ops
        if "sharding.group" in o.attributes
    }
    graph = GraphBuilder(
        main, groups, mesh.shape, ReshardCoster(mesh, AlphaBetaCostModel())
    ).build()
    rng = random.Random(seed)
    apply_plan(main, graph, [rng.randrange(len(n.strategies)) for n in graph.nodes])

    text = str(module)
    parsed = alpa_ir.parse_module(text)
    assert str(parsed) == text
    mesh_op = next(o for o in parsed.ops if isinstance(o, LogicalMeshOp))
    run, in_shardings = compile_spmd(
        parsed, main_function(parsed), jax_mesh(mesh_op), mesh_axis_names(mesh_op)
    )
    flat = jax.device_put(jax.tree.leaves(args), list(in_shardings))
    want = reference_outputs(name)
    got = jax.tree.unflatten(jax.tree.structure(want), list(run(*flat)))
    assert max_abs_diff(got, want) <= 1e-4
