"""Cross-mesh resharding (Alpa §6): tile correspondences, transfer plans with
and without the local all-gather rewrite, their execution on the 8 CPU
devices, and the ``cross-mesh-resharding`` pass.

What the plan tests prove, for every pair of specs below on every mesh pair:
- the pieces of each destination tile partition it, and each piece's
  sources are exactly the source devices whose tile contains it;
- every destination device receives each element of its receive tile exactly
  once, from a source device holding it;
- plain plan: each element crosses exactly as many times as the destination
  spec replicates it (bytes crossing = tensor bytes x replication);
- local all-gather rewrite: each element crosses exactly as many times as the
  receive spec replicates it, which is once whenever every replicated mesh
  axis divides some tensor dimension (all cases here but the one built to
  fail that), and never more than in the plain plan;
- senders are balanced: from a fully replicated source, the bytes the source
  devices send differ by at most one piece.
The execution tests check the received array equals the sent one, shard by
shard, with the destination NamedSharding.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable

import jax
import numpy as np
import pytest
from cross_mesh_fixtures import EXEC_SPECS, ITEMSIZE, MESH_PAIRS, SHAPE, SPECS, layouts, spec
from xdsl.dialects import func

from alpa_ir.dialects.attrs import CROSS_BYTES_ATTR
from alpa_ir.dialects.pipeline import TransferOp
from alpa_ir.dialects.sharding import ShardingSpec
from alpa_ir.errors import AlpaError
from alpa_ir.ir.text import parse_module, print_module
from alpa_ir.passes.cross_mesh_resharding import CrossMeshResharding
from alpa_ir.passmanager.pass_manager import PassManager
from alpa_ir.pipeline.cross_mesh import (
    MeshLayout,
    TransferPlan,
    all_gather_rewrite,
    assemble,
    box_size,
    contains,
    coverage,
    device_tiles,
    plan_transfer,
    tile_correspondence,
)
from alpa_ir.pipeline.transfer_attrs import RECV_SPEC_ATTR, plan_of_transfer
from alpa_ir.plugins.registry import default_registry
from alpa_ir.runtime.transfers import (
    all_gather_program,
    execute_transfer,
    layout_mesh,
    layout_sharding,
)


def check_plan(plan: TransferPlan) -> None:
    """The plan properties listed in the module docstring (but balance)."""
    src_tiles = device_tiles(plan.shape, plan.src)
    recv_tiles = plan.recv_tiles()
    for device, sends in plan.received().items():
        count = coverage(plan.shape, (s.box for s in sends))
        want = coverage(plan.shape, [recv_tiles[device]])
        np.testing.assert_array_equal(count, want, err_msg=f"device {device}")
    for send in plan.sends:
        assert contains(src_tiles[send.src], send.box)
        assert send.nbytes == box_size(send.box) * plan.itemsize
    crossings = coverage(plan.shape, (s.box for s in plan.sends for _ in s.dsts))
    assert (crossings == plan.recv_layout.replication()).all()
    assert plan.cross_bytes == plan.tensor_bytes * plan.recv_layout.replication()
    assert sum(plan.link_bytes().values()) == plan.cross_bytes


@pytest.mark.parametrize("pair", sorted(MESH_PAIRS))
def test_tile_correspondence_partitions_each_destination_tile(pair: str) -> None:
    for src_text, dst_text in itertools.product(SPECS, SPECS):
        src, dst = layouts(pair, src_text, dst_text)
        src_tiles = device_tiles(SHAPE, src)
        for device, pieces in tile_correspondence(SHAPE, src, dst).items():
            tile = device_tiles(SHAPE, dst)[device]
            np.testing.assert_array_equal(
                coverage(SHAPE, (p.box for p in pieces)), coverage(SHAPE, [tile])
            )
            for p in pieces:
                holders = tuple(d for d in src.devices if contains(src_tiles[d], p.box))
                assert p.sources == holders


@pytest.mark.parametrize("local_all_gather", [False, True], ids=["plain", "all-gather"])
@pytest.mark.parametrize("pair", sorted(MESH_PAIRS))
def test_plan_properties(pair: str, local_all_gather: bool) -> None:
    for src_text, dst_text in itertools.product(SPECS, SPECS):
        src, dst = layouts(pair, src_text, dst_text)
        plan = plan_transfer(SHAPE, ITEMSIZE, src, dst, local_all_gather=local_all_gather)
        check_plan(plan)
        tensor = plan.tensor_bytes
        if local_all_gather:
            assert plan.recv_layout.replication() == 1  # every replicated axis was placed
            assert plan.cross_bytes == tensor
        else:
            assert (plan.recv_spec, plan.gather) == (dst.spec, ())
            assert plan.cross_bytes == tensor * dst.replication()


def test_rewrite_with_an_axis_that_divides_nothing() -> None:
    """(2, 3) on a 2x2 mesh, replicated: mesh axis 0 splits tensor axis 0, axis 1
    divides no remaining extent (1, 3) and stays replicated: elements cross twice
    instead of four times."""
    src = MeshLayout(spec("R,R"), (1, 4), (0, 1, 2, 3))
    dst = MeshLayout(spec("R,R"), (2, 2), (4, 5, 6, 7))
    plan = plan_transfer((2, 3), 2, src, dst)
    check_plan(plan)
    assert plan.recv_spec == spec("S0,R") and plan.gather == ((0, (0,)),)
    assert plan.cross_bytes == 2 * 12
    assert plan_transfer((2, 3), 2, src, dst, local_all_gather=False).cross_bytes == 4 * 12


def test_rewrite_puts_two_axes_on_one_dimension() -> None:
    dst = MeshLayout(spec("R,R"), (2, 2), (4, 5, 6, 7))
    assert all_gather_rewrite((16, 2), dst) == (spec("S01,R"), ((0, (0, 1)),))
    assert all_gather_rewrite((8, 8), dst) == (spec("S0,S1"), ((0, (0,)), (1, (1,))))


@pytest.mark.parametrize("pair", sorted(MESH_PAIRS))
def test_senders_are_balanced_over_source_replicas(pair: str) -> None:
    for dst_text, lag in itertools.product(SPECS, (False, True)):
        src, dst = layouts(pair, "R,R", dst_text)
        plan = plan_transfer(SHAPE, ITEMSIZE, src, dst, local_all_gather=lag)
        sent = plan.sent_bytes().values()
        largest_piece = max(s.nbytes for s in plan.sends)
        assert max(sent) - min(sent) <= largest_piece, (dst_text, lag, plan.sent_bytes())
    # 2x2 replicated -> 1x4 replicated, rewritten: four quarter pieces, one per source.
    src, dst = layouts("2x2-1x4", "R,R", "R,R")
    assert set(plan_transfer(SHAPE, ITEMSIZE, src, dst).sent_bytes().values()) == {64}


def test_overlapping_meshes_copy_locally() -> None:
    """A destination device that holds its piece already takes it from itself."""
    src = MeshLayout(spec("S1,R"), (1, 2), (0, 1))
    dst = MeshLayout(spec("S1,R"), (1, 2), (1, 0))
    plan = plan_transfer(SHAPE, ITEMSIZE, src, dst)
    assert plan.cross_bytes == 2 * 128 and all(s.src != s.dsts[0] for s in plan.sends)
    same = plan_transfer(SHAPE, ITEMSIZE, src, src)
    assert same.cross_bytes == 0 and all(s.src == s.dsts[0] for s in same.sends)


def test_assemble_numpy_pieces_in_any_order() -> None:
    x = np.arange(64).reshape(8, 8)
    boxes = [((2, 4), (0, 3)), ((2, 4), (3, 8)), ((4, 6), (0, 3)), ((4, 6), (3, 8))]
    parts = [(b, x[tuple(slice(*r) for r in b)]) for b in reversed(boxes)]
    out = assemble(((2, 6), (0, 8)), parts, lambda blocks, axis: np.concatenate(blocks, axis))
    np.testing.assert_array_equal(out, x[2:6])
    with pytest.raises(AlpaError, match="do not tile"):
        assemble(((2, 6), (0, 8)), parts[1:], lambda blocks, axis: blocks[0])


def test_bad_layouts_are_reported() -> None:
    with pytest.raises(AlpaError, match="does not divide"):
        plan_transfer((6, 8), 4, *layouts("1x4-2x2", "S1,R", "R,R"))
    with pytest.raises(AlpaError, match="partial"):
        MeshLayout(ShardingSpec(((), ()), (0,)), (2, 2), (0, 1, 2, 3))
    with pytest.raises(AlpaError, match="needs 4 devices"):
        MeshLayout(spec("R,R"), (2, 2), (0, 1, 2))


GatherCache = dict[tuple[object, ...], Callable[[jax.Array], jax.Array]]


@pytest.fixture(scope="module")
def gather_cache() -> GatherCache:
    return {}


def run_plan(plan: TransferPlan, x: np.ndarray, cache: GatherCache) -> jax.Array:
    program = None
    if plan.gather:
        key = (plan.dst, plan.recv_spec, plan.gather)
        if key not in cache:
            mesh = layout_mesh(plan.dst)
            cache[key] = all_gather_program(mesh, plan.recv_spec, plan.dst.spec, plan.gather)
        program = cache[key]
    sent = jax.device_put(x, layout_sharding(plan.src))
    return execute_transfer(sent, plan, gather_program=program)


def check_received(y: jax.Array, x: np.ndarray, dst: MeshLayout) -> None:
    assert y.sharding == layout_sharding(dst)
    tiles = device_tiles(x.shape, dst)
    ids = {dev: i for i, dev in enumerate(jax.devices())}
    assert sorted(ids[s.device] for s in y.addressable_shards) == sorted(dst.devices)
    for shard in y.addressable_shards:
        want = tuple(slice(lo, hi) for lo, hi in tiles[ids[shard.device]])
        np.testing.assert_array_equal(np.asarray(shard.data), x[want])
    np.testing.assert_array_equal(np.asarray(y), x)


@pytest.mark.parametrize("local_all_gather", [False, True], ids=["plain", "all-gather"])
@pytest.mark.parametrize("pair", sorted(MESH_PAIRS))
def test_received_array_equals_sent(
    pair: str, local_all_gather: bool, gather_cache: GatherCache
) -> None:
    x = np.arange(np.prod(SHAPE), dtype=np.float32).reshape(SHAPE)
    for src_text, dst_text in itertools.product(EXEC_SPECS, EXEC_SPECS):
        src, dst = layouts(pair, src_text, dst_text)
        plan = plan_transfer(SHAPE, ITEMSIZE, src, dst, local_all_gather=local_all_gather)
        check_received(run_plan(plan, x, gather_cache), x, dst)


def test_two_axes_gathered_on_one_dimension_execute(gather_cache: GatherCache) -> None:
    x = np.arange(32, dtype=np.int32).reshape(16, 2)
    src = MeshLayout(spec("R,S1"), (1, 2), (0, 1))
    dst = MeshLayout(spec("R,R"), (2, 2), (4, 5, 6, 7))
    plan = plan_transfer(x.shape, 4, src, dst)
    assert plan.gather == ((0, (0, 1)),)
    check_received(run_plan(plan, x, gather_cache), x, dst)


def test_gather_over_axes_in_minor_major_order_on_overlapping_meshes(
    gather_cache: GatherCache,
) -> None:
    """2x4 destination, replicated: the larger axis 1 goes first, so dim 0 becomes
    S10 and the all-gather runs over (m1, m0). Device 0, in both meshes, takes its
    piece (rows 0-1) from itself; device 1's piece (rows 4-5) is on source device 0."""
    x = np.arange(48, dtype=np.float32).reshape(16, 3)
    src = MeshLayout(spec("S1,R"), (1, 2), (0, 1))
    dst = MeshLayout(spec("R,R"), (2, 4), tuple(range(8)))
    plan = plan_transfer(x.shape, 4, src, dst)
    assert (plan.recv_spec, plan.gather) == (spec("S10,R"), ((0, (1, 0)),))
    assert plan.cross_bytes == 192 - 24
    assert [(s.src, s.dsts, s.box[0]) for s in plan.sends[:2]] == [
        (0, (0,), (0, 2)),
        (0, (1,), (4, 6)),
    ]
    check_received(run_plan(plan, x, gather_cache), x, dst)


