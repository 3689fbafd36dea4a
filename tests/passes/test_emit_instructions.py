"""emit-instructions on a hand-built two-stage module: the per-mesh lists run to
completion with blocking receives (sends and receives pair up across meshes),
every buffer is freed exactly once right after its last use, the lists round-trip
through print -> parse, and bad input gives one-line errors."""

from __future__ import annotations

import pytest

from alpa_ir.dialects.pipeline import (
    BroadcastOp,
    FreeOp,
    ProgramOp,
    RecvOp,
    RunOp,
    SendOp,
    TransferOp,
)
from alpa_ir.errors import AlpaError
from alpa_ir.ir.module_utils import top_level_ops
from alpa_ir.ir.text import parse_module, print_module
from alpa_ir.passes.emit_instructions import EmitInstructions
from alpa_ir.pipeline.instructions import Instruction
from alpa_ir.pipeline.outlined_pipeline import needs_broadcast
from alpa_ir.pipeline.program_emission import emit_programs
from alpa_ir.pipeline.schedule import schedule_clocks

T = "tensor<2x4xf32>"

# Two stages of a training step. stage1 reads stage0's activation (transfer t0) in
# its forward and again in its backward; stage0's backward reads stage1's gradient
# (t1); stage1's apply-grad also reads a gradient accumulated on mesh0 (t2, once per
# step). The loss is returned (accumulated on mesh1), so are the new weights.
MODULE = f"""builtin.module {{
  mesh.logical_mesh @mesh0 {{shape = array<i64: 1, 2>, devices = array<i64: 0, 1>, alpha = array<f64: 1.0, 1.0>, beta = array<f64: 1.0, 1.0>}}
  mesh.logical_mesh @mesh1 {{shape = array<i64: 2, 1>, devices = array<i64: 2, 3>, alpha = array<f64: 1.0, 1.0>, beta = array<f64: 1.0, 1.0>}}
  pipeline.plan @plan {{stages = [@stage0, @stage1], num_micro_batches = 2, schedule = "1f1b"}}
  pipeline.stage @stage0 {{layers = array<i64: 0, 0>, mesh = @mesh0, forward = @stage0_forward, backward = @stage0_backward, apply_grad = @stage0_apply_grad}}
  pipeline.stage @stage1 {{layers = array<i64: 1, 1>, mesh = @mesh1, forward = @stage1_forward, backward = @stage1_backward, apply_grad = @stage1_apply_grad}}
  pipeline.transfer @t0 {{value = "stage0_forward:0", src_mesh = @mesh0, dst_mesh = @mesh1, src_spec = #sharding.spec<[S1, R]>, dst_spec = #sharding.spec<[R, R]>}}
  pipeline.transfer @t1 {{value = "stage1_backward:0", src_mesh = @mesh1, dst_mesh = @mesh0, src_spec = #sharding.spec<[S0, R]>, dst_spec = #sharding.spec<[S1, R]>}}
  pipeline.transfer @t2 {{value = "stage0_backward:1", src_mesh = @mesh0, dst_mesh = @mesh1, src_spec = #sharding.spec<[R, R]>, dst_spec = #sharding.spec<[S0, R]>}}
  func.func @stage0_forward(%w: {T}, %x: {T}) -> ({T}, {T}) attributes {{mesh.mesh = @mesh0}} {{
    func.return %x, %x : {T}, {T}
  }}
  func.func @stage1_forward(%h: {T}, %w: {T}, %y: {T}) -> ({T}, {T}) attributes {{mesh.mesh = @mesh1}} {{
    func.return %h, %y : {T}, {T}
  }}
  func.func @stage1_backward(%a: {T}, %h: {T}, %w: {T}) -> ({T}, {T}) attributes {{mesh.mesh = @mesh1}} {{
    func.return %a, %h : {T}, {T}
  }}
  func.func @stage0_backward(%g: {T}, %x: {T}) -> ({T}, {T}) attributes {{mesh.mesh = @mesh0}} {{
    func.return %g, %x : {T}, {T}
  }}
  func.func @stage0_apply_grad(%w: {T}, %g: {T}) -> {T} attributes {{mesh.mesh = @mesh0}} {{
    func.return %g : {T}
  }}
  func.func @stage1_apply_grad(%w: {T}, %g: {T}, %tied: {T}) -> {T} attributes {{mesh.mesh = @mesh1}} {{
    func.return %g : {T}
  }}
  func.func @main(%w0: {T}, %w1: {T}, %x: {T}, %y: {T}) -> ({T}, {T}, {T}) {{
    %a:2 = func.call @stage0_forward(%w0, %x) : ({T}, {T}) -> ({T}, {T})
    %b:2 = func.call @stage1_forward(%a#0, %w1, %y) : ({T}, {T}, {T}) -> ({T}, {T})
    %c:2 = func.call @stage1_backward(%b#1, %a#0, %w1) : ({T}, {T}, {T}) -> ({T}, {T})
    %d:2 = func.call @stage0_backward(%c#0, %a#1) : ({T}, {T}) -> ({T}, {T})
    %e = func.call @stage0_apply_grad(%w0, %d#0) : ({T}, {T}) -> {T}
    %f = func.call @stage1_apply_grad(%w1, %c#1, %d#1) : ({T}, {T}, {T}) -> {T}
    func.return %e, %f, %b#0 : {T}, {T}, {T}
  }}
}}"""

