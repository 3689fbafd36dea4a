"""Stage-mesh pairs costed in worker processes (``construct-stages``' cost
table, ``workers > 1``).

A cost table prices a few distinct functions (the layer ranges; identical
ones once) on many logical meshes, each pair independently: an ILP per pair
for the analytical model. The pairs are spread over ``workers`` processes:

* every worker is a fresh interpreter running this module
  (``python -m alpa_ir.costs.costing_workers FD``: no state of the parent,
  whose JAX runtime is multithreaded and must not be forked, and, unlike
  multiprocessing's ``spawn``, no re-import of the user's ``__main__``, so a
  script that plans with workers needs no ``if __name__ == "__main__":``
  guard), joined to the parent by a socket pair, and sent the cluster, a
  fresh copy of the stage cost model
  (:class:`~alpa_ir.costs.stage_cost.ParallelStageCostModel`) and the functions as
  op tables (:mod:`alpa_ir.ir.op_tables`; IR text where a table cannot hold
  one), which it rebuilds once;
* work goes out in *tasks*, one per logical mesh: all functions on that mesh,
  so that a worker plans every function of one mesh with the same
  strategies (the analytical model keeps them per mesh,
  :class:`alpa_ir.autosharding.graph.StrategyCache`); a worker that finishes
  a task gets the next one, largest meshes first;
* the parent is one of the ``workers``: it costs tasks from the start, while
  a thread starts the other ``workers - 1`` and serves them (a worker takes
  about 2 s to start; GPT-2 small's table is 6 tasks of 0.1 to 3 s);
* a caller that knows early that a large table is coming (``plan_pipeshard``,
  right after importing a large step) starts the workers ahead
  (:class:`StartedWorkers`, which the pass finds on its context): they import
  the compiler while the parent clusters the layers, and take tasks as soon
  as they have rebuilt the functions (GPT-2 small: the worker's first task
  0.15 s after the table begins; 1.3 s when the functions went as IR text);
* a failing pair raises its error, with the worker's message, in the parent;
  a worker that dies is named;
* a worker ends without the interpreter's teardown, which the parent would
  otherwise wait for at the end of the table (0.3 s on GPT-2 small).

The results are the same as costing in the parent, pair by pair.
"""

from __future__ import annotations

import gc
import multiprocessing
import multiprocessing.connection
import os
import subprocess
import sys
import threading
import traceback
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from xdsl.context import Context
from xdsl.dialects import func
from xdsl.dialects.builtin import ModuleOp

from alpa_ir.costs.stage_cost import ParallelStageCostModel, StageCost
from alpa_ir.errors import AlpaError
from alpa_ir.hardware.clusters import Cluster
from alpa_ir.hardware.device_mesh import LogicalDeviceMesh
from alpa_ir.ir.op_tables import NotTabulable, dump_op, load_op


class CostJobError(AlpaError):
    """A pair that could not be costed: the model's message and the job."""

    def __init__(self, message: str, job: CostJob | None) -> None:
        super().__init__(message)
        self.job = job


@dataclass(frozen=True)
class CostJob:
    """One pair: function ``function`` (an index into the functions given to
    :func:`cost_in_workers`) on ``mesh``."""

    function: int
    mesh: LogicalDeviceMesh
    param_args: tuple[int, ...]


def function_text(function: func.FuncOp) -> str:
    """``function`` as the IR text of a module of its own."""
    return str(ModuleOp([function.clone()]))


FunctionPayload = tuple[str, bytes | str]
"""A function as sent to a worker: ``("table", op table)`` or ``("text", IR text)``."""


def function_payload(function: func.FuncOp) -> FunctionPayload:
    """``function`` for a worker: its op table (:mod:`alpa_ir.ir.op_tables`, ten
    times faster to build and rebuild than text), or its IR text where a table
    cannot hold it."""
    try:
        return ("table", dump_op(function))
    except NotTabulable:
        return ("text", function_text(function))


def function_of_payload(payload: FunctionPayload, context: Context) -> func.FuncOp:
    """The function :func:`function_payload` sent, rebuilt in this process."""
    from alpa_ir.ir.text import parse_module

    kind, data = payload
    if kind == "table":
        function = load_op(data, context)  # type: ignore[arg-type]
    else:  # printed from a verified function by the compiler itself: not verified again
        function = parse_module(data, ctx=context, verify=False).body.block.first_op  # type: ignore[arg-type]
        assert function is not None
        function.detach()
    assert isinstance(function, func.FuncOp)
    return function


_Worker = tuple[subprocess.Popen[bytes], multiprocessing.connection.Connection]
"""A worker process and the parent's end of its socket pair."""


