"""The P² passes: ``synthesize-placement`` chooses the device order of the logical mesh,
``synthesize-reductions`` rewrites all-reduces into synthesized programs, and the xla
backend's SPMD executor runs those programs on the 8 CPU devices with the same result as a
plain all-reduce (the numerical oracle)."""

from __future__ import annotations

import itertools
import math
from pathlib import Path

import jax
import numpy as np
import pytest
from zoo_fixtures import max_abs_diff, reference_outputs, tiny_step

from alpa_ir import import_jax
from alpa_ir.autosharding.plan_bytes import predicted_collectives
from alpa_ir.backends.program_collectives import full_size_masks
from alpa_ir.backends.spmd import compile_spmd
from alpa_ir.costs.collective_accounting import hlo_collectives, total_wire_bytes
from alpa_ir.dialects.lax_attrs import ints_of
from alpa_ir.dialects.mesh import LogicalMeshOp
from alpa_ir.dialects.sharding import AllReduceProgramOp
from alpa_ir.errors import AlpaError
from alpa_ir.ir.context import make_context
from alpa_ir.ir.module_utils import main_function
from alpa_ir.ir.text import parse_module, print_module
from alpa_ir.p2.choice import ChoiceOptions, ReductionPricer, executed_steps, spmd_executable
from alpa_ir.p2.explore import ExploreOptions, explore
from alpa_ir.p2.ir_collectives import mesh_collectives
from alpa_ir.p2.ir_system import SYSTEM_ATTR
from alpa_ir.p2.placement import ParallelismMatrix, device_array
from alpa_ir.p2.simulator import Simulator
from alpa_ir.p2.system import custom_system, get_system
from alpa_ir.passes.synthesize_placement import rank_placements
from alpa_ir.passmanager.pass_manager import PassManager
from alpa_ir.plugins.registry import default_registry
from alpa_ir.runtime.devices import jax_mesh, mesh_axis_names
from alpa_ir.tools.alpa_opt import main as alpa_opt_main


def _spec(mesh_rank: int) -> str:
    return "#sharding.spec<[S" + "".join(map(str, range(mesh_rank))) + ", R]>"


def _module(
    shape: tuple[int, ...],
    body: str,
    block: tuple[int, int] = (3, 5),
    devices: list[int] | None = None,
    extra: str = "",
    results: str = "%0",
) -> str:
    """@main(%x) on a mesh of ``shape``: %x split over all mesh axes (dim 0), local block
    ``block``; the results keep that layout, so every device's block comes back."""
    n = math.prod(shape)
    ty = f"tensor<{block[0] * n}x{block[1]}xf32>"
    ids = ", ".join(map(str, devices if devices is not None else range(n)))
    ones = ", ".join(["1.0"] * len(shape))
    spec = _spec(len(shape))
    outs = results.split(", ")
    out_types = ", ".join(f"{ty} {{sharding.spec = {spec}}}" for _ in outs)
    return (
        "builtin.module {\n"
        f"  mesh.logical_mesh @mesh {{shape = array<i64: {', '.join(map(str, shape))}>, "
        f"devices = array<i64: {ids}>, alpha = array<f64: {ones}>, beta = array<f64: {ones}>"
        f"{extra}}}\n"
        f"  func.func @main(%x: {ty} {{sharding.spec = {spec}}}) -> ({out_types}) "
        "attributes {mesh.mesh = @mesh} {\n"
        + body.replace("SPEC", spec).replace("TY", ty)
        + f"\n    func.return {results} : {', '.join([ty] * len(outs))}\n  }}\n}}\n"
    )


def _all_reduce(shape: tuple[int, ...], axes: tuple[int, ...], **kw: object) -> str:
    axes_text = ", ".join(map(str, axes))
    body = (
        f"    %0 = sharding.all_reduce %x {{axes = array<i64: {axes_text}>, "
        "sharding.specs = [SPEC]} : TY"
    )
    return _module(shape, body, **kw)  # type: ignore[arg-type]