# Written by hand, independently of the pass: the buffers each run reads and writes
# (name, per micro-batch?), and the buffers that are outputs of the step.
TOUCHES: dict[str, list[tuple[str, bool]]] = {
    "stage0_forward": [("stage0_forward:0", True), ("stage0_forward:1", True)],
    "stage1_forward": [("t0", True), ("stage1_forward:0", False), ("stage1_forward:1", True)],
    "stage1_backward": [
        ("stage1_forward:1", True),
        ("t0", True),
        ("stage1_backward:0", True),
        ("stage1_backward:1", False),
    ],
    "stage0_backward": [
        ("t1", True),
        ("stage0_forward:1", True),
        ("stage0_backward:0", False),
        ("stage0_backward:1", False),
    ],
    "stage0_apply_grad": [("stage0_backward:0", False), ("stage0_apply_grad:0", False)],
    "stage1_apply_grad": [
        ("stage1_backward:1", False),
        ("t2", False),
        ("stage1_apply_grad:0", False),
    ],
}
OUTPUTS = {("stage0_apply_grad:0", None), ("stage1_apply_grad:0", None), ("stage1_forward:0", None)}


def _module(num_micro_batches: int = 2, schedule: str = "1f1b", drop: str = "") -> str:
    text = MODULE.replace("num_micro_batches = 2", f"num_micro_batches = {num_micro_batches}")
    text = text.replace('schedule = "1f1b"', f'schedule = "{schedule}"')
    return "\n".join(line for line in text.splitlines() if not drop or drop not in line)


def _lists(module_text: str, pipeline: EmitInstructions | None = None) -> dict[str, list]:  # type: ignore[type-arg]
    """Run the pass; each mesh's instructions as ``(kind, target, micro_batch, buffers)``."""
    module = parse_module(module_text)
    (pipeline or EmitInstructions()).apply(None, module)  # type: ignore[arg-type]
    lists = {}
    for prog in top_level_ops(module, ProgramOp):
        assert isinstance(prog, ProgramOp)
        rows = []
        for op in prog.body.block.ops:
            mb = op.properties.get("micro_batch")
            mb = None if mb is None else mb.value.data  # type: ignore[attr-defined]
            if isinstance(op, RunOp):
                rows.append(("run", op.function.root_reference.data, mb, ()))
            elif isinstance(op, FreeOp):
                rows.append(("free", "", mb, tuple(b.data for b in op.buffers.data)))
            else:
                kind = {SendOp: "send", RecvOp: "recv", BroadcastOp: "broadcast"}[type(op)]
                rows.append((kind, op.transfer.root_reference.data, mb, ()))  # type: ignore[attr-defined]
        lists[prog.mesh.root_reference.data] = rows
    return lists


def _transfers(module_text: str) -> dict[str, TransferOp]:
    module = parse_module(module_text)
    return {op.sym_name.data: op for op in top_level_ops(module, TransferOp)}  # type: ignore[attr-defined]