class StartedWorkers:
    """Worker processes started ahead of a cost table (module docstring),
    which :func:`cost_in_workers` takes before starting any of its own; those
    never taken are ended by :meth:`close` (or leaving the ``with`` block)."""

    def __init__(self, count: int) -> None:
        self._idle: list[_Worker] = []
        try:
            for _ in range(count):
                self._idle.append(_launch_worker())
        except BaseException:
            self.close()
            raise

    def __len__(self) -> int:
        return len(self._idle)

    def take(self, count: int) -> list[_Worker]:
        """Up to ``count`` of the started workers, now the caller's to end."""
        taken, self._idle = self._idle[:count], self._idle[count:]
        return taken

    def close(self) -> None:
        """End the workers nobody took (they are told that no work comes)."""
        idle, self._idle = self._idle, []
        for process, conn in idle:
            _end_worker(process, conn, served=False)  # maybe still importing: not waited for

    def __enter__(self) -> StartedWorkers:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def cost_in_workers(
    functions: Sequence[func.FuncOp],
    tasks: Sequence[Sequence[CostJob]],
    cluster: Cluster,
    model: ParallelStageCostModel,
    workers: int,
    on_done: Callable[[int], None] | None = None,
    started: StartedWorkers | None = None,
) -> list[list[StageCost]]:
    """The :meth:`~ParallelStageCostModel.keyed_cost` of every job of every
    task (in task order), computed by ``workers`` processes, this one among
    them: it costs tasks while the others start (taken from ``started``
    first); ``on_done(n)`` after each task with the number of jobs done so far."""
    queue = _TaskQueue(tasks, on_done)
    helpers = min(workers, len(tasks)) - 1
    dispatcher = None
    if helpers > 0:
        ready = started.take(helpers) if started is not None else []
        dispatcher = _Dispatcher(functions, cluster, model, helpers, queue, ready)
        dispatcher.start()
    local = model.worker_copy()
    try:
        while (index := queue.take()) is not None:
            queue.finish(index, [_keyed_cost(local, functions, cluster, j) for j in tasks[index]])
    finally:
        queue.close()  # on an error here: the other workers take nothing more
        if dispatcher is not None:
            dispatcher.join()
    if dispatcher is not None and dispatcher.error is not None:
        raise dispatcher.error
    return queue.results()


class _TaskQueue:
    """The tasks not yet taken (in the order given) and the results, shared
    by this process's costing and the thread that serves the workers."""

    def __init__(
        self, tasks: Sequence[Sequence[CostJob]], on_done: Callable[[int], None] | None
    ) -> None:
        self.tasks = tasks
        self._pending = list(range(len(tasks)))[::-1]  # pop() takes them in order
        self._results: list[list[StageCost] | None] = [None] * len(tasks)
        self._done = 0
        self._on_done = on_done
        self._lock = threading.Lock()

    def take(self) -> int | None:
        with self._lock:
            return self._pending.pop() if self._pending else None

    def finish(self, index: int, costs: list[StageCost]) -> None:
        with self._lock:
            self._results[index] = costs
            self._done += len(self.tasks[index])
            if self._on_done is not None:
                self._on_done(self._done)

    def close(self) -> None:
        with self._lock:
            self._pending.clear()

    def results(self) -> list[list[StageCost]]:
        return [r for r in self._results if r is not None]


class _Dispatcher(threading.Thread):
    """A thread that serves ``count`` worker processes (those of ``ready``,
    started already, and as many more as it starts) tasks from ``queue``
    until it is empty; the first error is kept in ``error``."""

    def __init__(
        self,
        functions: Sequence[func.FuncOp],
        cluster: Cluster,
        model: ParallelStageCostModel,
        count: int,
        queue: _TaskQueue,
        ready: Sequence[_Worker] = (),
    ) -> None:
        super().__init__(name="costing-workers", daemon=True)
        self.functions = functions
        self.cluster = cluster
        self.model = model
        self.count = count
        self.queue = queue
        self.ready = list(ready)
        self.error: Exception | None = None

    def run(self) -> None:
        processes = [process for process, _ in self.ready]
        connections = [conn for _, conn in self.ready]
        served: set[int] = set()  # workers that received a task
        try:
            for _ in range(self.count - len(self.ready)):
                process, parent_end = _launch_worker()
                processes.append(process)
                connections.append(parent_end)
            payloads = [function_payload(f) for f in self.functions]  # while the workers start
            setup = (self.model.worker_copy(), self.cluster, payloads)
            busy: dict[multiprocessing.connection.Connection, int] = {}
            for k, conn in enumerate(connections):
                conn.send(setup)
                if self._send_next(conn, busy):
                    served.add(k)
            while busy:
                for conn in multiprocessing.connection.wait(list(busy)):
                    assert isinstance(conn, multiprocessing.connection.Connection)
                    index = busy.pop(conn)
                    self.queue.finish(index, self._receive(conn, index, processes, connections))
                    self._send_next(conn, busy)
        except Exception as error:
            self.error = error
            self.queue.close()
        finally:
            for k, (process, conn) in enumerate(zip(processes, connections, strict=True)):
                _end_worker(process, conn, served=k in served)

    def _send_next(
        self,
        conn: multiprocessing.connection.Connection,
        busy: dict[multiprocessing.connection.Connection, int],
    ) -> bool:
        index = self.queue.take()
        if index is None:
            return False
        conn.send(list(self.queue.tasks[index]))
        busy[conn] = index
        return True

    def _receive(
        self,
        conn: multiprocessing.connection.Connection,
        index: int,
        processes: list[subprocess.Popen[bytes]],
        connections: list[multiprocessing.connection.Connection],
    ) -> list[StageCost]:
        task = self.queue.tasks[index]
        try:
            kind, payload = conn.recv()
        except EOFError:
            k = connections.index(conn)
            code = _wait(processes[k], 5)
            raise AlpaError(
                f"costing worker {k} died (exit code {code}) while costing "
                f"{len(task)} pairs on mesh {list(task[0].mesh.shape)}"
            ) from None
        if kind == "error":
            message, position = payload
            raise CostJobError(message, task[position] if position is not None else None)
        return list(payload)