def test_all_gather_is_one_collective_over_the_replica_groups() -> None:
    dst = MeshLayout(spec("S0,R"), (2, 2), (4, 5, 6, 7))
    recv, gather = all_gather_rewrite(SHAPE, dst)
    program = all_gather_program(layout_mesh(dst), recv, dst.spec, gather)
    arg = jax.ShapeDtypeStruct(
        SHAPE, np.float32, sharding=layout_sharding(MeshLayout(recv, (2, 2), dst.devices))
    )
    hlo = program.lower(arg).compile().as_text()  # type: ignore[attr-defined]
    gathers = [line for line in hlo.splitlines() if " all-gather(" in line]
    assert len(gathers) == 1 and "replica_groups={{0,1},{2,3}}" in gathers[0]
    assert "dimensions={1}" in gathers[0]


def test_execute_rejects_an_input_with_another_layout() -> None:
    src, dst = layouts("1x2-1x2", "R,S1", "R,R")
    plan = plan_transfer(SHAPE, ITEMSIZE, src, dst)
    other = jax.device_put(
        np.zeros(SHAPE, np.float32), layout_sharding(layouts("1x2-1x2", "R,R", "R,R")[0])
    )
    with pytest.raises(AlpaError, match="source spec"):
        execute_transfer(other, plan)


