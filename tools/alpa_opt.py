"""alpa-opt: run a pass pipeline on an IR file, like mlir-opt and xdsl-opt.

    alpa-opt input.mlir --pass-pipeline='builtin.module(merge-trivial-ops)'
    alpa-opt --import alpa_ir.models:gpt_tiny_step -p merge-trivial-ops
    alpa-opt --list-passes

Every user error (bad IR, bad pipeline, missing file, broken plugin) is one
line on stderr and exit code 1 (2 for command-line usage errors); an internal
error is one line and exit code 70, with the traceback behind ``--traceback``.
"""

from __future__ import annotations

import argparse
import importlib
import sys
import time
import traceback
import warnings
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from xdsl.context import Context
from xdsl.dialects.builtin import ModuleOp

from alpa_ir.errors import AlpaError
from alpa_ir.ir.context import make_context
from alpa_ir.ir.text import SPLIT_MARKER, InputChunk, parse_module, print_module, split_input
from alpa_ir.passmanager.pass_manager import PassManager, PassTiming, format_timing_report
from alpa_ir.passmanager.pass_statistics import PassStatistic, format_statistics_report
from alpa_ir.passmanager.reproducer import read_reproducer_args
from alpa_ir.plugins.registry import PluginRegistry, load_registry
from alpa_ir.tools.pass_listing import format_pass_list

PROG = "alpa-opt"
EXIT_INTERNAL_ERROR = 70  # EX_SOFTWARE


def build_arg_parser() -> argparse.ArgumentParser:
    """The command line of alpa-opt."""
    p = argparse.ArgumentParser(
        prog=PROG,
        description="Run an alpa_ir pass pipeline on an IR module.",
        epilog="Pipelines: 'builtin.module(a,b{k=v k2=v2})' or the flat form 'a,b{k=v}'.",
    )
    p.add_argument("input", nargs="?", default="-", help="input IR file ('-' for stdin)")
    p.add_argument("-o", "--output", default="-", help="output file ('-' for stdout)")
    pipe = p.add_mutually_exclusive_group()
    pipe.add_argument("--pass-pipeline", help="MLIR form: builtin.module(a,b{k=v})")
    pipe.add_argument("-p", "--passes", help="flat form: a,b{k=v}")
    pipe.add_argument(
        "--run-reproducer",
        action="store_true",
        help="take the pipeline and plugins from the input's reproducer header",
    )
    p.add_argument("--list-passes", action="store_true", help="list the passes and exit")
    p.add_argument(
        "--print-pipeline", action="store_true", help="print the canonical pipeline and exit"
    )
    p.add_argument(
        "--print-ir-before",
        action="append",
        default=[],
        metavar="PASS",
        help="print the IR before PASS (repeatable, or a comma list)",
    )
    p.add_argument("--print-ir-after", action="append", default=[], metavar="PASS")
    p.add_argument("--print-ir-before-all", action="store_true")
    p.add_argument("--print-ir-after-all", action="store_true")
    p.add_argument("--timing", action="store_true", help="report the wall time of each pass")
    p.add_argument(
        "--pass-statistics",
        action="store_true",
        help="report the statistics the passes recorded (ILP sizes, solve times) on stderr",
    )
    p.add_argument(
        "--split-input-file",
        action="store_true",
        help=f"process each '{SPLIT_MARKER}'-separated chunk of the input separately",
    )
    p.add_argument(
        "--load-plugin",
        action="append",
        default=[],
        metavar="MODULE",
        help="load a plugin module (repeatable)",
    )
    p.add_argument(
        "--import",
        dest="import_spec",
        metavar="MODULE:FACTORY",
        help="import a JAX function: FACTORY() returns (fn, example_args)",
    )
    p.add_argument(
        "--mlir-print-debuginfo", action="store_true", help="print the location of each op"
    )
    p.add_argument(
        "--verify-each",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="verify the module after each pass (default: on)",
    )
    p.add_argument(
        "--reproducer",
        "--reproducer-dir",
        dest="reproducer_dir",
        metavar="DIR",
        help="write a reproducer of any failing pass into DIR (user errors too); without it, "
        "only internal errors leave one, in the system temporary directory",
    )
    p.add_argument(
        "--view",
        metavar="DIR",
        help="draw the output module's plan into DIR: devices and shardings, and for a "
        "pipeline plan the simulated timeline and memory (PNG)",
    )
    p.add_argument("--traceback", action="store_true", help="show tracebacks of errors")
    return p


def _pass_names(values: Sequence[str]) -> set[str]:
    return {name.strip() for value in values for name in value.split(",") if name.strip()}


