"""``alpa_ir.train``: a training loop that checkpoints and survives a lost host.

    state, losses = alpa_ir.train(
        train_step, state, lambda i: batches[i],
        method=alpa_ir.ShardParallel(), num_steps=8,
        checkpoint_dir="ckpt", checkpoint_every=2,
    )

Step ``i`` (0-based) runs ``step(state, batch_fn(i))``, which returns
``(state, loss)``: the data order is the step index, so a replayed step sees
the same batch. After every ``checkpoint_every`` steps, and after the last,
the state is saved to ``checkpoint_dir`` (:func:`~alpa_ir.save_checkpoint`,
the step count as its step; the directory keeps the latest). A call that
finds a committed step there resumes from it: the same path restarts a run
on another cluster, and a longer ``num_steps`` continues one.

When a step fails because a host worker died (a Ray node lost), the loop
waits until Ray reports which hosts of the plan are gone
(:class:`RecoveryOption`), plans the same
method again on the devices that remain (a method without a fixed device
list plans for what is there: fewer replicas or stages), restores the last
committed checkpoint onto the new plan, replays from its step and says so in
one log line (logger ``alpa_ir.train``, level WARNING)::

    alpa_ir.train: lost host1 (127.0.0.1) at step 5; re-planned ShardParallel on 4 devices; resumed from checkpoint step 4

The new plan's hosts form a new JAX world: the failed executable's workers
are stopped with it, and the new one starts its own (one actor per remaining
host, ``jax.distributed`` among them). Every step's effect comes from the
checkpoint or from one run of it, never two: no step is lost or applied
twice. A host lost while a plan is made or its workers start is survived
the same way. A worker that died on a node that stays is started again on
the same hosts (``lost a host worker``); any other failure of a step (every
host still there after ``lost_host_timeout_s``, or a local backend) is
raised as it is.

The given state is never donated (it is what a replay before the first
checkpoint starts from, and the template checkpoints are restored by), so a
step holds two states at its peak.
"""

from __future__ import annotations

import logging
import math
import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from alpa_ir.api.checkpoint import (
    latest_step,
    read_manifest,
    restore_checkpoint,
    save_checkpoint,
)
from alpa_ir.api.lost_hosts import (
    plan_devices,
    plan_hosts,
    session_hosts,
    wait_for_lost_hosts,
    worker_died,
)
from alpa_ir.api.parallel import parallelize
from alpa_ir.api.pipeshard import PipeshardParallel
from alpa_ir.api.shard_parallel import ManualShardParallel, ShardParallel
from alpa_ir.errors import AlpaError
from alpa_ir.runtime.ray_cluster import Host

LOG = logging.getLogger("alpa_ir.train")


@dataclass(frozen=True)
class RecoveryOption:
    """How ``train`` recovers from a lost host."""

    max_recoveries: int = 3
    """Lost hosts survived in one call; one more failure is raised."""
    lost_host_timeout_s: float = 60.0
    """How long to wait, after the plan's workers failed, for Ray to report a
    node of theirs gone (Ray's health checks take about 15 s by default). When
    none is by then, a dead worker is started again on the same hosts (the
    worker died, not its node) and any other failure is raised."""

    def __post_init__(self) -> None:
        if isinstance(self.max_recoveries, bool) or not isinstance(self.max_recoveries, int):
            raise AlpaError(
                f"RecoveryOption: max_recoveries must be an int, got {self.max_recoveries!r}"
            )
        if self.max_recoveries < 0:
            raise AlpaError(
                f"RecoveryOption: max_recoveries must be >= 0, got {self.max_recoveries}"
            )
        if not isinstance(self.lost_host_timeout_s, int | float) or not (
            self.lost_host_timeout_s >= 0
        ):
            raise AlpaError(
                "RecoveryOption: lost_host_timeout_s must be a number >= 0, got "
                f"{self.lost_host_timeout_s!r}"
            )