MODULE = """
builtin.module {
  mesh.logical_mesh @mesh0 {shape = array<i64: 1, 4>, devices = array<i64: 0, 1, 2, 3>, alpha = array<f64: 1.0, 1.0>, beta = array<f64: 1.0, 0.1>}
  mesh.logical_mesh @mesh1 {shape = array<i64: 2, 2>, devices = array<i64: 4, 5, 6, 7>, alpha = array<f64: 1.0, 1.0>, beta = array<f64: 1.0, 0.1>}
  pipeline.plan @plan {stages = [@stage0, @stage1], num_micro_batches = 2, schedule = "gpipe"}
  pipeline.stage @stage0 {layers = array<i64: 0, 0>, mesh = @mesh0, forward = @stage0_forward, backward = @stage0_backward}
  pipeline.stage @stage1 {layers = array<i64: 1, 1>, mesh = @mesh1, forward = @stage1_forward, backward = @stage1_backward}
  func.func @stage0_forward(%x: tensor<8x8xf32> {sharding.spec = #sharding.spec<[R, S1]>}) -> (tensor<8x8xf32> {sharding.spec = #sharding.spec<[R, S1]>}, tensor<8x8xf32>) attributes {mesh.mesh = @mesh0} {
    func.return %x, %x : tensor<8x8xf32>, tensor<8x8xf32>
  }
  func.func @stage1_forward(%a: tensor<8x8xf32> {sharding.spec = #sharding.spec<[S0, R]>}, %b: tensor<8x8xf32>, %w: tensor<8x8xf32>) -> (tensor<8x8xf32> {sharding.spec = #sharding.spec<[S01, R]>}) attributes {mesh.mesh = @mesh1} {
    func.return %a : tensor<8x8xf32>
  }
  func.func @stage1_backward(%a: tensor<8x8xf32> {sharding.spec = #sharding.spec<[S0, R]>}, %y: tensor<8x8xf32>) -> tensor<8x8xf32> attributes {mesh.mesh = @mesh1} {
    func.return %a : tensor<8x8xf32>
  }
  func.func @stage0_backward(%g: tensor<8x8xf32> {sharding.spec = #sharding.spec<[S1, R]>}, %r: tensor<8x8xf32>) -> tensor<8x8xf32> attributes {mesh.mesh = @mesh0} {
    func.return %g : tensor<8x8xf32>
  }
  func.func @main(%arg0: tensor<8x8xf32>, %arg1: tensor<8x8xf32>) -> tensor<8x8xf32> {
    %0:2 = func.call @stage0_forward(%arg0) : (tensor<8x8xf32>) -> (tensor<8x8xf32>, tensor<8x8xf32>)
    %1 = func.call @stage1_forward(%0#0, %0#1, %arg1) : (tensor<8x8xf32>, tensor<8x8xf32>, tensor<8x8xf32>) -> tensor<8x8xf32>
    %2 = func.call @stage1_backward(%0#0, %1) : (tensor<8x8xf32>, tensor<8x8xf32>) -> tensor<8x8xf32>
    %3 = func.call @stage0_backward(%2, %0#1) : (tensor<8x8xf32>, tensor<8x8xf32>) -> tensor<8x8xf32>
    func.return %3 : tensor<8x8xf32>
  }
}
"""

