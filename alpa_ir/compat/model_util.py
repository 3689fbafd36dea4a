"""Alpa's ``alpa.model.model_util.TrainState``: Flax's ``TrainState`` with an
optional float32 master copy of float16 parameters (mixed precision) and a
slot for a dynamic loss scale."""

from __future__ import annotations

from typing import Any

import flax
import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax.training import train_state


class TrainState(train_state.TrainState):  # type: ignore[misc]
    """As Flax's, plus ``master_copy`` (float32 parameters the optimizer
    updates while ``params`` are their float16 copy; None without mixed
    precision) and ``dynamic_scale`` (a ``flax.training.dynamic_scale``
    ``DynamicScale``, or None), as Alpa's."""

    master_copy: Any = flax.struct.field(default=None)
    dynamic_scale: Any = flax.struct.field(default=None)

    def apply_gradients(self, *, grads: Any, **kwargs: Any) -> TrainState:
        """One optimizer update of the master copy (or of ``params`` without
        one); ``step`` + 1 and ``kwargs`` replaced, as Flax's."""
        master = self.params if self.master_copy is None else self.master_copy
        updates, opt_state = self.tx.update(grads, self.opt_state, master)
        new_master = optax.apply_updates(master, updates)
        if self.master_copy is None:
            params, master_copy = new_master, None
        else:
            params = jax.tree.map(lambda x: jnp.asarray(x, jnp.float16), new_master)
            master_copy = new_master
        return self.replace(  # type: ignore[no-any-return]
            step=self.step + 1,
            params=params,
            master_copy=master_copy,
            opt_state=opt_state,
            **kwargs,
        )

    @classmethod
    def create(
        cls,
        *,
        apply_fn: Any,
        params: Any,
        tx: optax.GradientTransformation,
        use_master_copy: bool = False,
        **kwargs: Any,
    ) -> TrainState:
        """A state at step 0 with the optimizer's state initialised; with
        ``use_master_copy`` the parameters are kept as float16 and their
        float32 master copy is what the optimizer updates."""
        if use_master_copy:
            master_copy = jax.tree.map(lambda x: jnp.asarray(x, jnp.float32), params)
            params = jax.tree.map(lambda x: jnp.asarray(x, jnp.float16), params)
            opt_state = tx.init(master_copy)
        else:
            master_copy, opt_state = None, tx.init(params)
        return cls(
            step=np.array(0, dtype=np.int32),
            apply_fn=apply_fn,
            params=params,
            master_copy=master_copy,
            tx=tx,
            opt_state=opt_state,
            **kwargs,
        )


__all__ = ["TrainState"]
