"""Alpa's ``alpa.testing`` name (import alpa_ir.testing): a shim over
:mod:`alpa_ir.compat.testing`."""

from alpa_ir.compat.testing import assert_allclose

__all__ = ["assert_allclose"]
