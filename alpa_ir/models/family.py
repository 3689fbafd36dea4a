"""What every model family provides to the generic train-step factory.

A family (mlp, gpt, moe, wresnet, bert) is a frozen record of pure functions on
its config, so that ``make_train_step``, ``param_count`` and
``train_step_flops`` are written once and a new family is one more record.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import jax

from alpa_ir.errors import AlpaError

Batch = dict[str, jax.Array]
Variables = dict[str, Any]


@dataclass(frozen=True)
class ModelFamily:
    """The functions a model family contributes.

    ``init(config, key, batch)`` returns the Flax variables (``{"params": ...}``
    and, for batch-norm models, ``{"batch_stats": ...}``).
    ``loss(config, variables, batch)`` returns ``(scalar loss, updated
    non-param collections)``; the second item is ``{}`` for stateless models.
    ``make_batch(config, key)`` draws a deterministic random batch.
    ``flops(config)`` is the analytic FLOP count of one training step.
    """

    name: str
    config_type: type
    init: Callable[[Any, jax.Array, Batch], Variables]
    loss: Callable[[Any, Variables, Batch], tuple[jax.Array, Variables]]
    make_batch: Callable[[Any, jax.Array], Batch]
    flops: Callable[[Any], float]


def require(condition: bool, message: str) -> None:
    """Raise a one-line AlpaError when a config is inconsistent."""
    if not condition:
        raise AlpaError(message)