# (value, src mesh, dst mesh, src spec, dst spec, cross bytes plain, rewritten)
EXPECTED = [
    ("stage0_forward:0", "mesh0", "mesh1", "R,S1", "S0,R", 512, 256),
    ("stage0_forward:1", "mesh0", "mesh1", "R,R", "R,R", 1024, 256),
    ("stage1_backward:0", "mesh1", "mesh0", "R,R", "S1,R", 256, 256),
]


def transfers(module: object) -> list[TransferOp]:
    return [op for op in module.ops if isinstance(op, TransferOp)]  # type: ignore[attr-defined]


@pytest.mark.parametrize("local_all_gather", [False, True], ids=["plain", "all-gather"])
def test_pass_writes_one_transfer_per_crossing(local_all_gather: bool) -> None:
    module = parse_module(MODULE)
    option = "true" if local_all_gather else "false"
    pipeline = f"builtin.module(cross-mesh-resharding{{local-all-gather={option}}})"
    PassManager(default_registry(), pipeline).run(module)
    text = print_module(module)
    assert print_module(parse_module(text)) == text
    ops = transfers(module)
    # Not transferred: @main's arguments, stage0_forward:1 to stage0_backward (same mesh),
    # stage1_forward:0 (same mesh); stage0_forward:0 reaches mesh1 twice with one spec.
    got = [
        (
            t.value.data,
            t.src_mesh.root_reference.data,
            t.dst_mesh.root_reference.data,
            str(t.src_spec.spec),
            str(t.dst_spec.spec),
            t.attributes[CROSS_BYTES_ATTR].value.data,  # type: ignore[attr-defined]
        )
        for t in ops
    ]
    assert [t.sym_name.data for t in ops] == ["t0", "t1", "t2"]
    assert got == [
        (v, s, d, str(spec(a)), str(spec(b)), rewritten if local_all_gather else plain)
        for v, s, d, a, b, plain, rewritten in EXPECTED
    ]
    x = np.arange(64, dtype=np.float32).reshape(SHAPE)
    for op in ops:
        plan = plan_of_transfer(module, op)
        assert (RECV_SPEC_ATTR in op.attributes) == (plan.recv_spec != plan.dst.spec)
        assert plan == plan_transfer(
            SHAPE, ITEMSIZE, plan.src, plan.dst, local_all_gather=local_all_gather
        )
        check_received(
            execute_transfer(jax.device_put(x, layout_sharding(plan.src)), plan), x, plan.dst
        )


