"""The pass manager: runs a pipeline of passes on a module, MLIR style.

After each pass it verifies the module (an error names the pass that broke
it), times the pass, and prints the IR before or after the passes asked for,
under MLIR's header ``// -----// IR Dump After NAME //----- //``. When a pass
raises, it writes a reproducer (the pass's input module and the pipeline that
re-runs it, see :mod:`alpa_ir.passmanager.reproducer`) and raises
:class:`~alpa_ir.errors.PassFailure` naming the pass, the error and the file;
an :class:`~alpa_ir.errors.AlpaError` raised by a pass is already a user error
and passes through unchanged, with the reproducer path added as a note.

The module is copied once per run, before the first pass, not before every
pass: a failing pass's input is made again when needed by replaying the
passes before it on that copy (passes are deterministic; where the replay
fails or differs, the reproducer is the copy and the pipeline up to the
failing pass, as MLIR's pipeline-level reproducer). ``verify_each="end"``
verifies once after the last pass; a module that fails then is replayed
with verification after each pass to name the pass that broke it. Planning
large models, the per-pass copies and verifications took a fifth of the time.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Literal, TextIO

from xdsl.context import Context
from xdsl.dialects.builtin import ModuleOp
from xdsl.passes import ModulePass

from alpa_ir.errors import AlpaError, IRVerifyError, PassFailure, PipelineError
from alpa_ir.ir.collection import rare_full_collections
from alpa_ir.ir.context import AlpaContext, make_context
from alpa_ir.ir.text import print_module, verify_module
from alpa_ir.passmanager.pass_statistics import PassStatistic
from alpa_ir.passmanager.pipeline_syntax import format_pipeline, parse_pipeline
from alpa_ir.passmanager.reproducer import write_reproducer
from alpa_ir.plugins.registry import PluginRegistry

IRPrinter = Callable[[str], None] | TextIO
"""Where IR dumps go: a function taking the dump's text, or a text stream."""

ProgressCallback = Callable[[int, int, ModulePass], None]
"""Called before each pass with its 1-based index, the number of passes and the pass."""

VERIFIER_ROW = "(verifier)"


@dataclass(frozen=True)
class PassTiming:
    """Wall time of one row of a timing report (a pass, or the verifier in total)."""

    name: str
    seconds: float


@dataclass(frozen=True)
class PassRunResult:
    """The module after the pipeline and the wall time of each pass."""

    module: ModuleOp
    timings: tuple[PassTiming, ...]
    statistics: tuple[PassStatistic, ...] = ()
    """What the passes recorded (see :mod:`alpa_ir.passmanager.pass_statistics`)."""


def format_timing_report(rows: Sequence[PassTiming]) -> str:
    """A report like MLIR's ``-mlir-timing``: wall time and share of each row, and the total."""
    total = sum(r.seconds for r in rows)
    rule = "===" + "-" * 73 + "==="
    lines = [
        rule,
        "... Execution time report ...".center(len(rule)).rstrip(),
        rule,
        f"  Total Execution Time: {total:.4f} seconds",
        "",
        "  ----Wall Time----  ----Name----",
    ]
    for row in (*rows, PassTiming("Total", total)):
        share = 100.0 * row.seconds / total if total > 0 else 100.0 if row.name == "Total" else 0.0
        lines.append(f"  {row.seconds:8.4f} ({share:5.1f}%)  {row.name}")
    return "\n".join(lines) + "\n"


def _emit(printer: IRPrinter | None, text: str) -> None:
    target = sys.stderr if printer is None else printer
    if callable(target):
        target(text)
    else:
        target.write(text)
        target.flush()


def _one_line(text: str) -> str:
    return " ".join(text.split())


@dataclass(frozen=True)
class _PassInput:
    """The input of pass ``index`` of a run, made only when a reproducer needs
    it (module docstring): the run's initial copy replayed through the passes
    before it."""

    manager: PassManager
    initial: ModuleOp | None
    index: int

    def make(self) -> tuple[ModuleOp, tuple[ModulePass, ...]] | None:
        """The module and the passes a reproducer runs on it: the pass's input
        and the pass; where the replay fails, the initial copy and every pass up
        to this one. None without a copy (``crash_reproducer=False``)."""
        if self.initial is None:
            return None
        passes = self.manager.passes
        try:
            replayed = self.manager.replay(self.initial.clone(), self.index)
        except Exception:
            return self.initial.clone(), passes[: self.index + 1]
        return replayed, passes[self.index : self.index + 1]