def _load_registry(plugins: Sequence[str], *, builtin: bool, entry_points: bool) -> PluginRegistry:
    """The registry; entry-point plugins that fail to load are warned about, one line each."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="alpa_ir plugin .* failed to load")
        registry = load_registry(plugins, builtin=builtin, entry_points=entry_points)
    for error in registry.load_errors:
        print(f"{PROG}: warning: plugin {error} failed to load; skipped", file=sys.stderr)
    return registry


def _read_input(path: str) -> tuple[str, str]:
    """(text, filename) of the input file, or of stdin for '-'."""
    if path == "-":
        return sys.stdin.read(), "<stdin>"
    try:
        return Path(path).read_text(encoding="utf-8"), path
    except (OSError, UnicodeDecodeError) as exc:
        reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
        raise AlpaError(f"cannot read input file '{path}': {reason}") from None


def _import_jax_module(spec: str) -> ModuleOp:
    """Call the factory named by ``MODULE:FACTORY`` and import its function."""
    module_name, _, factory_name = spec.partition(":")
    try:
        module = importlib.import_module(module_name)
    except Exception as exc:
        raise AlpaError(
            f"--import {spec}: cannot import module '{module_name}': {type(exc).__name__}: {exc}"
        ) from None
    factory = getattr(module, factory_name, None)
    if not callable(factory):
        raise AlpaError(f"--import {spec}: module '{module_name}' has no factory '{factory_name}'")
    try:
        made: Any = factory()
    except AlpaError:
        raise
    except Exception as exc:
        raise AlpaError(f"--import {spec}: the factory raised {type(exc).__name__}: {exc}") from exc
    if not (isinstance(made, tuple | list) and len(made) == 2 and callable(made[0])):
        raise AlpaError(
            f"--import {spec}: the factory must return (fn, example_args), got {type(made).__name__}"
        )
    fn, example_args = made
    try:
        from alpa_ir import import_jax
    except ImportError as exc:
        raise AlpaError(f"--import needs the JAX importer, which failed to load: {exc}") from None
    return import_jax(fn, *tuple(example_args))


class _Timings:
    """Wall time per row summed over the chunks of the input, in first-seen order;
    a pass that occurs twice in the pipeline keeps two rows."""

    def __init__(self) -> None:
        self.seconds: dict[tuple[int, str], float] = {}

    def add(self, name: str, seconds: float, position: int = -1) -> None:
        key = (position, name)
        self.seconds[key] = self.seconds.get(key, 0.0) + seconds

    def rows(self) -> list[PassTiming]:
        return [PassTiming(name, s) for (_, name), s in self.seconds.items()]


def _report(err: BaseException) -> None:
    print(f"{PROG}: error: {err}", file=sys.stderr)
    for note in getattr(err, "__notes__", ()):
        print(f"{PROG}: note: {note}", file=sys.stderr)


class _Driver:
    """One invocation of alpa-opt: runs the pass manager on each input chunk."""

    def __init__(self, args: argparse.Namespace, manager: PassManager) -> None:
        self.args = args
        self.manager = manager
        self.ctx: Context | None = None
        self.timings = _Timings()
        self.statistics: tuple[PassStatistic, ...] = ()
        self.outputs: list[str] = []

    def process_module(self, load: Callable[[], ModuleOp], load_row: str) -> bool:
        """Load a module with ``load()``, run the pipeline, keep its text; False on error."""
        try:
            start = time.perf_counter()
            module = load()
            self.timings.add(load_row, time.perf_counter() - start)
            result = self.manager.execute(module, self.context())
            for position, row in enumerate(result.timings):
                self.timings.add(row.name, row.seconds, position)
            self.statistics += result.statistics
            start = time.perf_counter()
            text = print_module(result.module, debuginfo=self.args.mlir_print_debuginfo)
            self.timings.add("Output", time.perf_counter() - start)
            if self.args.view:
                self._view(result.module)
        except AlpaError as err:
            if self.args.traceback:
                traceback.print_exc()
            _report(err)
            self.outputs.append("")
            return False
        self.outputs.append(text)
        if self.args.output == "-":
            sys.stdout.write(text)
            sys.stdout.flush()
        return True

    def _view(self, module: ModuleOp) -> None:
        from alpa_ir.plots.views import plot_all

        folder = Path(self.args.view)
        if self.outputs or self.args.split_input_file:
            folder = folder / f"chunk{len(self.outputs)}"
        try:
            paths = plot_all(module, folder)
        except OSError as exc:
            raise AlpaError(f"cannot write pictures into '{folder}': {exc.strerror}") from None
        print(f"{PROG}: pictures: {', '.join(str(p) for p in paths)}", file=sys.stderr)

    def context(self) -> Context:
        if self.ctx is None:
            self.ctx = make_context(self.manager.registry)
        return self.ctx

    def process_chunk(self, chunk: InputChunk, filename: str) -> bool:
        if self.outputs and self.args.output == "-":
            sys.stdout.write(SPLIT_MARKER + "\n")  # also after a chunk that failed, like mlir-opt
            sys.stdout.flush()
        return self.process_module(
            lambda: parse_module(
                chunk.text, ctx=self.context(), filename=filename, first_line=chunk.first_line
            ),
            "Parser",
        )

    def finish(self) -> None:
        if self.args.output != "-" and any(self.outputs):
            text = (SPLIT_MARKER + "\n").join(self.outputs)
            try:
                Path(self.args.output).write_text(text, encoding="utf-8")
            except OSError as exc:
                raise AlpaError(
                    f"cannot write output file '{self.args.output}': {exc.strerror}"
                ) from None
        if self.args.timing:
            sys.stderr.write(format_timing_report(self.timings.rows()))
        if self.args.pass_statistics:
            sys.stderr.write(format_statistics_report(self.statistics))


def _make_manager(args: argparse.Namespace, registry: PluginRegistry, pipeline: str) -> PassManager:
    return PassManager(
        registry,
        pipeline,
        verify_each=args.verify_each,
        print_ir_before=_pass_names(args.print_ir_before),
        print_ir_after=_pass_names(args.print_ir_after),
        print_ir_before_all=args.print_ir_before_all,
        print_ir_after_all=args.print_ir_after_all,
        debuginfo=args.mlir_print_debuginfo,
        reproducer_dir=args.reproducer_dir,
    )


def _run(args: argparse.Namespace, *, builtin: bool, entry_points: bool) -> int:
    plugins = list(args.load_plugin)
    pipeline = args.pass_pipeline or args.passes or ""
    source: tuple[str, str] | None = None
    if args.run_reproducer:
        source = _read_input(args.input)
        recorded = read_reproducer_args(*source)
        pipeline = recorded.pipeline
        missing = [p for p in recorded.plugins if p not in plugins]
        if missing:  # a file never makes us import code: the user names it
            flags = " ".join(f"--load-plugin={p}" for p in missing)
            raise AlpaError(
                f"{source[1]} was made with plugins {', '.join(missing)}; replaying it loads "
                f"only plugins named on the command line: add {flags}"
            )
    registry = _load_registry(plugins, builtin=builtin, entry_points=entry_points)
    if args.list_passes:
        sys.stdout.write(format_pass_list(registry))
        return 0
    manager = _make_manager(args, registry, pipeline)
    if args.print_pipeline:
        print(manager.pipeline)
        return 0
    driver = _Driver(args, manager)
    if args.import_spec:
        ok = driver.process_module(lambda: _import_jax_module(args.import_spec), "Import")
    else:
        text, filename = source or _read_input(args.input)
        chunks = split_input(text) if args.split_input_file else [InputChunk(text, 1)]
        results = [driver.process_chunk(chunk, filename) for chunk in chunks]
        ok = all(results)
    driver.finish()
    return 0 if ok else 1


def _check_usage(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    if args.import_spec is not None:
        if ":" not in args.import_spec:
            parser.error(f"--import expects MODULE:FACTORY, got '{args.import_spec}'")
        if args.input != "-" or args.split_input_file or args.run_reproducer:
            parser.error("--import replaces the input file; drop FILE/--split-input-file")


def main(
    argv: Sequence[str] | None = None,
    *,
    builtin_plugins: bool = True,
    entry_point_plugins: bool = True,
) -> int:
    """Run alpa-opt with ``argv`` (default: ``sys.argv[1:]``); return the exit code.

    ``builtin_plugins``/``entry_point_plugins`` choose which plugins are loaded
    besides ``--load-plugin`` ones (for embedding and tests).
    """
    parser = build_arg_parser()
    try:
        args = parser.parse_args(argv)
        _check_usage(parser, args)
    except SystemExit as exit_:
        return exit_.code if isinstance(exit_.code, int) else 2
    try:
        return _run(args, builtin=builtin_plugins, entry_points=entry_point_plugins)
    except AlpaError as err:
        if args.traceback:
            traceback.print_exc()
        _report(err)
        return 1
    except KeyboardInterrupt:
        print(f"{PROG}: interrupted", file=sys.stderr)
        return 130
    except Exception as err:
        if args.traceback:
            traceback.print_exc()
        detail = " ".join(str(err).split())
        print(
            f"{PROG}: internal error: {type(err).__name__}: {detail} "
            "(rerun with --traceback to see where)",
            file=sys.stderr,
        )
        return EXIT_INTERNAL_ERROR


if __name__ == "__main__":
    sys.exit(main())
