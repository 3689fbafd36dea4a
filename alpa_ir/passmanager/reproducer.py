"""Crash reproducers: the input of a failing pass plus the command that re-runs it.

When a pass raises (or leaves a module that does not verify), the pass manager
writes the module as it was *before* that pass, preceded by a header::

    // alpa_ir reproducer: pass 'auto-sharding' failed: ValueError: ...
    // Run it again with: alpa-opt FILE --run-reproducer
    // alpa-opt-reproducer: --pass-pipeline='builtin.module(auto-sharding{...})' --load-plugin=m

The last header line holds the ``alpa-opt`` arguments (the failing pass with
all its options, and the plugins loaded on request); ``alpa-opt
--run-reproducer FILE`` reads them back, like ``mlir-opt --run-reproducer``.
"""

from __future__ import annotations

import shlex
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from xdsl.context import Context
from xdsl.dialects.builtin import ModuleOp

from alpa_ir.errors import AlpaError
from alpa_ir.ir.text import parse_module, print_module

ARGS_PREFIX = "// alpa-opt-reproducer:"
REPRODUCER_SUFFIX = ".reproducer.mlir"


@dataclass(frozen=True)
class ReproducerArgs:
    """What a reproducer file asks ``alpa-opt`` to do."""

    pipeline: str
    plugins: tuple[str, ...]


def _module_text(module: ModuleOp, ctx: Context) -> str:
    """The module with its locations, unless a location type does not parse back."""
    text = print_module(module, debuginfo=True)
    try:
        parse_module(text, ctx=ctx, verify=False)
    except AlpaError:
        return print_module(module)
    return text


def reproducer_text(
    module: ModuleOp,
    ctx: Context,
    *,
    pipeline: str,
    plugins: Sequence[str],
    failure: str,
    path: str = "FILE",
) -> str:
    """The content of reproducer file ``path`` (``failure`` is one line)."""
    args = [f"--pass-pipeline={shlex.quote(pipeline)}"]
    args += [f"--load-plugin={shlex.quote(p)}" for p in plugins]
    header = (
        f"// alpa_ir reproducer: {failure}\n"
        f"// Run it again with: alpa-opt {shlex.quote(path)} --run-reproducer\n"
        f"{ARGS_PREFIX} {' '.join(args)}\n"
    )
    return header + _module_text(module, ctx)


def write_reproducer(
    module: ModuleOp,
    ctx: Context,
    *,
    pass_name: str,
    pipeline: str,
    plugins: Sequence[str],
    failure: str,
    directory: str | Path | None,
) -> str:
    """Write a reproducer to a new file ``<pass>-XXXX.reproducer.mlir`` in ``directory``
    (default: the system's temporary directory) and return its path."""
    folder = Path(directory) if directory is not None else Path(tempfile.gettempdir())
    folder.mkdir(parents=True, exist_ok=True)
    with tempfile.NamedTemporaryFile(
        "w", prefix=f"{pass_name}-", suffix=REPRODUCER_SUFFIX, dir=folder, delete=False
    ) as handle:
        handle.write(
            reproducer_text(
                module, ctx, pipeline=pipeline, plugins=plugins, failure=failure, path=handle.name
            )
        )
    return handle.name


def read_reproducer_args(text: str, filename: str) -> ReproducerArgs:
    """The pipeline and plugins recorded in a reproducer's header."""
    for number, line in enumerate(text.splitlines(), start=1):
        if not line.startswith(ARGS_PREFIX):
            continue
        try:
            words = shlex.split(line[len(ARGS_PREFIX) :])
        except ValueError as exc:
            raise AlpaError(f"{filename}:{number}: malformed reproducer arguments: {exc}") from None
        pipeline: str | None = None
        plugins: list[str] = []
        for word in words:
            key, _, value = word.partition("=")
            if key == "--pass-pipeline":
                pipeline = value
            elif key == "--load-plugin":
                plugins.append(value)
            else:
                raise AlpaError(f"{filename}:{number}: unknown reproducer argument '{word}'")
        if pipeline is None:
            raise AlpaError(f"{filename}:{number}: the reproducer names no --pass-pipeline")
        return ReproducerArgs(pipeline, tuple(plugins))
    raise AlpaError(f"{filename}: not a reproducer: no line starts with '{ARGS_PREFIX}'")