def test_pass_again_replans_in_place() -> None:
    module = parse_module(MODULE)
    CrossMeshResharding(local_all_gather=False).apply(None, module)  # type: ignore[arg-type]
    CrossMeshResharding(local_all_gather=True).apply(None, module)  # type: ignore[arg-type]
    ops = transfers(module)
    assert [t.sym_name.data for t in ops] == ["t0", "t1", "t2"]
    assert [t.attributes[CROSS_BYTES_ATTR].value.data for t in ops] == [256, 256, 256]  # type: ignore[attr-defined]
    first_function = next(i for i, o in enumerate(module.ops) if isinstance(o, func.FuncOp))
    assert all(
        isinstance(o, TransferOp) for o in list(module.ops)[first_function - 3 : first_function]
    )


def test_pass_rejects_mismatched_shapes() -> None:
    """stage0_backward takes a 4x8 argument where @main passes it the 8x8 stage1_backward:0."""
    old = """func.func @stage0_backward(%g: tensor<8x8xf32> {sharding.spec = #sharding.spec<[S1, R]>}, %r: tensor<8x8xf32>) -> tensor<8x8xf32> attributes {mesh.mesh = @mesh0} {
    func.return %g : tensor<8x8xf32>"""
    new = """func.func @stage0_backward(%g: tensor<4x8xf32>, %r: tensor<8x8xf32>) -> tensor<8x8xf32> attributes {mesh.mesh = @mesh0} {
    func.return %r : tensor<8x8xf32>"""
    assert old in MODULE
    module = parse_module(MODULE.replace(old, new), verify=False)
    message = r"value stage1_backward:0 is float32\[8, 8\] but @stage0_backward argument 0 expects"
    with pytest.raises(AlpaError, match=message):
        CrossMeshResharding().apply(None, module)  # type: ignore[arg-type]