def _launch_worker() -> _Worker:
    """A started worker that has the parent's ``sys.path`` (sent before anything
    that unpickles by module)."""
    process, conn = _start_worker()
    try:
        conn.send(sys.path)
    except BaseException:
        _end_worker(process, conn, served=False)
        raise
    return process, conn


def _end_worker(
    process: subprocess.Popen[bytes], conn: multiprocessing.connection.Connection, *, served: bool
) -> None:
    """Tell the worker that no more work comes and wait for it to end; one
    never ``served`` a task (maybe still starting) is terminated instead."""
    try:
        conn.send(None)
    except (BrokenPipeError, OSError):
        pass
    conn.close()
    if not served or _wait(process, 5) is None:
        process.terminate()
        process.wait()


def _start_worker() -> _Worker:
    """A worker interpreter (module docstring) and the parent's end of its socket pair."""
    parent_end, child_end = multiprocessing.Pipe()
    fd = child_end.fileno()
    process = subprocess.Popen(
        [sys.executable, "-m", "alpa_ir.costs.costing_workers", str(fd)],
        pass_fds=(fd,),
        stdin=subprocess.DEVNULL,
    )
    child_end.close()
    return process, parent_end


def _wait(process: subprocess.Popen[bytes], seconds: float) -> int | None:
    """The worker's exit code, or None if it is still running after ``seconds``."""
    try:
        return process.wait(timeout=seconds)
    except subprocess.TimeoutExpired:
        return None


def _worker_main(conn: multiprocessing.connection.Connection) -> None:
    """A worker's loop: receive the model, cluster and functions, rebuild the
    functions, then cost each task it receives until it receives ``None``."""
    from alpa_ir.ir.collection import use_planning_thresholds
    from alpa_ir.ir.context import make_context

    use_planning_thresholds()  # this process only plans
    try:
        sys.path[:] = conn.recv()  # the parent's: its models may live in its own modules
        setup = conn.recv()
    except EOFError:
        return
    if setup is None:  # the parent needed no task of this worker
        return
    model, cluster, payloads = setup
    try:
        context = make_context()
        functions = [function_of_payload(p, context) for p in payloads]
        gc.freeze()  # what this process keeps: its collections walk only what costing makes
    except Exception as error:  # the parent reports it; nothing is costed
        conn.send(("error", (f"costing worker: cannot read a function: {error}", None)))
        return
    while True:
        try:
            task = conn.recv()
        except EOFError:
            return
        if task is None:
            return
        try:
            costs = [_keyed_cost(model, functions, cluster, job) for job in task]
        except CostJobError as error:
            conn.send(("error", (str(error), task.index(error.job))))
            continue
        except Exception:
            conn.send(("error", ("costing worker failed:\n" + traceback.format_exc(), None)))
            continue
        conn.send(("ok", costs))


def _keyed_cost(
    model: Any, functions: Sequence[func.FuncOp], cluster: Cluster, job: CostJob
) -> StageCost:
    """The model's cost of one job; its :class:`AlpaError` as a :class:`CostJobError`."""
    try:
        return model.keyed_cost(functions[job.function], job.mesh, cluster, job.param_args)
    except AlpaError as error:
        raise CostJobError(str(error), job) from error


__all__ = [
    "CostJob",
    "CostJobError",
    "FunctionPayload",
    "StartedWorkers",
    "cost_in_workers",
    "function_of_payload",
    "function_payload",
    "function_text",
]

if __name__ == "__main__":  # a worker (module docstring): its socket's descriptor
    _worker_main(multiprocessing.connection.Connection(int(sys.argv[1])))
    # Ends without the interpreter's teardown (a third of a second with a
    # planner's heap, which the parent would wait for): nothing is left to save.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)
