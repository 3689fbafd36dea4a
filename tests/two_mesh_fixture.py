"""A hand-built outlined pipeline module on two meshes, and its reference.

``stage0_forward`` (a matmul) runs on ``@mesh0``, ``stage1_forward`` (a tanh)
on ``@mesh1``, and ``stage0_apply_grad`` on ``@mesh0`` reads the tanh's
output accumulated over the micro-batches: one value crosses per
micro-batch and one per step, in opposite directions.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
from xdsl.dialects.builtin import ModuleOp

import alpa_ir
from alpa_ir.passmanager.pass_manager import PassManager
from alpa_ir.plugins.registry import default_registry

ROWS = 4
"""Rows of one micro-batch."""


def _mesh(name: str, devices: Sequence[int]) -> str:
    ids = ", ".join(str(d) for d in devices)
    return (
        f"mesh.logical_mesh @{name} {{shape = array<i64: 1, {len(devices)}>, "
        f"devices = array<i64: {ids}>, alpha = array<f64: 1.0, 1.0>, beta = array<f64: 1.0, 0.1>}}"
    )


def module_text(
    mesh0: Sequence[int] = (0, 1), mesh1: Sequence[int] = (2, 3), micro_batches: int = 2
) -> str:
    x, w = f"tensor<{ROWS}x2xf32>", "tensor<2x2xf32>"
    dot = "#lax.dot<lhs_contracting = [{}], rhs_contracting = [0], lhs_batch = [], rhs_batch = []>"
    return f"""builtin.module {{
  {_mesh("mesh0", mesh0)}
  {_mesh("mesh1", mesh1)}
  pipeline.plan @plan {{stages = [@stage0, @stage1], num_micro_batches = {micro_batches}, schedule = "gpipe"}}
  pipeline.stage @stage0 {{layers = array<i64: 0, 0>, mesh = @mesh0, forward = @stage0_forward, apply_grad = @stage0_apply_grad}}
  pipeline.stage @stage1 {{layers = array<i64: 1, 1>, mesh = @mesh1, forward = @stage1_forward}}
  func.func @stage0_forward(%x: {x}, %w: {w}) -> {x} attributes {{mesh.mesh = @mesh0}} {{
    %h = lax.dot_general %x, %w {{dimension_numbers = {dot.format(1)}, preferred_element_type = f32}} : ({x}, {w}) -> {x}
    func.return %h : {x}
  }}
  func.func @stage1_forward(%h: {x}) -> {x} attributes {{mesh.mesh = @mesh1}} {{
    %y = lax.tanh %h : ({x}) -> {x}
    func.return %y : {x}
  }}
  func.func @stage0_apply_grad(%w: {w}, %y: {x}) -> {w} attributes {{mesh.mesh = @mesh0}} {{
    %g = lax.dot_general %y, %y {{dimension_numbers = {dot.format(0)}, preferred_element_type = f32}} : ({x}, {x}) -> {w}
    %nw = lax.sub %w, %g : ({w}, {w}) -> {w}
    func.return %nw : {w}
  }}
  func.func @main(%x: {x}, %w: {w}) -> ({w}, {x}) attributes {{alpa.batch_args = array<i64: 0>}} {{
    %h = func.call @stage0_forward(%x, %w) : ({x}, {w}) -> {x}
    %y = func.call @stage1_forward(%h) : ({x}) -> {x}
    %nw = func.call @stage0_apply_grad(%w, %y) : ({w}, {x}) -> {w}
    func.return %nw, %y : {w}, {x}
  }}
}}
"""


def two_mesh_module(
    mesh0: Sequence[int] = (0, 1),
    mesh1: Sequence[int] = (2, 3),
    micro_batches: int = 2,
    passes: str = "cross-mesh-resharding,emit-instructions",
) -> ModuleOp:
    """The module after ``passes`` (its transfers and instruction lists)."""
    module = alpa_ir.parse_module(module_text(mesh0, mesh1, micro_batches))
    PassManager(default_registry(), f"builtin.module({passes})").run(module)
    return module


def example_inputs(micro_batches: int = 2, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((micro_batches * ROWS, 2)).astype(np.float32)
    w = rng.standard_normal((2, 2)).astype(np.float32)
    return x, w


def reference(
    x: np.ndarray, w: np.ndarray, micro_batches: int = 2
) -> tuple[np.ndarray, np.ndarray]:
    """The step on one device: new w and the mean of tanh over the micro-batches."""
    ys = [np.tanh(part @ w) for part in np.split(x, micro_batches)]
    y = sum(ys) / micro_batches
    return w - y.T @ y, y
