"""Alpa's ``set_seed(seed)``: the random numbers of parallelized steps follow one seed.

In Alpa, ``set_seed`` seeds the stateful generator of every device: each call
of a parallelized step then draws new numbers, and setting the same seed again
draws the same numbers again, whichever step draws them first. Here, after
``set_seed(seed)``, every call of a step parallelized with a method of its own
(``ShardParallel`` and its family, ``PipeshardParallel``) is the step with each
draw's key folded with ``seed`` and the call's number
(:mod:`alpa_ir.frontend.session_keys`); the count starts at 0 at every
``set_seed`` and is shared by all steps, as Alpa's generator is. The step is
compiled once: the seed and the number are one more argument, a ``uint32[2]``
word, last (its spec is the last of ``get_input_placement_specs()``).

Before any ``set_seed`` a step draws with the keys it is given, so that every
plan draws what one device draws with them (JAX's rule). Alpa's stateful
generator also ignores the keys (two draws with one key differ); here a key
still names one stream within a call, so a remat recomputes the same mask.

The seed is kept with Alpa's ``global_config`` (``runtime_random_seed``, the
field Alpa's ``set_seed`` writes): the one object Alpa's users configure a
session with. Steps that follow another (``FollowParallel``,
``CreateStateParallel``) draw with their keys.
"""

from __future__ import annotations

from alpa_ir.api.global_config import global_config


def set_seed(seed: int | None) -> None:
    """Seed the random numbers of parallelized steps (module doc); an integer.
    ``None`` (not Alpa's) ends it: steps draw with their keys alone again."""
    global_config.seed_draws(seed)


__all__ = ["set_seed"]
