"""The instruction interpreter in one process (LocalTransport), without Ray:
per-mesh programs read from the IR or derived by emit-instructions run to the
single-device result, leave only the driver's buffers behind, and a broken
list is an error, never a hang."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import jax
import numpy as np
import pytest
from two_mesh_fixture import example_inputs, reference, two_mesh_module
from xdsl.dialects.builtin import ModuleOp

from alpa_ir.backends.spmd import compile_mesh_functions
from alpa_ir.errors import AlpaError
from alpa_ir.runtime.devices import local_devices_for
from alpa_ir.runtime.interpreter import (
    LocalTransport,
    MeshInterpreter,
    gather_outputs,
    run_interleaved,
    split_inputs,
)
from alpa_ir.runtime.program import StepProgram, step_program


def _interpreters(module: ModuleOp, program: StepProgram) -> list[MeshInterpreter]:
    transport = LocalTransport()
    out = []
    for mesh, info in program.meshes.items():
        jax_mesh, functions = compile_mesh_functions(
            module, program, mesh, local_devices_for(info.device_ids)
        )
        out.append(MeshInterpreter(program, mesh, jax_mesh, functions, transport))
    return out


def _run(program: StepProgram, interpreters: list[MeshInterpreter], flat: list[Any]) -> list[Any]:
    inputs = {mesh: split_inputs(program, flat, mesh) for mesh in program.meshes}
    return gather_outputs(program, flat, run_interleaved(interpreters, inputs))


@pytest.mark.parametrize("micro_batches", [1, 2, 3])
def test_two_meshes_equal_one_device(micro_batches: int) -> None:
    module = two_mesh_module(micro_batches=micro_batches)
    program = step_program(module)
    interpreters = _interpreters(module, program)
    x, w = example_inputs(micro_batches)
    new_w, y = _run(program, interpreters, [x, w])
    want_w, want_y = reference(x, w, micro_batches)
    np.testing.assert_allclose(y, want_y, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(new_w, want_w, rtol=1e-5, atol=1e-6)
    # the lists free every buffer they make: what is left are the driver's
    # arguments and the outputs
    left = {k for it in interpreters for k in it.buffers}
    assert {name for name, _ in left} <= {
        "main:0",
        "main:1",
        "stage0_apply_grad:0",
        "stage1_forward:0",
    }
    assert {k for k in left if k[0] == "stage1_forward:0"} == {("stage1_forward:0", None)}


def test_programs_read_from_the_ir_equal_the_emitted_ones() -> None:
    from alpa_ir.pipeline.program_emission import emit_programs

    emitted = emit_programs(two_mesh_module(passes="cross-mesh-resharding"))
    written = two_mesh_module()
    program = step_program(written)

    # one Instruction type: what the pass emits is what the runtime reads back
    assert {m: list(v) for m, v in program.instructions.items()} == emitted
    with pytest.raises(AlpaError, match=r"no pipeline.program.*run emit-instructions first"):
        step_program(two_mesh_module(passes="cross-mesh-resharding"))
    assert [str(i) for i in program.instructions["mesh1"]][:3] == [
        "RECV t0 mb=0",
        "BROADCAST t0 mb=0",
        "RUN stage1_forward mb=0",
    ]
    assert program.accumulated == {"stage1_forward:0"}
    x, w = example_inputs()
    new_w, _ = _run(program, _interpreters(written, program), [x, w])
    np.testing.assert_allclose(new_w, reference(x, w)[0], rtol=1e-5, atol=1e-6)


def test_whole_tensor_and_tile_plan_transports_agree() -> None:
    """A real outlined, auto-sharded step (meshes 1x4 and 2x2, 2 micro-batches):
    the interpreters with whole-tensor transfers (LocalTransport) compute what
    the executable's tile-plan transfers do, and what one device does."""
    from pipeshard_fixtures import _example, _step

    import alpa_ir
    from alpa_ir.api.pipeshard import ManualStageOption, PipeshardParallel
    from alpa_ir.passmanager.pass_manager import PassManager
    from alpa_ir.plugins.registry import default_registry

    state, batch = _example()
    method = PipeshardParallel(
        num_micro_batches=2, stage_option=ManualStageOption([[0], [1, 2]], [(1, 4), (2, 2)])
    )
    executable = alpa_ir.parallelize(_step, method=method).get_executable(state, batch)
    module = executable.module.clone()
    PassManager(default_registry(), "builtin.module(cross-mesh-resharding)").run(module)
    program = step_program(module)
    flat = jax.tree.leaves((state, batch))
    ours = _run(program, _interpreters(module, program), flat)
    theirs = jax.tree.leaves(executable(state, batch))
    single = jax.tree.leaves(jax.jit(_step)(state, batch))
    for a, b, c in zip(ours, theirs, single, strict=True):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
        np.testing.assert_allclose(np.asarray(a), np.asarray(c), rtol=1e-4, atol=1e-6)


def test_a_receive_without_its_send_is_a_deadlock_error() -> None:
    module = two_mesh_module()
    program = step_program(module)
    no_send = tuple(i for i in program.instructions["mesh0"] if i.kind != "send")
    broken = replace(program, instructions={**program.instructions, "mesh0": no_send})
    x, w = example_inputs()
    with pytest.raises(AlpaError, match=r"deadlock: @mesh0 at RECV t1, @mesh1 at RECV t0 mb=0"):
        _run(broken, _interpreters(module, broken), [x, w])


def test_a_crossing_value_without_transfer_is_an_error() -> None:
    with pytest.raises(AlpaError, match=r"stage0_forward:0.*cross-mesh-resharding"):
        step_program(two_mesh_module(passes=""))
