"""Progress of long work (stage-mesh costing, ILP solves, benchmark suites),
drawn with ``rich`` on stderr when it is a terminal, and nothing otherwise
(logs, pipes, tests) or when disabled (``--quiet``, ``progress=false``)."""

from __future__ import annotations

import sys
import threading
from types import TracebackType
from typing import IO, Any


def _console(stream: IO[str] | None, force_terminal: bool | None) -> Any:
    from rich.console import Console

    return Console(file=stream or sys.stderr, force_terminal=force_terminal)


class ProgressBar:
    """A bar for ``total`` steps of ``label``, as a context manager."""

    def __init__(
        self,
        label: str,
        total: int,
        *,
        enabled: bool = True,
        stream: IO[str] | None = None,
        force_terminal: bool | None = None,
    ) -> None:
        self.label, self.total = label, total
        self._progress: Any = None
        self._task: Any = None
        if not enabled:
            return
        console = _console(stream, force_terminal)
        if not console.is_terminal:
            return
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TimeElapsedColumn

        self._progress = Progress(
            "[progress.description]{task.description}",
            BarColumn(),
            MofNCompleteColumn(),
            TimeElapsedColumn(),
            console=console,
            transient=False,
        )

    @property
    def shown(self) -> bool:
        return self._progress is not None

    def __enter__(self) -> ProgressBar:
        if self._progress is not None:
            self._progress.start()
            self._task = self._progress.add_task(self.label, total=self.total)
        return self

    def update(self, completed: int, label: str | None = None, total: int | None = None) -> None:
        if total is not None:
            self.total = total
        if self._progress is not None:
            extra: dict[str, Any] = {} if label is None else {"description": label}
            if total is not None:
                extra["total"] = total
            self._progress.update(self._task, completed=completed, **extra)

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        trace: TracebackType | None,
    ) -> None:
        if self._progress is not None:
            self._progress.stop()


class Spinner:
    """A transient spinner with ``label`` while a block runs, shown only once
    the block has run ``delay`` seconds (an ILP solve that takes a while)."""

    def __init__(
        self,
        label: str,
        *,
        delay: float = 2.0,
        enabled: bool = True,
        stream: IO[str] | None = None,
        force_terminal: bool | None = None,
    ) -> None:
        self._status: Any = None
        self._timer: threading.Timer | None = None
        if enabled:
            console = _console(stream, force_terminal)
            if console.is_terminal:
                self._status = console.status(label)
                self._timer = threading.Timer(delay, self._status.start)
                self._timer.daemon = True

    def __enter__(self) -> Spinner:
        if self._timer is not None:
            self._timer.start()
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        trace: TracebackType | None,
    ) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer.join()
            self._status.stop()