def test_a_spec_that_does_not_fit_its_mesh_is_refused_where_it_is_written() -> None:
    """The verifier refuses it when the module is parsed, naming the function
    and the line, before cross-mesh-resharding could meet it."""
    bad = MODULE.replace("#sharding.spec<[S1, R]>", "#sharding.spec<[S2, R]>")
    with pytest.raises(
        AlpaError,
        match=r":\d+:\d+: operation 'func.func' @stage\w+ does not verify: "
        r"spec \[S2, R\] names mesh axis 2, the mesh \[1, 4\] has 2 axes",
    ):
        parse_module(bad)


def test_bench_cross_mesh_reports_both_variants(capsys: pytest.CaptureFixture[str]) -> None:
    from alpa_ir.tools.bench_cross_mesh import CASES, main, rows

    for row in rows([c for c in CASES if c.name == "tiny"]):
        dst = row.plain.dst
        assert row.plain.cross_bytes == row.plain.tensor_bytes * dst.replication()
        assert row.rewritten.cross_bytes == row.plain.tensor_bytes
    assert main([]) == 0
    out = capsys.readouterr().out
    assert "8x1024x2560" in out and "8.0x" in out


def test_pass_on_an_outlined_pipeshard_step() -> None:
    """The outliner's output (two stages on 1x4 and 2x2, auto-sharded): every value
    crossing meshes gets a transfer whose plan moves random data exactly."""
    import jax.numpy as jnp

    import alpa_ir
    from alpa_ir.api.pipeshard import ManualStageOption, PipeshardParallel
    from alpa_ir.frontend.markers import mark_pipeline_boundary

    def loss(p: dict[str, jax.Array], x: jax.Array) -> jax.Array:
        h = mark_pipeline_boundary(jnp.tanh(x @ p["w1"]))
        return jnp.mean((h @ p["w2"]) ** 2)

    def step(p: dict[str, jax.Array], x: jax.Array) -> dict[str, jax.Array]:
        g = alpa_ir.grad(loss)(p, x)
        return jax.tree.map(lambda a, b: a - 0.1 * b, p, g)

    params = {"w1": jnp.full((16, 32), 0.01), "w2": jnp.full((32, 8), 0.01)}
    stages = ManualStageOption(
        forward_stage_layer_ids=[[0], [1]], submesh_logical_shapes=[(1, 4), (2, 2)]
    )
    method = PipeshardParallel(devices=list(range(8)), num_micro_batches=2, stage_option=stages)
    step_fn = alpa_ir.parallelize(step, method=method, batch_argnums=(1,))
    module = step_fn.get_executable(params, jnp.ones((8, 16))).module
    rng = np.random.default_rng(0)
    for local_all_gather in (False, True):
        CrossMeshResharding(local_all_gather=local_all_gather).apply(None, module)  # type: ignore[arg-type]
        ops = transfers(module)
        # the activation forward, the last stage's input gradient back
        assert {t.value.data for t in ops} >= {"stage0_forward:0", "stage1_backward:0"}
        for op in ops:
            plan = plan_of_transfer(module, op)
            x = rng.standard_normal(plan.shape).astype(np.float32)
            sent = jax.device_put(x, layout_sharding(plan.src))
            check_received(execute_transfer(sent, plan), x, plan.dst)
    text = print_module(module)
    assert print_module(parse_module(text)) == text