def simulate(lists: dict[str, list], transfers: dict[str, TransferOp]) -> int:  # type: ignore[type-arg]
    """Run the lists: a send never blocks, a receive waits for its send. Returns the
    number of rounds; fails on a deadlock or a send/receive on the wrong mesh."""
    pc = dict.fromkeys(lists, 0)
    sent: set[tuple[str, int | None]] = set()
    received: set[tuple[str, int | None]] = set()
    rounds = 0
    while any(pc[m] < len(lists[m]) for m in lists):
        rounds += 1
        progressed = False
        for mesh, rows in lists.items():
            while pc[mesh] < len(rows):
                kind, target, mb, _ = rows[pc[mesh]]
                if kind == "send":
                    assert transfers[target].src_mesh.root_reference.data == mesh
                    assert (target, mb) not in sent, f"{target}[{mb}] sent twice"
                    sent.add((target, mb))
                elif kind == "recv":
                    assert transfers[target].dst_mesh.root_reference.data == mesh
                    if (target, mb) not in sent:
                        break  # blocks
                    assert (target, mb) not in received, f"{target}[{mb}] received twice"
                    received.add((target, mb))
                pc[mesh] += 1
                progressed = True
        assert progressed, f"deadlock at {pc}"
    assert sent == received, f"sent but never received: {sent - received}"
    return rounds


def check_buffers(lists: dict[str, list], transfers: dict[str, TransferOp]) -> None:  # type: ignore[type-arg]
    """Every buffer touched on a mesh is freed exactly once, right after its last use
    (only frees in between), and never touched after; the step's outputs are kept."""
    for rows in lists.values():
        touched: dict[tuple[str, int | None], int] = {}
        freed: dict[tuple[str, int | None], int] = {}
        for at, (kind, target, mb, buffers) in enumerate(rows):
            if kind == "free":
                for name in buffers:
                    buf = (name, mb)
                    assert buf not in freed, f"{buf} freed twice"
                    assert buf in touched, f"{buf} freed but never used"
                    assert all(r[0] == "free" for r in rows[touched[buf] + 1 : at]), (
                        f"{buf} freed late"
                    )
                    freed[buf] = at
                continue
            if kind == "run":
                bufs = [(n, mb if per_mb else None) for n, per_mb in TOUCHES[target]]
            elif kind == "send":
                bufs = [(transfers[target].value.data, mb)]
            else:
                bufs = [(target, mb)]
            for buf in bufs:
                assert buf not in freed, f"{buf} used after its free"
                touched[buf] = at
        assert set(freed) == set(touched) - OUTPUTS
        assert not (set(freed) & OUTPUTS)


@pytest.mark.parametrize("schedule", ["1f1b", "gpipe"])
@pytest.mark.parametrize("num_micro_batches", [1, 2, 3, 5])
def test_lists_complete_and_free_every_buffer_once(schedule: str, num_micro_batches: int) -> None:
    text = _module(num_micro_batches, schedule)
    lists = _lists(text)
    transfers = _transfers(text)
    assert list(lists) == ["mesh0", "mesh1"]
    simulate(lists, transfers)
    check_buffers(lists, transfers)
    # each function runs once per micro-batch, apply-grad once; per-micro-batch
    # transfers move once per micro-batch, t2 (read by apply-grad) once per step
    runs = [(r[1], r[2]) for rows in lists.values() for r in rows if r[0] == "run"]
    for fn in TOUCHES:
        mbs = sorted(mb for f, mb in runs if f == fn)
        assert mbs == ([None] if "apply_grad" in fn else list(range(num_micro_batches)))
    sends = sorted((r[1], str(r[2])) for r in lists["mesh0"] + lists["mesh1"] if r[0] == "send")
    assert sends == sorted(
        [(t, str(b)) for t in ("t0", "t1") for b in range(num_micro_batches)] + [("t2", "None")]
    )


@pytest.mark.parametrize("schedule", ["1f1b", "gpipe"])
def test_runs_follow_the_schedule(schedule: str) -> None:
    lists = _lists(_module(3, schedule))
    clocks = schedule_clocks(2, 3, schedule)  # type: ignore[arg-type]
    for s, mesh in enumerate(["mesh0", "mesh1"]):
        expected = [
            (f"stage{s}_{t.phase}", t.micro_batch) for c in clocks for t in c if t.stage == s
        ]
        assert [(r[1], r[2]) for r in lists[mesh] if r[0] == "run"] == expected