def train(
    step: Callable[[Any, Any], Any],
    state: Any,
    batch_fn: Callable[[int], Any],
    *,
    method: Any,
    num_steps: int,
    checkpoint_dir: str | os.PathLike[str],
    checkpoint_every: int,
    recovery: RecoveryOption = RecoveryOption(),
) -> tuple[Any, list[float]]:
    """Run ``step`` for steps ``0 .. num_steps - 1`` (module docstring).
    Returns the final state and one loss per step (``nan`` for the steps an
    earlier call ran, whose state came from the checkpoint)."""
    _check_arguments(step, batch_fn, method, num_steps, checkpoint_every, recovery)
    where = Path(checkpoint_dir)
    start = _committed_step(where)
    if start is not None and start > num_steps:
        raise AlpaError(
            f"alpa_ir.train: checkpoint {where} is at step {start}, past num_steps={num_steps}"
        )
    run = _Run(step, state, batch_fn, method, where, recovery)
    if start is not None:
        LOG.info("alpa_ir.train: resuming from checkpoint step %d in %s", start, where)
        run.restore_at = run.committed = start
        if start == num_steps:  # nothing left to run, nothing to plan
            return restore_checkpoint(where, target=state), run.losses(num_steps)
    try:
        run.loop(start or 0, num_steps, checkpoint_every)
    finally:
        run.close()
    return run.state, run.losses(num_steps)


def _check_arguments(
    step: Any,
    batch_fn: Any,
    method: Any,
    num_steps: Any,
    checkpoint_every: Any,
    recovery: Any,
) -> None:
    for name, value in (("num_steps", num_steps), ("checkpoint_every", checkpoint_every)):
        if isinstance(value, bool) or not isinstance(value, int | np.integer):
            raise AlpaError(f"alpa_ir.train: {name} must be an int, got {value!r}")
        if value <= 0:
            raise AlpaError(f"alpa_ir.train: {name} must be >= 1, got {value}")
    if not callable(step):
        raise AlpaError(f"alpa_ir.train: step must be callable, got {step!r}")
    if not callable(batch_fn):
        raise AlpaError(
            f"alpa_ir.train: batch_fn must be callable (step -> batch), got {batch_fn!r}"
        )
    if not isinstance(method, ShardParallel | ManualShardParallel | PipeshardParallel):
        raise AlpaError(
            "alpa_ir.train: method must be a parallel method (ShardParallel(), "
            f"PipeshardParallel(...), ...), got {method!r}"
        )
    if not isinstance(recovery, RecoveryOption):
        raise AlpaError(f"alpa_ir.train: recovery must be a RecoveryOption, got {recovery!r}")


def _committed_step(where: Path) -> int | None:
    """The step of the checkpoint committed in ``where``; None where there is
    none yet (no directory, or no committed step in it: a first save killed
    before its commit leaves only a temporary folder)."""
    if not where.exists():
        return None
    if not where.is_dir():
        raise AlpaError(f"alpa_ir.train: checkpoint_dir {where} exists and is not a directory")
    if latest_step(where) is None:
        return None
    saved = read_manifest(where).get("step")
    if isinstance(saved, bool) or not isinstance(saved, int) or saved < 0:
        raise AlpaError(
            f"alpa_ir.train: checkpoint {where} records no step count (step {saved!r}); "
            "it was not written by alpa_ir.train"
        )
    return saved


