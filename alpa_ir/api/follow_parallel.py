"""Methods that follow the plan of another parallelized step (Alpa's).

- :class:`CreateStateParallel` ``(train_step, other_args)``: the function that
  creates the training state runs so that every leaf of the state comes out
  where ``train_step`` reads it (its input shardings: the step's mesh and
  spec, or for a pipelined step the submesh and spec of the first stage that
  reads it), XLA's partitioner propagating the rest (as Alpa, which runs
  sharding propagation with the step's input specs as output shardings).
- :class:`FollowParallel` ``(src_func)``: a function of the parameters and a
  batch (an evaluation step) is planned on ``src_func``'s mesh, its
  arguments kept where ``src_func`` keeps the state's parameters and its batch
  (the ILP keeps those specs and plans the rest).

Both read ``src``'s executable when the following function is compiled.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import jax

from alpa_ir.api.manual_sharding import ManualShardingOption
from alpa_ir.api.shard_parallel import ShardParallel
from alpa_ir.api.sharded_executable import ShardedExecutable
from alpa_ir.errors import AlpaError


@dataclass(frozen=True)
class CreateStateParallel:
    """Create the state where ``train_step`` (a parallelized step taking the
    state first and ``other_args`` after it) reads it."""

    train_step: Any
    other_args: Any

    @property
    def num_micro_batches(self) -> None:
        return None


@dataclass(frozen=True)
class FollowParallel:
    """Plan a function of ``(params, batch)`` with its arguments where
    ``src_func``'s last executable keeps ``state.params`` and its batch
    (``get_input_placement_specs``: a function returning those two specs)."""

    src_func: Any
    num_micro_batches: int | None = None
    get_input_placement_specs: Callable[[], Any] | None = None
    pipeline_schedule: str = "inference"
    layer_option: str = "follow"


def _one_mesh(executable: Any, what: str) -> ShardedExecutable:
    if not isinstance(executable, ShardedExecutable):
        raise AlpaError(
            f"{what} follows a step of one mesh (ShardParallel and its family); the step's "
            f"executable is a {type(executable).__name__}"
        )
    return executable


def follow_method(method: FollowParallel) -> ShardParallel:
    """The ShardParallel method on ``src_func``'s mesh that keeps its parameters'
    and batch's specs. The followed function has no gradients to accumulate, so
    it runs its whole batch at once (the same result as micro-batches)."""
    src = _one_mesh(method.src_func.get_last_executable(), "FollowParallel")
    if method.get_input_placement_specs is not None:
        params, batch = method.get_input_placement_specs()
    else:
        state, batch = src.get_input_placement_specs()
        if not hasattr(state, "params"):
            raise AlpaError(
                "FollowParallel: the followed step's first argument has no .params; pass "
                "get_input_placement_specs"
            )
        params = state.params
    mesh = src.mesh
    return ShardParallel(
        devices=mesh,
        manual_sharding_option=ManualShardingOption(
            mesh.axis_names, in_axis_resources=(params, batch)
        ),
    )


class PlacedStateExecutable:
    """A state-creating function run by ``jax.jit`` with each leaf of its
    result constrained to where the train step reads it (XLA's partitioner
    propagates the rest, as Alpa's ``enable_auto_sharding=False``).
    ``placement``: the step's own placement of each leaf (its input placement
    specs for a one-mesh step, else its input shardings)."""

    def __init__(self, fn: Callable[..., Any], shardings: Sequence[Any], placement: Any) -> None:
        self.shardings, self.placement = list(shardings), placement

        def placed(*args: Any) -> Any:
            out = fn(*args)
            leaves = jax.tree.leaves(out)
            if len(leaves) != len(self.shardings):
                raise AlpaError(
                    f"CreateStateParallel: the function returns {len(leaves)} arrays, the train "
                    f"step's state has {len(self.shardings)}"
                )
            constrained = [
                jax.lax.with_sharding_constraint(x, s)
                for x, s in zip(leaves, self.shardings, strict=True)
            ]
            return jax.tree.unflatten(jax.tree.structure(out), constrained)

        one_mesh = len({frozenset(s.device_set) for s in self.shardings}) <= 1
        self.run = jax.jit(placed if one_mesh else fn)
        self.one_mesh = one_mesh

    def __call__(self, *args: Any) -> Any:
        out = self.run(*args)
        if self.one_mesh:
            return out
        # one program cannot place results on several meshes: each leaf is
        # put on its stage's submesh after it is created
        leaves = jax.device_put(jax.tree.leaves(out), self.shardings)
        return jax.tree.unflatten(jax.tree.structure(out), leaves)

    def get_output_placement_specs(self) -> Any:
        """Where each leaf of the state is put, as the train step places it."""
        return self.placement


def place_like(method: CreateStateParallel, fn: Callable[..., Any], args: Sequence[Any]) -> Any:
    """The executable that creates the state where ``method.train_step`` reads it."""
    state_avals = jax.eval_shape(fn, *args)
    executable = method.train_step.get_executable(state_avals, method.other_args)
    shardings = jax.tree.leaves(
        executable.get_input_shardings()[0], is_leaf=lambda x: isinstance(x, jax.sharding.Sharding)
    )
    if isinstance(executable, ShardedExecutable):
        placement = executable.get_input_placement_specs()[0]
    else:
        placement = executable.get_input_shardings()[0]
    return PlacedStateExecutable(fn, shardings, placement)


__all__ = ["CreateStateParallel", "FollowParallel", "follow_method", "place_like"]