def test_mesh0_list_under_1f1b() -> None:
    rows = [r for r in _lists(_module())["mesh0"]]
    assert rows == [
        ("run", "stage0_forward", 0, ()),
        ("send", "t0", 0, ()),
        ("free", "", 0, ("stage0_forward:0",)),
        ("run", "stage0_forward", 1, ()),
        ("send", "t0", 1, ()),
        ("free", "", 1, ("stage0_forward:0",)),
        ("recv", "t1", 0, ()),
        ("run", "stage0_backward", 0, ()),
        ("free", "", 0, ("stage0_forward:1", "t1")),
        ("recv", "t1", 1, ()),
        ("run", "stage0_backward", 1, ()),
        ("free", "", 1, ("stage0_forward:1", "t1")),
        ("send", "t2", None, ()),
        ("free", "", None, ("stage0_backward:1",)),
        ("run", "stage0_apply_grad", None, ()),
        ("free", "", None, ("stage0_backward:0",)),
    ]


def test_receive_once_per_micro_batch_and_broadcast() -> None:
    rows = _lists(_module())["mesh1"]
    # t0 is read by the forward and the backward: received once per micro-batch,
    # all-gathered after the receive (dst [R, R] replicates mesh1's axis 0 of size 2)
    assert [(r[0], r[2]) for r in rows if r[1] == "t0"] == [
        ("recv", 0),
        ("broadcast", 0),
        ("recv", 1),
        ("broadcast", 1),
    ]
    t0_frees = [r[2] for r in rows if r[0] == "free" and "t0" in r[3]]
    assert t0_frees == [0, 1]
    last_backward = max(i for i, r in enumerate(rows) if r[:3] == ("run", "stage1_backward", 0))
    assert ("free", "", 0) == rows[last_backward + 1][:3] and "t0" in rows[last_backward + 1][3]
    # t2 is received once, right before the apply-grad, not broadcast ([S0, R])
    assert rows[-3:-1] == [("recv", "t2", None, ()), ("run", "stage1_apply_grad", None, ())]


def test_round_trip_and_schedule_option() -> None:
    module = parse_module(_module(3))
    EmitInstructions(schedule="gpipe").apply(None, module)  # type: ignore[arg-type]
    text = print_module(module)
    assert 'schedule = "gpipe"' in text
    assert "    pipeline.run {function = @stage0_forward, micro_batch = 0}\n" in text
    assert print_module(parse_module(text)) == text
    # running again replaces the programs
    again = parse_module(text)
    EmitInstructions().apply(None, again)  # type: ignore[arg-type]
    assert print_module(again) == text
    assert len(list(top_level_ops(again, ProgramOp))) == 2


def test_schedules_differ_in_what_mesh0_holds() -> None:
    """Under GPipe stage0 keeps every micro-batch's residual until the backwards;
    under 1F1B at most 2 (its in-flight bound)."""

    def peak(rows: list) -> int:  # type: ignore[type-arg]
        live, most = 0, 0
        for kind, target, _, buffers in rows:
            if kind == "run" and target == "stage0_forward":
                live += 1
            live -= sum(1 for b in buffers if b == "stage0_forward:1")
            most = max(most, live)
        return most

    assert peak(_lists(_module(5, "gpipe"))["mesh0"]) == 5
    assert peak(_lists(_module(5, "1f1b"))["mesh0"]) == 2


def test_broadcast_rule_is_replaceable() -> None:
    module = parse_module(_module())
    programs = emit_programs(module, broadcast=lambda transfer, module: False)
    assert not any(i.kind == "broadcast" for rows in programs.values() for i in rows)
    programs = emit_programs(module, broadcast=lambda transfer, module: True)
    recvs = [i for rows in programs.values() for i in rows if i.kind == "recv"]
    broadcasts = [i for rows in programs.values() for i in rows if i.kind == "broadcast"]
    assert [(i.target, i.micro_batch) for i in recvs] == [
        (i.target, i.micro_batch) for i in broadcasts
    ]
    assert Instruction("recv", "t2", None) in recvs


