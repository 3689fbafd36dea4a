"""Layer markers of a bf16 step: their values are floating point, so their
backward mirrors carry their cotangents (numpy calls bfloat16's kind "V")."""

from __future__ import annotations

from xdsl.dialects.builtin import BFloat16Type, Float32Type, IntegerType, TensorType

from alpa_ir.pipeline.stage_assignment import _is_float


def test_bf16_f32_are_float_and_int_is_not() -> None:
    assert _is_float(TensorType(BFloat16Type(), [4, 2]))
    assert _is_float(TensorType(Float32Type(), [4]))
    assert not _is_float(TensorType(IntegerType(32), [4]))
    assert not _is_float(object())
