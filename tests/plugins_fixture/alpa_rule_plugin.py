"""A plugin that contributes a sharding rule for its own primitive ``row_scale``
(each row scaled by its own factor: pointwise, so every dimension may be split)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from alpa_ir.autosharding.rules import elementwise
from alpa_ir.plugins.hookspecs import hookimpl


@hookimpl
def alpa_ir_sharding_rules() -> Mapping[str, Any]:
    return {"row_scale": elementwise}