class PassManager:
    """Runs ``pipeline`` (a pipeline string or pass instances) on modules.

    ``print_ir_before``/``print_ir_after`` name passes whose input/output IR is
    dumped to ``ir_printer`` (default: stderr, as MLIR does); ``timing`` writes
    a timing report to ``timing_stream`` (default: stderr) after each run.
    A pass that fails with an internal error (not an
    :class:`~alpa_ir.errors.AlpaError`: a bug) leaves a reproducer in
    ``reproducer_dir`` (default: the system temporary directory); a user error
    (an ``AlpaError``, e.g. a plan that does not fit) leaves one only when
    ``reproducer_dir`` is given, as ``mlir-opt``'s ``--mlir-pass-pipeline-crash-reproducer``.
    ``crash_reproducer=False`` skips them all, and the module copy each pass
    would otherwise cost.
    """

    def __init__(
        self,
        registry: PluginRegistry,
        pipeline: str | Sequence[ModulePass],
        *,
        verify_each: bool | Literal["end"] = True,
        timing: bool = False,
        timing_stream: TextIO | None = None,
        print_ir_before: Collection[str] = frozenset(),
        print_ir_after: Collection[str] = frozenset(),
        print_ir_before_all: bool = False,
        print_ir_after_all: bool = False,
        ir_printer: IRPrinter | None = None,
        debuginfo: bool = False,
        reproducer_dir: str | Path | None = None,
        crash_reproducer: bool = True,
        progress: ProgressCallback | None = None,
    ) -> None:
        self.registry = registry
        self.passes: tuple[ModulePass, ...] = tuple(
            parse_pipeline(pipeline, registry) if isinstance(pipeline, str) else pipeline
        )
        for pass_ in self.passes:
            if not isinstance(pass_, ModulePass):
                raise PipelineError(f"not a pass (xdsl.passes.ModulePass): {pass_!r}")
        for flag, names in (
            ("print-ir-before", print_ir_before),
            ("print-ir-after", print_ir_after),
        ):
            for name in names:
                if name not in registry.passes:
                    known = ", ".join(sorted(registry.passes)) or "none"
                    raise PipelineError(
                        f"unknown pass '{name}' given to {flag}; known passes: {known}"
                    )
        if verify_each not in (True, False, "end"):
            raise PipelineError(f"verify_each must be True, False or 'end', got {verify_each!r}")
        self.verify_each = verify_each
        self.timing = timing
        self.timing_stream = timing_stream
        self.print_ir_before = frozenset(print_ir_before)
        self.print_ir_after = frozenset(print_ir_after)
        self.print_ir_before_all = print_ir_before_all
        self.print_ir_after_all = print_ir_after_all
        self.ir_printer = ir_printer
        self.debuginfo = debuginfo
        self.reproducer_dir = reproducer_dir
        self.crash_reproducer = crash_reproducer
        self.progress = progress

    @property
    def pipeline(self) -> str:
        """The canonical pipeline string of this manager's passes."""
        return format_pipeline(self.passes)

    def run(self, module: ModuleOp, ctx: Context | None = None) -> ModuleOp:
        """Run every pass on ``module`` (in place) and return it."""
        return self.execute(module, ctx).module

    def execute(
        self, module: ModuleOp, ctx: Context | None = None, *, snapshot: ModuleOp | None = None
    ) -> PassRunResult:
        """Run every pass on ``module`` (in place); return it with the pass timings.
        ``snapshot``: a copy of ``module`` as it is now that the caller keeps
        unchanged, the crash reproducers' input instead of a copy of their own."""
        if ctx is None:
            ctx = make_context(self.registry)
        collecting = isinstance(ctx, AlpaContext)
        outer = ctx.statistics if collecting else None  # type: ignore[attr-defined]
        if collecting:
            ctx.statistics = []  # type: ignore[attr-defined]
        try:
            with rare_full_collections():
                module, timings = self._execute(module, ctx, snapshot)
            stats = tuple(ctx.statistics or ()) if collecting else ()  # type: ignore[attr-defined]
        finally:
            if collecting:
                ctx.statistics = outer  # type: ignore[attr-defined]
        if outer is not None:  # a nested pass manager: the outer run sees them too
            outer.extend(stats)
        return PassRunResult(module, timings, stats)

    def _execute(
        self, module: ModuleOp, ctx: Context, snapshot: ModuleOp | None = None
    ) -> tuple[ModuleOp, tuple[PassTiming, ...]]:
        timings: list[PassTiming] = []
        verify_seconds = 0.0
        initial = None
        if self.crash_reproducer:
            initial = snapshot if snapshot is not None else module.clone()
        for index, pass_ in enumerate(self.passes):
            if self.progress is not None:
                self.progress(index + 1, len(self.passes), pass_)
            if self.print_ir_before_all or pass_.name in self.print_ir_before:
                self._dump("Before", pass_, module)
            inputs = _PassInput(self, initial, index)
            start = time.perf_counter()
            self._apply(pass_, module, ctx, inputs)
            timings.append(PassTiming(pass_.name, time.perf_counter() - start))
            if self.verify_each is True:
                start = time.perf_counter()
                self._verify_after(pass_, module, ctx, inputs)
                verify_seconds += time.perf_counter() - start
            if self.print_ir_after_all or pass_.name in self.print_ir_after:
                self._dump("After", pass_, module)
        if self.verify_each == "end" and self.passes:
            start = time.perf_counter()
            self._verify_at_end(module, ctx, initial)
            verify_seconds += time.perf_counter() - start
        if self.verify_each and self.passes:
            timings.append(PassTiming(VERIFIER_ROW, verify_seconds))
        if self.timing:
            _emit(self.timing_stream, format_timing_report(timings))
        return module, tuple(timings)

    def _apply(
        self, pass_: ModulePass, module: ModuleOp, ctx: Context, snapshot: _PassInput
    ) -> None:
        try:
            pass_.apply(ctx, module)
        except AlpaError as err:
            if self.reproducer_dir is not None:  # asked for: user errors too
                _, note = self._reproduce(
                    pass_, snapshot, ctx, f"pass '{pass_.name}' failed: {err}"
                )
                if note:
                    err.add_note(note)
            raise
        except Exception as err:
            detail = _one_line(str(err))
            cause = f"{type(err).__name__}: {detail}" if detail else type(err).__name__
            failure = f"pass '{pass_.name}' failed: {cause}"
            path, note = self._reproduce(pass_, snapshot, ctx, failure)
            suffix = f" ({note})" if note else ""
            raise PassFailure(failure + suffix, reproducer=path) from err

    def _verify_at_end(self, module: ModuleOp, ctx: Context, initial: ModuleOp | None) -> None:
        """``verify_each="end"``: verify once; on failure, name the pass that
        broke the module by replaying the run with verification after each pass."""
        try:
            verify_module(module)
        except IRVerifyError as err:
            if initial is not None:
                replay = PassManager(self.registry, self.passes, reproducer_dir=self.reproducer_dir)
                replay.execute(initial.clone(), make_context(self.registry))  # raises, naming it
            names = ", ".join(p.name for p in self.passes)
            raise IRVerifyError(f"module does not verify after the passes {names}: {err}") from err

    def _verify_after(
        self, pass_: ModulePass, module: ModuleOp, ctx: Context, snapshot: _PassInput
    ) -> None:
        try:
            verify_module(module)
        except IRVerifyError as err:  # a pass that breaks the IR: an internal error
            failure = f"module does not verify after pass '{pass_.name}': {err}"
            _, note = self._reproduce(pass_, snapshot, ctx, failure)
            suffix = f" ({note})" if note else ""
            raise IRVerifyError(failure + suffix) from err

    def _reproduce(
        self, pass_: ModulePass, snapshot: _PassInput, ctx: Context, failure: str
    ) -> tuple[str | None, str]:
        """Write the reproducer of ``pass_`` failing on its input: its path (None if
        not written) and a note saying where it is."""
        try:
            made = snapshot.make()
            if made is None:
                return None, ""
            module, passes = made
            path = write_reproducer(
                module,
                ctx,
                pass_name=pass_.name,
                pipeline=format_pipeline(passes),
                plugins=self.registry.explicit_plugins,
                failure=failure,
                directory=self.reproducer_dir,
            )
        except Exception as exc:  # never hide the pass's error behind the reproducer's
            return None, f"reproducer not written: {type(exc).__name__}: {_one_line(str(exc))}"
        return path, f"reproducer: {path}"

    def replay(self, module: ModuleOp, count: int) -> ModuleOp:
        """``module`` after the first ``count`` passes, run plainly (no
        verification, reproducer, dump or progress) in a fresh context."""
        plain = PassManager(self.registry, self.passes[:count], verify_each=False)
        plain.crash_reproducer = False
        return plain.run(module, make_context(self.registry))

    def _dump(self, when: str, pass_: ModulePass, module: ModuleOp) -> None:
        header = f"// -----// IR Dump {when} {pass_.name} //----- //\n"
        _emit(self.ir_printer, header + print_module(module, debuginfo=self.debuginfo) + "\n")