@pytest.mark.parametrize(
    ("src", "dst", "src_shape", "dst_shape", "expected"),
    [
        ("[S1, R]", "[R, R]", (1, 2), (2, 1), True),  # dst replicates axis 0, src has size 1
        ("[S0, R]", "[S1, R]", (2, 1), (1, 2), False),  # dst uses its only axis > 1
        ("[R, R]", "[R, R]", (2, 2), (2, 2), False),  # src replicated alike
        ("[S0, R]", "[S0, R]", (2, 2), (2, 2), False),  # both replicate axis 1 only
        ("[S0, R]", "[R, R]", (2, 2), (2, 2), True),  # dst replicates axis 0 too
        ("[S0, S1]", "[S0, R]", (2, 2), (2, 2), True),  # dst replicates axis 1, src not
        ("[S0, R]", "[R, R]", (4,), (2, 2), True),  # the src mesh lacks axis 1
    ],
)
def test_needs_broadcast(
    src: str,
    dst: str,
    src_shape: tuple[int, ...],
    dst_shape: tuple[int, ...],
    expected: bool,
) -> None:
    def mesh(name: str, shape: tuple[int, ...], first: int) -> str:
        n = 1
        for s in shape:
            n *= s
        ints = ", ".join(str(first + d) for d in range(n))
        ones = ", ".join("1.0" for _ in shape)
        dims = ", ".join(map(str, shape))
        return (
            f"  mesh.logical_mesh @{name} {{shape = array<i64: {dims}>, devices = array<i64: "
            f"{ints}>, alpha = array<f64: {ones}>, beta = array<f64: {ones}>}}"
        )

    text = "\n".join(
        [
            "builtin.module {",
            mesh("a", src_shape, 0),
            mesh("b", dst_shape, 8),
            f'  pipeline.transfer @t {{value = "f:0", src_mesh = @a, dst_mesh = @b, '
            f"src_spec = #sharding.spec<{src}>, dst_spec = #sharding.spec<{dst}>}}",
            "}",
        ]
    )
    module = parse_module(text)
    [transfer] = top_level_ops(module, TransferOp)
    assert isinstance(transfer, TransferOp)
    assert needs_broadcast(transfer, module) is expected


def test_transfer_chosen_by_the_consumer_spec() -> None:
    text = _module().replace(
        f"func.func @stage1_apply_grad(%w: {T}, %g: {T}, %tied: {T})",
        f"func.func @stage1_apply_grad(%w: {T}, %g: {T}, %tied: {T} "
        "{sharding.spec = #sharding.spec<[S0, R]>})",
    )
    extra = (
        '  pipeline.transfer @t3 {value = "stage0_backward:1", src_mesh = @mesh0, '
        "dst_mesh = @mesh1, src_spec = #sharding.spec<[R, R]>, dst_spec = #sharding.spec<[R, R]>}"
    )
    lines = text.splitlines()
    lines.insert(8, extra)
    rows = _lists("\n".join(lines))["mesh1"]
    assert ("recv", "t2", None, ()) in rows and not any(r[1] == "t3" for r in rows)


def test_a_later_apply_grad_round_reads_another_stages_apply_grad() -> None:
    """A global gradient norm: stage 0's apply-grad result (its partial) is sent
    once, after that function runs, to stage 1's apply-grad, which receives it
    before it runs; every mesh runs its apply-grad functions in @main's order."""
    text = _module().replace(
        "%f = func.call @stage1_apply_grad(%w1,", "%f = func.call @stage1_apply_grad(%e,"
    )
    extra = (
        '  pipeline.transfer @t9 {value = "stage0_apply_grad:0", src_mesh = @mesh0, '
        "dst_mesh = @mesh1, src_spec = #sharding.spec<[R, R]>, dst_spec = #sharding.spec<[R, R]>}"
    )
    lines = text.splitlines()
    lines.insert(8, extra)
    lists = _lists("\n".join(lines))
    mesh0 = [r[:3] for r in lists["mesh0"]]
    mesh1 = [r[:3] for r in lists["mesh1"]]
    assert mesh0.index(("send", "t9", None)) > mesh0.index(("run", "stage0_apply_grad", None))
    assert mesh1.index(("recv", "t9", None)) < mesh1.index(("run", "stage1_apply_grad", None))


