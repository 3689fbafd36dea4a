"""Cross-mesh transfers as one XLA program over both meshes, and the host
runtime that runs them, in this process on the 8 CPU devices.

The same programs run across processes on Ray hosts
(``tests/backends/test_multi_host.py``); here every device is local, so the
tests check what the program computes: the received array equals the sent
one in the plan's receive spec, for every spec pair of the cross-mesh plan
tests; PRNG keys move whole; the rounds of ``ppermute`` never send or
receive twice on one device; and a pipeline step run by
:class:`~alpa_ir.runtime.host_pipeline.HostPipeline` in the global order
equals the single-device step.
"""

from __future__ import annotations

import itertools

import jax
import numpy as np
import pytest
from cross_mesh_fixtures import EXEC_SPECS, ITEMSIZE, MESH_PAIRS, SHAPE, layouts, spec
from two_mesh_fixture import example_inputs, reference, two_mesh_module

from alpa_ir.backends.spmd import compile_mesh_functions
from alpa_ir.errors import AlpaError
from alpa_ir.pipeline.cross_mesh import MeshLayout, device_tiles, plan_transfer
from alpa_ir.pipeline.instructions import Instruction
from alpa_ir.runtime.collective_transfers import collective_transfer, pack_rounds
from alpa_ir.runtime.host_pipeline import (
    HostPipeline,
    Shards,
    assemble_shards,
    global_order,
    local_shards,
)
from alpa_ir.runtime.interpreter import gather_outputs, split_inputs
from alpa_ir.runtime.program import step_program
from alpa_ir.runtime.transfers import all_gather_program, layout_mesh, layout_sharding


def _devices() -> dict[int, jax.Device]:
    return dict(enumerate(jax.devices()))


def _names(layout: MeshLayout) -> tuple[str, ...]:
    return tuple(f"m{k}" for k in range(len(layout.mesh_shape)))


@pytest.mark.parametrize("pair", sorted(MESH_PAIRS))
def test_received_array_equals_sent(pair: str) -> None:
    """Every spec pair: the program delivers each destination device its tile
    of the receive spec; the destination's all-gather then gives the array."""
    x = np.arange(np.prod(SHAPE), dtype=np.float32).reshape(SHAPE)
    for src_text, dst_text in itertools.product(EXEC_SPECS, EXEC_SPECS):
        src, dst = layouts(pair, src_text, dst_text)
        plan = plan_transfer(SHAPE, ITEMSIZE, src, dst)
        move = collective_transfer(plan, _devices(), _names(src), _names(dst), np.float32)
        # the value need not arrive in the plan's source spec: it is laid out so first
        sent = jax.device_put(
            x, layout_sharding(MeshLayout(spec("R,R"), src.mesh_shape, src.devices))
        )
        got = move(sent)
        assert got is not None and got.sharding == layout_sharding(plan.recv_layout)
        tiles = device_tiles(SHAPE, plan.recv_layout)
        ids = {d: i for i, d in _devices().items()}
        for shard in got.addressable_shards:
            box = tiles[ids[shard.device]]
            np.testing.assert_array_equal(
                np.asarray(shard.data), x[tuple(slice(lo, hi) for lo, hi in box)]
            )
        if plan.gather:
            gather = all_gather_program(layout_mesh(dst), plan.recv_spec, dst.spec, plan.gather)
            got = gather(got)
        np.testing.assert_array_equal(np.asarray(got), x)


def test_rounds_send_and_receive_once_per_device() -> None:
    for pair, (src_text, dst_text) in itertools.product(
        sorted(MESH_PAIRS), itertools.product(EXEC_SPECS, EXEC_SPECS)
    ):
        src, dst = layouts(pair, src_text, dst_text)
        plan = plan_transfer(SHAPE, ITEMSIZE, src, dst, local_all_gather=False)
        rounds = pack_rounds(plan)
        pairs = [p for r in rounds for p in r]
        assert sorted(pairs) == sorted((s.src, d, s.box) for s in plan.sends for d in s.dsts)
        for r in rounds:
            assert len({s for s, _, _ in r}) == len(r) == len({d for _, d, _ in r})
            assert len({tuple(hi - lo for lo, hi in box) for _, _, box in r}) == 1


