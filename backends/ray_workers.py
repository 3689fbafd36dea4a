"""What both Ray runtimes share: waiting on a group of worker actors without
ever hanging, and stopping all of them at the first failure.

``RayWorkerGroup.wait`` collects one result per worker in short slices of
``ray.wait``: a worker that died (``RayActorError``) or raised, or a deadline
that passes, stops every worker of the group (a peer may be blocked on a
transfer or a collective that never completes) and is an
:class:`~alpa_ir.errors.AlpaError` naming the worker; later calls are refused.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import Any

from alpa_ir.errors import AlpaError

POLL_S = 0.5


def one_line(err: BaseException) -> str:
    text = str(err).strip()
    return text.splitlines()[0] if text else type(err).__name__


class RayWorkerGroup:
    """Named Ray actors of one executable (module docstring)."""

    group_name = "workers"
    """How the workers are called in an error: ``mesh workers``, ``host workers``."""

    def __init__(self, ray: Any) -> None:
        self.ray = ray
        self.workers: dict[str, Any] = {}
        self.broken = ""

    def short_name(self, key: str) -> str:
        """One worker in a list (``@mesh0``, ``host1 (10.0.0.2)``)."""
        return key

    def worker_name(self, key: str) -> str:
        """One worker in a sentence (``mesh worker of @mesh0``)."""
        return f"worker of {self.short_name(key)}"

    def wait(self, refs: Mapping[str, Any], timeout_s: float, what: str) -> dict[str, Any]:
        """The result per worker; the first failure (or the deadline) is an AlpaError."""
        from ray.exceptions import RayActorError, RayTaskError

        deadline = time.monotonic() + timeout_s
        key_of = {ref: key for key, ref in refs.items()}
        pending = list(refs.values())
        results: dict[str, Any] = {}
        while pending:
            left = deadline - time.monotonic()
            if left <= 0:
                late = ", ".join(self.short_name(key_of[r]) for r in pending)
                self.fail(f"{self.group_name} {late} did not {what} within {timeout_s:.0f} s")
            ready, pending = self.ray.wait(pending, num_returns=1, timeout=min(left, POLL_S))
            for ref in ready:
                key = key_of[ref]
                name = self.worker_name(key)
                try:
                    results[key] = self.ray.get(ref)
                except RayActorError as err:
                    self.fail(f"the {name} died (could not {what}): {one_line(err)}")
                except RayTaskError as err:
                    cause = err.cause if isinstance(err.cause, BaseException) else err
                    self.fail(f"the {name} failed to {what}: {one_line(cause)}")
        return results

    def fail(self, reason: str) -> None:
        self.broken = reason
        self.stop()
        raise AlpaError(reason)

    def check_usable(self) -> None:
        if self.broken:
            raise AlpaError(f"this executable's workers are stopped after an error: {self.broken}")

    def close(self) -> None:
        """Done with the workers: stop them (idempotent)."""
        self.stop()

    def stop(self) -> None:
        """Kill the workers (idempotent)."""
        for worker in self.workers.values():
            try:
                self.ray.kill(worker, no_restart=True)
            except Exception:  # already gone
                pass
        self.workers = {}