@pytest.mark.parametrize(
    ("text", "message"),
    [
        (
            _module(drop="pipeline.transfer @t1"),
            'value "stage1_backward:0" read by @stage0_backward crosses from @mesh1 to @mesh0 '
            "but no pipeline.transfer carries it (run cross-mesh-resharding first)",
        ),
        (
            _module().replace("mesh = @mesh1, forward", "mesh = @mesh0, forward"),
            "@stage1_forward runs on @mesh1 but its stage @stage1 is on @mesh0",
        ),
        (
            _module().replace(
                "%f = func.call @stage1_apply_grad(%w1,", "%f = func.call @stage1_apply_grad(%e,"
            ),
            'value "stage0_apply_grad:0" read by @stage1_apply_grad crosses from @mesh0 to '
            "@mesh1 but no pipeline.transfer carries it (run cross-mesh-resharding first)",
        ),
        (
            _module()
            .replace("pipeline.plan @plan", "pipeline.plan @plan2")
            .replace(
                "builtin.module {",
                'builtin.module {\n  pipeline.plan @plan {stages = [@stage0], num_micro_batches = 1, schedule = "gpipe"}',
            ),
            "expected one pipeline.plan, found 2",
        ),
        (
            _module().replace(
                "attributes {mesh.mesh = @mesh0} {\n    func.return %x, %x",
                "attributes {mesh.mesh = @mesh1} {\n    func.return %x, %x",
            ),
            "@stage0_forward runs on @mesh1 but its stage @stage0 is on @mesh0",
        ),
    ],
)
def test_bad_input(text: str, message: str) -> None:
    module = parse_module(text)
    with pytest.raises(AlpaError) as info:
        EmitInstructions().apply(None, module)  # type: ignore[arg-type]
    assert str(info.value) == f"emit-instructions: {message}"


def test_reading_an_operand_produced_later_is_rejected() -> None:
    # stage0's forward reads stage1's forward result: no schedule can run that
    text = _module()
    text = text.replace(
        f"func.func @stage0_forward(%w: {T}, %x: {T})",
        f"func.func @stage0_forward(%w: {T}, %x: {T}, %z: {T})",
    )
    text = text.replace(
        f"%a:2 = func.call @stage0_forward(%w0, %x) : ({T}, {T})",
        f"%z:2 = func.call @stage1_forward(%x, %w1, %y) : ({T}, {T}, {T}) -> ({T}, {T})\n"
        + f"    %a:2 = func.call @stage0_forward(%w0, %x, %z#1) : ({T}, {T}, {T})",
    )
    text = (
        text.replace(
            f"    %b:2 = func.call @stage1_forward(%a#0, %w1, %y) : ({T}, {T}, {T}) -> ({T}, {T})\n",
            "",
        )
        .replace("%b#1", "%z#1")
        .replace("%b#0", "%z#0")
    )
    module = parse_module(text)
    with pytest.raises(AlpaError, match="runs @stage0_forward no later than @stage1_forward"):
        EmitInstructions().apply(None, module)  # type: ignore[arg-type]


@pytest.mark.parametrize("schedule", ["1f1b", "gpipe"])
def test_on_an_outlined_and_resharded_pipeshard_step(schedule: str) -> None:
    """The outliner's output (two stages on 1x4 and 2x2, auto-sharded, the last stage's
    backward inside its forward) after cross-mesh-resharding: the lists complete, every
    buffer is freed once, and a transfer is all-gathered exactly when its plan says so."""
    import jax
    import jax.numpy as jnp

    import alpa_ir
    from alpa_ir.api.pipeshard import ManualStageOption, PipeshardParallel
    from alpa_ir.frontend.markers import mark_pipeline_boundary
    from alpa_ir.passes.cross_mesh_resharding import CrossMeshResharding
    from alpa_ir.pipeline.transfer_attrs import RECV_SPEC_ATTR

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
    method = PipeshardParallel(devices=list(range(8)), num_micro_batches=3, stage_option=stages)
    step_fn = alpa_ir.parallelize(step, method=method, batch_argnums=(1,))
    module = step_fn.get_executable(params, jnp.ones((12, 16))).module
    CrossMeshResharding().apply(None, module)  # type: ignore[arg-type]
    text = print_module(module)
    lists = _lists(text, EmitInstructions(schedule=schedule))  # type: ignore[arg-type]
    transfers = _transfers(text)
    assert transfers and simulate(lists, transfers) > 1
    for t, op in transfers.items():
        dst = lists[op.dst_mesh.root_reference.data]
        recvs = [r[2] for r in dst if r[:2] == ("recv", t)]
        assert recvs == [0, 1, 2]
        broadcasts = [r[2] for r in dst if r[:2] == ("broadcast", t)]
        assert broadcasts == (recvs if RECV_SPEC_ATTR in op.attributes else [])
    for rows in lists.values():
        frees = [(name, r[2]) for r in rows if r[0] == "free" for name in r[3]]
        assert len(frees) == len(set(frees))
        received = {(r[1], r[2]) for r in rows if r[0] == "recv"}
        assert received <= set(frees)