@pytest.mark.parametrize("typed", [True, False], ids=["typed", "raw"])
def test_a_prng_key_moves_whole(typed: bool) -> None:
    keys = jax.random.split(jax.random.key(7) if typed else jax.random.PRNGKey(7), 4)
    dtype = keys.dtype
    shape = keys.shape if typed else keys.shape[:1]
    src = MeshLayout(spec("R"), (1, 2), (0, 1))
    dst = MeshLayout(spec("R"), (2, 2), (4, 5, 6, 7))
    if not typed:  # raw keys are uint32 data; their plan covers both dims
        src = MeshLayout(spec("R,R"), (1, 2), (0, 1))
        dst = MeshLayout(spec("R,R"), (2, 2), (4, 5, 6, 7))
        shape = keys.shape
    plan = plan_transfer(shape, 4, src, dst)
    move = collective_transfer(plan, _devices(), ("m0", "m1"), ("m0", "m1"), dtype)
    got = move(jax.device_put(keys, layout_sharding(src)))
    assert got is not None and got.dtype == keys.dtype
    if plan.gather:
        got = all_gather_program(layout_mesh(dst), plan.recv_spec, dst.spec, plan.gather)(got)
    if typed:
        got, keys = jax.random.key_data(got), jax.random.key_data(keys)
    np.testing.assert_array_equal(np.asarray(got), np.asarray(keys))


def test_a_layout_with_unequal_tiles_is_refused() -> None:
    src = MeshLayout(spec("S1"), (1, 2), (0, 1))
    dst = MeshLayout(spec("R"), (1, 1), (2,))
    with pytest.raises(AlpaError, match="does not divide"):
        collective_transfer(
            plan_transfer((3,), 4, src, dst), _devices(), ("a", "b"), ("a", "b"), np.float32
        )


def test_the_global_order_runs_each_receive_after_its_send() -> None:
    program = step_program(two_mesh_module(micro_batches=3))
    order = global_order(program)
    assert sorted(order) == sorted(
        (m, k) for m, instructions in program.instructions.items() for k in range(len(instructions))
    )
    seen: set[tuple[str, int | None]] = set()
    for mesh, index in order:
        ins = program.instructions[mesh][index]
        if ins.kind == "send":
            seen.add((ins.target, ins.micro_batch))
        if ins.kind == "recv":
            assert (ins.target, ins.micro_batch) in seen
    for mesh in program.meshes:  # each mesh's list keeps its order
        mine = [k for m, k in order if m == mesh]
        assert mine == sorted(mine)


def test_a_deadlocked_order_is_an_error() -> None:
    program = step_program(two_mesh_module())
    first_recv = next(i for i in program.instructions["mesh1"] if i.kind == "recv")
    stuck = dict(program.instructions)
    stuck["mesh0"] = (Instruction("recv", first_recv.target, first_recv.micro_batch),)
    with pytest.raises(AlpaError, match="deadlock"):
        global_order(type(program)(**{**program.__dict__, "instructions": stuck}))


@pytest.mark.parametrize("micro_batches", [1, 3])
def test_a_host_pipeline_in_one_process_equals_one_device(micro_batches: int) -> None:
    module = two_mesh_module(mesh0=(0, 1, 2, 3), mesh1=(4, 5), micro_batches=micro_batches)
    program = step_program(module)
    host = HostPipeline(module, program, global_order(program), _devices(), compile_mesh_functions)
    assert sorted(host.interpreters) == ["mesh0", "mesh1"]
    for seed in (0, 1):
        x, w = example_inputs(micro_batches, seed=seed)
        flat = [x, w]
        inputs = {m: split_inputs(program, flat, m) for m in program.meshes}
        outputs, _ = host.run(inputs)
        values = {v: assemble_shards([shards]) for v, shards in outputs.items()}
        new_w, y = gather_outputs(program, flat, values)
        want_w, want_y = reference(x, w, micro_batches)
        np.testing.assert_allclose(y, want_y, rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(new_w, want_w, rtol=1e-5, atol=1e-6)


def test_shards_assemble_into_the_array() -> None:
    x = np.arange(24, dtype=np.float32).reshape(4, 6)
    layout = MeshLayout(spec("S0,S1"), (2, 2), (0, 1, 2, 3))
    array = jax.device_put(x, layout_sharding(layout))
    pieces = local_shards(array).pieces
    assert len(pieces) == 4
    halves = [Shards(pieces[:2]), Shards(pieces[2:])]
    np.testing.assert_array_equal(assemble_shards(halves), x)
    replicated = jax.device_put(x, layout_sharding(MeshLayout(spec("R,R"), (1, 2), (0, 1))))
    assert len(local_shards(replicated).pieces) == 1  # one copy of each box
    keys = jax.random.split(jax.random.key(1), 4)
    back = assemble_shards(
        [
            local_shards(
                jax.device_put(keys, layout_sharding(MeshLayout(spec("S0"), (1, 2), (0, 1))))
            )
        ]
    )
    assert back.dtype == keys.dtype
    np.testing.assert_array_equal(jax.random.key_data(back), jax.random.key_data(keys))