class _Run:
    """One call's loop: the current plan, state, losses and last commit."""

    def __init__(
        self,
        step: Callable[[Any, Any], Any],
        state: Any,
        batch_fn: Callable[[int], Any],
        method: Any,
        where: Path,
        recovery: RecoveryOption,
    ) -> None:
        self.step, self.batch_fn, self.method = step, batch_fn, method
        self.where, self.recovery = where, recovery
        self.initial = state
        """The given state: the template a checkpoint is restored by, and the
        state to replay from while nothing is committed (never donated)."""
        self.state = state
        self.committed = 0
        self.restore_at: int | None = None
        """Set after a failure or on resume: restore this committed step
        onto the next plan before running."""
        self.lost_note = ""
        self.recoveries = 0
        self.parallel: Any = None
        self.executable: Any = None
        self.planned_on: list[Host] = []
        """The Ray hosts there were when the current plan began."""
        self.loss_of: dict[int, float] = {}

    def loop(self, start: int, num_steps: int, every: int) -> None:
        i = start
        while i < num_steps:
            batch = self.batch(i)
            try:
                if self.executable is None:
                    self.plan(batch)
                out = self.parallel(self.state, batch)
            except AlpaError as err:
                i = self.recover(err, i)
                continue
            self.state, self.loss_of[i] = self.split(out, i)
            i += 1
            if i % every == 0 or i == num_steps:
                save_checkpoint(self.where, self.state, step=i, overwrite=True)
                self.committed = i

    def batch(self, i: int) -> Any:
        try:
            return self.batch_fn(i)
        except Exception as err:
            raise AlpaError(
                f"alpa_ir.train: batch_fn({i}) raised {type(err).__name__}: {_first_line(err)}"
            ) from err

    def plan(self, batch: Any) -> None:
        """Plan the method for the devices there are now, then restore the
        pending checkpoint onto the plan."""
        self.planned_on = session_hosts(self.method)
        self.parallel = parallelize(self.step, method=self.method, donate_argnums=())
        self.executable = self.parallel.get_executable(self.initial, batch)
        if self.restore_at is None:
            return
        step = self.restore_at
        if step == 0:
            self.state, source = self.initial, "the initial state (step 0)"
        else:
            self.state = restore_checkpoint(self.where, target=self.placement())
            source = f"checkpoint step {step}"
        if self.lost_note:
            LOG.warning(
                "alpa_ir.train: %s; re-planned %s on %d devices; resumed from %s",
                self.lost_note,
                type(self.method).__name__,
                plan_devices(self.executable),
                source,
            )
        self.restore_at, self.lost_note = None, ""

    def placement(self) -> Any:
        """The restore target: the plan's own input placement where it runs in
        this process; on Ray hosts (which take whole arrays) the given state's."""
        if getattr(self.executable, "remote", None) is None:
            return self.executable
        return self.initial

    def recover(self, err: AlpaError, i: int) -> int:
        """After step ``i`` failed: the step to go on from, the plan dropped;
        ``err`` again when the failure lost neither a host nor a worker.

        A lost host shows first as a dead worker (Ray's actor error) or as
        its peer's failed collective, whichever the driver hears first; both
        stop the plan's workers. Either way the plan's hosts are watched for
        up to ``lost_host_timeout_s`` for one to leave the cluster. A dead
        worker whose node stays is started again on the same hosts; any
        other failure with every host still there is raised as it was.
        A plan that failed to start (a host lost while it was planned, or
        while its workers started) is one when a host it was planned on is
        gone: at once, or after a dead worker, within the timeout."""
        died = worker_died(err)
        if self.executable is None:  # failed while planning or starting
            hosts, timeout = self.planned_on, self.recovery.lost_host_timeout_s if died else 0.0
        else:
            remote = getattr(self.executable, "remote", None)
            if not getattr(remote, "broken", ""):
                raise err  # not a failure of the plan's workers
            hosts, timeout = plan_hosts(self.executable), self.recovery.lost_host_timeout_s
        if not hosts:
            raise err
        self.close()
        lost = wait_for_lost_hosts(hosts, timeout)
        if not lost and not died:
            raise err
        if self.recoveries >= self.recovery.max_recoveries:
            raise AlpaError(
                f"alpa_ir.train: step {i} failed after {self.recoveries} recoveries "
                f"(RecoveryOption.max_recoveries): {err}"
            ) from err
        self.recoveries += 1
        what = ", ".join(h.name for h in lost) if lost else "a host worker"
        self.lost_note = f"lost {what} at step {i}"
        self.restore_at = self.committed
        return self.committed

    def split(self, out: Any, i: int) -> tuple[Any, float]:
        if not (isinstance(out, tuple | list) and len(out) == 2):
            raise AlpaError(
                f"alpa_ir.train: step {i}: step must return (state, loss), got {type(out).__name__}"
            )
        state, loss = out
        try:
            value = float(np.asarray(loss))
        except (TypeError, ValueError):
            raise AlpaError(
                f"alpa_ir.train: step {i}: the loss must be a scalar, got shape {np.shape(loss)}"
            ) from None
        return state, value

    def losses(self, num_steps: int) -> list[float]:
        return [self.loss_of.get(i, math.nan) for i in range(num_steps)]

    def close(self) -> None:
        """Stop the plan's workers (Ray hosts); idempotent."""
        close = getattr(self.executable, "close", None)
        if close is not None:
            close()
        self.parallel = self.executable = None


def _first_line(err: BaseException) -> str:
    text = str(err).strip()
    return text.splitlines()[0] if text else "(no message)"