def _run(pipeline: str, text: str) -> str:
    registry = default_registry()
    module = parse_module(text, ctx=make_context(registry))
    PassManager(registry, pipeline).run(module)
    return print_module(module)


def _execute(text: str, x: np.ndarray) -> list[np.ndarray]:
    module = parse_module(text)
    mesh_op = next(o for o in module.ops if isinstance(o, LogicalMeshOp))
    run, shardings = compile_spmd(
        module, main_function(module), jax_mesh(mesh_op), mesh_axis_names(mesh_op)
    )
    return [np.asarray(y) for y in run(*jax.device_put([x], list(shardings)))]


def _mesh(text: str) -> LogicalMeshOp:
    return next(o for o in parse_module(text).ops if isinstance(o, LogicalMeshOp))


def _random_input(shape: tuple[int, ...], block: tuple[int, int], seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    return rng.standard_normal((block[0] * math.prod(shape), block[1])).astype(np.float32)


# --------------------------------------------------------------------------- placement


def test_placement_puts_a_big_reduction_inside_the_node() -> None:
    """An all-reduce over mesh axis 0 (2 devices) of 4 MB per device: on 2 nodes of 4 the
    default order puts axis 0 across the nodes; the chosen one keeps it inside a node."""
    system = custom_system((2, 4))
    text = _all_reduce((2, 4), (0,), block=(1024, 1024))
    out = _run("synthesize-placement{system=custom-2x4}", text)
    mesh = _mesh(out)
    assert mesh.placement is not None
    matrix = ParallelismMatrix(tuple(ints_of(row) for row in mesh.placement.data))
    assert matrix.rows[0][0] == 1  # axis 0 not split across nodes
    assert list(mesh.device_ids) == device_array(matrix).reshape(-1).tolist()
    assert mesh.attributes[SYSTEM_ATTR].data == "custom-2x4"  # type: ignore[attr-defined]
    chosen = mesh.attributes["p2.predicted_time"].value.data  # type: ignore[attr-defined]
    module = parse_module(text)
    collectives = mesh_collectives(main_function(module), (2, 4), "test")
    assert collectives[0].nbytes == 1024 * 1024 * 4
    ranked = dict(rank_placements(system, (2, 4), collectives, ChoiceOptions()))
    default = ranked[ParallelismMatrix(((2, 1), (1, 4)))]
    assert chosen == pytest.approx(min(ranked.values()))
    assert chosen < default / 5


def test_placement_keeps_the_current_order_on_a_tie() -> None:
    """All-reducing over every axis gives one group of all devices in any order: a tie."""
    out = _run("synthesize-placement{system=custom-2x4}", _all_reduce((2, 4), (0, 1)))
    assert list(_mesh(out).device_ids) == list(range(8))


def test_placement_without_collectives_prices_an_allreduce_per_axis() -> None:
    """No collectives: a plain all-reduce of the paper's size over each axis alone. On 2
    nodes of 16 A100 the 16-wide axis then crosses the nodes in 2 x 8 rather than the
    2-wide axis with all its data (8.6 s vs 2.0 s predicted)."""
    system = get_system("gcp-a100-16x2")
    body = "    %0 = lax.neg %x : (TY) -> TY"
    out = _run("synthesize-placement{system=gcp-a100-16x2}", _module((2, 16), body, block=(1, 4)))
    mesh = _mesh(out)
    assert mesh.placement is not None
    assert [list(ints_of(row)) for row in mesh.placement.data] == [[1, 2], [2, 8]]
    ranked = dict(rank_placements(system, (2, 16), [], ChoiceOptions()))
    time = mesh.attributes["p2.predicted_time"].value.data  # type: ignore[attr-defined]
    assert time == pytest.approx(min(ranked.values()))
    assert ranked[ParallelismMatrix(((2, 1), (1, 16)))] > 4 * time


def test_system_from_the_mesh_cluster() -> None:
    """Without a system option the mesh's mesh.cluster is the system (no p2.system written),
    and synthesize-reductions finds it again."""
    cluster = (
        '  mesh.cluster @c {levels = [#mesh.level<"node" x 2, bandwidth = 1.0e+09, latency = '
        '1.0e-05, shared>, #mesh.level<"gpu" x 4, bandwidth = 1.0e+11, latency = 1.0e-06>], '
        "device_memory = 1.0e+10, peak_flops = 1.0e+12}\n"
    )
    text = _all_reduce((2, 4), (0,), block=(256, 256), extra=", cluster = @c")
    text = text.replace("builtin.module {\n", "builtin.module {\n" + cluster)
    out = _run("synthesize-placement,synthesize-reductions", text)
    mesh = _mesh(out)
    assert SYSTEM_ATTR not in mesh.attributes
    assert list(mesh.device_ids) != list(range(8))
    assert "sharding.all_reduce_program" in out


# --------------------------------------------------------------------------- reductions

ORACLE_CASES = [
    ((2, 4), (2, 4), (0, 1)),
    ((2, 4), (2, 4), (1,)),
    ((2, 4), (4, 2), (0,)),
    ((2, 2, 2), (2, 2, 2), (0, 1, 2)),
    ((2, 2, 2), (2, 2, 2), (0, 2)),
    ((2, 2, 2), (2, 4), (1,)),
]


@pytest.mark.parametrize(("cards", "shape", "axes"), ORACLE_CASES)
def test_rewritten_all_reduce_equals_the_plain_one(
    cards: tuple[int, ...], shape: tuple[int, ...], axes: tuple[int, ...]
) -> None:
    """Placement then reduction synthesis on a custom system; the rewritten module, run on
    the 8 CPU devices on random data, gives every device what the plain all-reduce gives."""
    block = (512, 129)  # 264 KB per device: bandwidth matters; 129 columns need padding
    name = "custom-" + "x".join(map(str, cards))
    text = _all_reduce(shape, axes, block=block)
    out = _run(f"synthesize-placement{{system={name}}},synthesize-reductions", text)
    assert "sharding.all_reduce " not in out
    module = parse_module(out)
    [op] = [o for o in main_function(module).body.walk() if isinstance(o, AllReduceProgramOp)]
    assert op.properties["program"].data  # type: ignore[attr-defined]
    plain = _all_reduce(shape, axes, block=block, devices=list(_mesh(out).device_ids))
    x = _random_input(shape, block, seed=len(axes))
    [want] = _execute(plain, x)
    [got] = _execute(out, x)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
    # and the plain all-reduce is what it should be: each device's block summed over its group
    blocks = x.reshape(*shape, *block)
    expected = np.broadcast_to(blocks.sum(axis=axes, keepdims=True), blocks.shape)
    np.testing.assert_allclose(want, expected.reshape(x.shape), rtol=1e-5, atol=1e-5)


def test_a_hierarchical_program_wins_on_a_slow_network() -> None:
    """On 2 nodes of 4 with a 100x slower network, all-reducing 1 MB per device over all 8
    devices is faster reduce-scattered inside the nodes first (P²'s point)."""
    out = _run(
        "synthesize-reductions{system=custom-2x4}",
        _all_reduce((2, 4), (0, 1), block=(256, 1024)),
    )
    op = next(
        o for o in main_function(parse_module(out)).body.walk() if isinstance(o, AllReduceProgramOp)
    )
    assert len(op.step_list) > 1
    assert op.step_list[0][0] == "ReduceScatter"
    system = custom_system((2, 4))
    plain = Simulator(system).allreduce_time(np.arange(8)[None, :], 256 * 1024 * 4)
    assert op.attributes["p2.predicted_time"].value.data < plain  # type: ignore[attr-defined]


def _program_text(steps: list[tuple[str, list[list[int]]]], order: object) -> str:
    parts = []
    for name, groups in steps:
        gs = ", ".join("[" + ", ".join(map(str, g)) + "]" for g in groups)
        parts.append(f"#sharding.step<{name} [{gs}]>")
    text = f"steps = [{', '.join(parts)}]"
    if order is not None:
        rows = ", ".join(f"array<i64: {', '.join(map(str, order[d]))}>" for d in range(8))  # type: ignore[index]
        text += f", chunk_order = [{rows}]"
    return text


def _axis_sets(rank: int) -> list[tuple[int, ...]]:
    return [a for r in range(1, rank + 1) for a in itertools.combinations(range(rank), r)]


# every synthesized program of every matrix (sums over the reduction-axis sets and matrices)
EVERY_PROGRAM_CASES = [((2, 4), 150, 6), ((2, 2, 2), 1542, 66)]


@pytest.mark.parametrize(("cards", "total", "uneven"), EVERY_PROGRAM_CASES)
def test_every_synthesized_program_runs_on_the_devices(
    cards: tuple[int, ...], total: int, uneven: int
) -> None:
    """Issue 6: every synthesized program of the hierarchy, for every non-empty set of
    reduction axes and every parallelism matrix, as ops of one module per matrix, run on the
    8 CPU devices on random data: each result equals the plain all-reduce over the reduction
    groups. ``uneven`` programs leave devices with different buffer sizes (run on full-size
    buffers); some end with permuted chunks."""
    system = custom_system(cards)
    counts = {"programs": 0, "uneven": 0, "permuted": 0}
    for axes in _axis_sets(len(cards)):
        axes_text = ", ".join(map(str, axes))
        for result in explore(system, cards, axes, ExploreOptions(simulate=False)):
            programs = [p.lowered for p in result.programs]
            counts["programs"] += len(programs)
            counts["uneven"] += sum(not spmd_executable(p, 8) for p in programs)
            counts["permuted"] += sum(p.chunk_order is not None for p in programs)
            body = "\n".join(
                f"    %{k} = sharding.all_reduce_program %x {{axes = array<i64: {axes_text}>, "
                f"{_program_text(p.to_steps(), p.device_chunk_order())}, "
                "sharding.specs = [SPEC]} : TY"
                for k, p in enumerate(programs)
            )
            devices = device_array(result.matrix).reshape(-1).tolist()
            results = ", ".join(f"%{k}" for k in range(len(programs)))
            text = _module(cards, body, devices=devices, results=results)
            x = _random_input(cards, (3, 5), seed=len(axes))
            blocks = x.reshape(*cards, 3, 5)
            want = np.broadcast_to(blocks.sum(axis=axes, keepdims=True), blocks.shape)
            want = want.reshape(x.shape)
            outs = _execute(text, x)
            for k, got in enumerate(outs):
                np.testing.assert_allclose(
                    got, want, rtol=1e-5, atol=1e-5, err_msg=f"{axes} {programs[k].instructions}"
                )
    assert counts["programs"] == total and counts["uneven"] == uneven
    assert counts["permuted"] > 0


def test_rewritten_module_prints_and_parses_back() -> None:
    out = _run(
        "synthesize-placement{system=custom-2x2x2},synthesize-reductions",
        _all_reduce((2, 2, 2), (0, 1, 2), block=(256, 1024)),
    )
    assert print_module(parse_module(out)) == out
    assert "#sharding.step<" in out


def test_max_all_reduce_and_size_one_axes_are_left_alone() -> None:
    body = (
        '    %0 = sharding.all_reduce %x {axes = array<i64: 1>, reduce = "max"} : TY\n'
        "    %1 = sharding.all_reduce %0 {axes = array<i64: 0>} : TY"
    )
    out = _run("synthesize-reductions{system=custom-8}", _module((1, 8), body, results="%1"))
    assert out.count("sharding.all_reduce %") == 2


@pytest.mark.parametrize("algorithm", ["ring", "tree"])
def test_best_program_is_the_fastest_as_executed(algorithm: str) -> None:
    """The pricer considers every synthesized program; its affine times equal the
    simulator's for the steps as executed (P²'s own times for programs that keep one buffer
    size, full-size all-reduces for the others), from latency-bound to bandwidth-bound
    sizes, and it picks the fastest."""
    system = get_system("gcp-v100-8x2")
    matrix = ParallelismMatrix(((2, 1), (1, 8)))
    pricer = ReductionPricer(system, algorithm, 5)
    sim = Simulator(system, algorithm)
    for nbytes in (64.0, 2.0**16, 2.0**26):
        lowered, time = pricer.best(matrix, (0, 1), nbytes)
        options = ExploreOptions(algorithm=algorithm, bytes_per_device=nbytes)
        [result] = [r for r in explore(system, (2, 8), (0, 1), options) if r.matrix == matrix]
        candidates = pricer.programs(matrix, (0, 1))
        assert len(candidates) == len(result.programs)
        assert any(not spmd_executable(p.lowered, 16) for p in result.programs)
        executed: dict[tuple[str, ...], float] = {}
        for p in result.programs:
            executed[p.instructions] = sim.program_time(executed_steps(p.lowered, 16), nbytes)
            if spmd_executable(p.lowered, 16):
                assert executed[p.instructions] == pytest.approx(p.time, rel=1e-9)
            else:  # full-size buffers move more than the program's real traffic
                assert p.time is not None and executed[p.instructions] >= p.time
        assert time == pytest.approx(executed[lowered.instructions], rel=1e-9)
        assert time == pytest.approx(min(executed.values()), rel=1e-9)


# --------------------------------------------------------------------------- bad input


def test_placement_refuses_modules_with_synthesized_reductions() -> None:
    rewritten = _run("synthesize-reductions{system=custom-2x4}", _all_reduce((2, 4), (0,)))
    with pytest.raises(AlpaError, match="run synthesize-placement before synthesize-reductions"):
        _run("synthesize-placement{system=custom-2x4}", rewritten)


@pytest.mark.parametrize(
    ("pipeline", "text", "message"),
    [
        (
            "synthesize-placement{system=custom-2x4}",
            _all_reduce((2, 2), (0,)),
            r"mesh @mesh of shape \[2, 2\] has 4 devices but system 'custom-2x4' has 8",
        ),
        (
            "synthesize-reductions{system=custom-2x4}",
            _all_reduce((2, 2), (0,)),
            "has 4 devices but system",
        ),
        (
            "synthesize-placement{system=custom-2x4}",
            _all_reduce((2, 4), (2,)),
            r"'sharding.all_reduce' does not verify: mesh axis 2 does not exist on the 2-d "
            r"mesh \[2, 4\]",
        ),
        (
            "synthesize-reductions{system=custom-2x4}",
            _all_reduce((2, 4), (0, 5)),
            "mesh axis 5 does not exist on the 2-d mesh",
        ),
        (
            "synthesize-placement{system=custom-2x4 max-size=0}",
            _all_reduce((2, 4), (0,)),
            "max-size 0 must be between 1 and 10",
        ),
        (
            "synthesize-reductions{system=custom-2x4 max-size=1000}",
            _all_reduce((2, 4), (0,)),
            "max-size 1000 must be between 1 and 10",
        ),
        ("synthesize-placement", _all_reduce((2, 4), (0,)), "no system for mesh @mesh"),
        ("synthesize-reductions{system=dgx}", _all_reduce((2, 4), (0,)), "unknown system 'dgx'"),
        (
            "synthesize-reductions{system=custom-2x4}",
            _all_reduce((2, 4), (0,), devices=[0, 2, 1, 3, 4, 5, 6, 7]),
            "device order of mesh @mesh is no placement",
        ),
    ],
)
def test_bad_input_is_a_one_line_error(pipeline: str, text: str, message: str) -> None:
    with pytest.raises(AlpaError, match=message) as info:
        _run(pipeline, text)
    assert "\n" not in str(info.value)


@pytest.mark.parametrize(
    ("steps", "message"),
    [
        ("steps = [#sharding.step<Gather [[0, 1]]>]", "unknown collective 'Gather'"),
        ("steps = [#sharding.step<AllReduce [[0, 1], [1, 2]]>]", "disjoint lists of device ids"),
        ("steps = []", "needs at least one step"),
        (
            "steps = [#sharding.step<AllReduce [[0, 1]]>], chunk_order = [array<i64: 0, 0>]",
            "every chunk order must permute 0..1",
        ),
    ],
)
def test_program_op_rejects_malformed_steps(steps: str, message: str) -> None:
    body = f"    %0 = sharding.all_reduce_program %x {{axes = array<i64: 1>, {steps}}} : TY"
    with pytest.raises(AlpaError, match=message):
        parse_module(_module((2, 4), body))


@pytest.mark.parametrize(
    ("steps", "message"),
    [
        ([("AllGather", [[0, 1]])], "gathers a chunk twice"),
        ([("ReduceScatter", [[0, 1]]), ("AllReduce", [[0, 2]])], "holding different chunks"),
        ([("ReduceScatter", [[0, 1, 2]])], "do not divide"),
        ([("ReduceScatter", [[0, 1]])], "does not end with every chunk"),
    ],
)
def test_full_size_path_rejects_steps_it_cannot_run(
    steps: list[tuple[str, list[list[int]]]], message: str
) -> None:
    """Steps that are no all-reduce on position-preserving buffers: a one-line error."""
    with pytest.raises(AlpaError, match=message):
        full_size_masks(steps, {d: d for d in range(8)}, 8)


def test_compiled_hlo_runs_the_program_steps_over_their_groups() -> None:
    """XLA compiles each step into one collective of its kind over its replica groups (in
    mesh positions: the placed mesh's devices are not in id order)."""
    block = (256, 1024)
    out = _run(
        "synthesize-placement{system=custom-2x4},synthesize-reductions",
        _all_reduce((2, 4), (0, 1), block=block, devices=[0, 1, 4, 5, 2, 3, 6, 7]),
    )
    module = parse_module(out)
    op = next(o for o in main_function(module).body.walk() if isinstance(o, AllReduceProgramOp))
    mesh_op = next(o for o in module.ops if isinstance(o, LogicalMeshOp))
    position = {d: k for k, d in enumerate(mesh_op.device_ids)}
    run, shardings = compile_spmd(
        module, main_function(module), jax_mesh(mesh_op), mesh_axis_names(mesh_op)
    )
    x = jax.device_put([_random_input((2, 4), block, 0)], list(shardings))
    records = hlo_collectives(run.lower(*x).compile().as_text())
    kinds = {
        "AllReduce": "all-reduce",
        "ReduceScatter": "reduce-scatter",
        "AllGather": "all-gather",
    }
    assert [r.kind for r in records] == [kinds[name] for name, _ in op.step_list]
    for record, (_, groups) in zip(records, op.step_list, strict=True):
        want = sorted(tuple(position[d] for d in g) for g in groups)
        assert sorted(record.replica_groups) == want


def test_predicted_wire_bytes_count_the_program_steps_as_compiled() -> None:
    """plan_bytes counts a synthesized all-reduce step by step: the bytes one device sends
    equal those of the collectives XLA compiled (a block not divisible by the group size is
    padded as the executor pads it)."""
    block = (255, 1023)
    out = _run(
        "synthesize-placement{system=custom-2x4},synthesize-reductions",
        _all_reduce((2, 4), (0, 1), block=block, devices=[0, 1, 4, 5, 2, 3, 6, 7]),
    )
    module = parse_module(out)
    function = main_function(module)
    op = next(o for o in function.body.walk() if isinstance(o, AllReduceProgramOp))
    assert len(op.step_list) > 1
    predicted = predicted_collectives(function, (2, 4))
    assert [c.kind for c in predicted] == [
        {"AllReduce": "all-reduce", "ReduceScatter": "reduce-scatter"}.get(name, "all-gather")
        for name, _ in op.step_list
    ]
    mesh_op = next(o for o in module.ops if isinstance(o, LogicalMeshOp))
    run, shardings = compile_spmd(module, function, jax_mesh(mesh_op), mesh_axis_names(mesh_op))
    x = jax.device_put([_random_input((2, 4), block, 0)], list(shardings))
    measured = total_wire_bytes(hlo_collectives(run.lower(*x).compile().as_text()), 8)
    assert sum(c.wire_bytes for c in predicted) == pytest.approx(measured)
    counted = predicted_collectives(function, (2, 4), frozenset([op]), num_micro_batches=3)
    assert sum(c.wire_bytes for c in counted) == pytest.approx(3 * measured)


def test_uneven_program_runs_as_full_size_all_reduces_as_predicted() -> None:
    """A program whose steps leave devices at different buffer sizes compiles to one
    all-reduce of the whole padded buffer per step, and plan_bytes predicts its wire bytes."""
    [result, *_] = explore(custom_system((2, 4)), (2, 4), (0, 1), ExploreOptions(simulate=False))
    lowered = next(p.lowered for p in result.programs if not spmd_executable(p.lowered, 8))
    block = (255, 1023)
    body = (
        "    %0 = sharding.all_reduce_program %x {axes = array<i64: 0, 1>, "
        f"{_program_text(lowered.to_steps(), lowered.device_chunk_order())}, "
        "sharding.specs = [SPEC]} : TY"
    )
    devices = device_array(result.matrix).reshape(-1).tolist()
    module = parse_module(_module((2, 4), body, block=block, devices=devices))
    function = main_function(module)
    [op] = [o for o in function.body.walk() if isinstance(o, AllReduceProgramOp)]
    assert not op.keeps_one_size(8)
    mesh_op = next(o for o in module.ops if isinstance(o, LogicalMeshOp))
    run, shardings = compile_spmd(module, function, jax_mesh(mesh_op), mesh_axis_names(mesh_op))
    x = jax.device_put([_random_input((2, 4), block, 0)], list(shardings))
    records = hlo_collectives(run.lower(*x).compile().as_text())
    assert {r.kind for r in records} == {"all-reduce"}
    predicted = predicted_collectives(function, (2, 4))
    assert len(predicted) == len(records) == len(op.step_list)
    measured = total_wire_bytes(records, 8)
    assert sum(c.wire_bytes for c in predicted) == pytest.approx(measured)


def test_alpa_opt_reports_a_bad_reduction_axis_in_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "bad-axis.mlir"
    path.write_text(_all_reduce((2, 4), (3,)))
    pipeline = "synthesize-reductions{system=custom-2x4}"
    code = alpa_opt_main([str(path), "-p", pipeline, "--reproducer-dir", str(tmp_path)])
    err = capsys.readouterr().err
    assert code == 1 and "Traceback" not in err
    assert err.splitlines()[0] == (  # refused by the verifier, located in the file
        f"alpa-opt: error: {path}:4:5: operation 'sharding.all_reduce' does not verify: "
        "mesh axis 3 does not exist on the 2-d mesh [2, 4]"
    )


def test_auto_sharded_training_step_with_p2_passes_equals_one_device() -> None:
    """End to end: an MLP training step, auto-sharded on a 2x4 mesh, placed and with its
    gradient all-reduces synthesized on 2 nodes of 4, runs on the 8 CPU devices and gives
    the single-device step's loss and parameters."""
    fn, args = tiny_step("mlp-tiny")
    module = import_jax(fn, *args, donate_argnums=(0,), batch_argnums=(1,))
    pipeline = (
        "builtin.module(merge-trivial-ops,auto-sharding{mesh-shape=2,4},"
        "synthesize-placement{system=custom-2x4},synthesize-reductions)"
    )
    PassManager(default_registry(), pipeline).run(module)
    text = print_module(module)
    assert "sharding.all_reduce_program" in text and "sharding.all_reduce " not in text
    parsed = parse_module(text)
    mesh_op = next(o for o in parsed.ops if isinstance(o, LogicalMeshOp))
    assert list(mesh_op.device_ids) != list(range(8))  # a placement other than row-major
    run, shardings = compile_spmd(
        parsed, main_function(parsed), jax_mesh(mesh_op), mesh_axis_names(mesh_op)
    )
    outs = run(*jax.device_put(jax.tree.leaves(args), list(shardings)))
    want = reference_outputs("mlp-tiny")
    got = jax.tree.unflatten(jax.tree.structure(want), list(outs))
    assert max_abs_diff(got, want) <= 1e-4
