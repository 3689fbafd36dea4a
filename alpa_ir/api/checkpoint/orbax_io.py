"""Orbax under the checkpoints: a synchronous manager per call (no thread of
its own outlives a call), its log records dropped while it works for us (its
failures come back as one-line errors naming the user's leaf and keeping the
cause), and a failed save's partial step removed at once."""

from __future__ import annotations

import contextlib
import gc
import logging
import os
import re
import shutil
import sys
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import jax

from alpa_ir.errors import AlpaError

_ITEM = re.compile(r"\bleaf\d{5}\b")
_OS_ERROR_CODE = re.compile(r"os_error_code='?(\d+)")
_DETAIL_CHARS = 300
TMP_SUFFIX = ".orbax-checkpoint-tmp"


def _orbax() -> Any:
    import orbax.checkpoint as ocp

    return ocp


class _DropOrbaxRecords(logging.Filter):
    """Drops the records orbax logs (through absl) while a call runs."""

    def filter(self, record: logging.LogRecord) -> bool:
        return f"{os.sep}orbax{os.sep}" not in record.pathname


@contextlib.contextmanager
def quiet() -> Iterator[None]:
    """Orbax logs nothing on the way: what fails comes back as our error."""
    logger = logging.getLogger("absl")
    drop = _DropOrbaxRecords()
    logger.addFilter(drop)
    try:
        yield
    finally:
        logger.removeFilter(drop)


@contextlib.contextmanager
def opened(path: Path, *, create: bool) -> Iterator[Any]:
    """A synchronous orbax ``CheckpointManager`` on ``path`` keeping one
    committed step, quiet, closed on the way out. Synchronous: orbax's
    asynchronous save leaves non-daemon threads waiting forever when its
    temporary folder cannot be made (a read-only file system), and the
    process could not exit."""
    ocp = _orbax()
    with quiet():
        options = ocp.CheckpointManagerOptions(
            max_to_keep=1,
            create=create,
            cleanup_tmp_directories=True,
            enable_async_checkpointing=False,
        )
        manager = ocp.CheckpointManager(path.resolve(), options=options)
        try:
            yield manager
        finally:
            manager.close()


def latest_step(path: Path) -> int | None:
    """The newest committed step of the checkpoint folder ``path``."""
    with opened(path, create=False) as manager:
        return manager.latest_step()


# --------------------------------------------------------------------------- messages


def describe(err: BaseException, names: Mapping[str, str]) -> str:
    """``err`` as one line: the innermost error of its chain (orbax wraps
    tensorstore's precise reason in a generic one), the operating system's
    cause first where one is behind it and not already said (no space left,
    read-only, ...), orbax's item names (``leaf00003``) written as the user's
    leaf paths, cut short."""
    chain = _chain(err)
    text = _one_line(chain[-1])
    text = _ITEM.sub(lambda m: names.get(m.group(0), m.group(0)), text)
    detail = text if len(text) <= _DETAIL_CHARS else text[:_DETAIL_CHARS] + "..."
    cause = next((c for c in map(_os_cause, chain) if c is not None), None)
    if cause is not None and cause not in detail:
        return f"{cause} ({detail})"
    return detail


def _chain(err: BaseException) -> list[BaseException]:
    """``err`` and the errors behind it, outermost first, as Python's
    traceback follows them (a context that was suppressed is not one)."""
    chain: list[BaseException] = []
    link: BaseException | None = err
    while link is not None and all(link is not c for c in chain):
        chain.append(link)
        if link.__cause__ is not None:
            link = link.__cause__
        else:
            link = None if link.__suppress_context__ else link.__context__
    return chain


def _one_line(err: BaseException) -> str:
    text = str(err).split("See full TensorStore details")[0]
    return " ".join(text.split()).rstrip(" .") or type(err).__name__


def _os_cause(err: BaseException) -> str | None:
    """The operating system's message behind ``err``: an ``OSError``'s, or
    the error code tensorstore writes into its text."""
    if isinstance(err, OSError) and err.errno:
        return os.strerror(err.errno)
    found = _OS_ERROR_CODE.search(str(err))
    return os.strerror(int(found.group(1))) if found else None


def blamed_item(err: BaseException) -> str | None:
    """The first orbax item (``leaf00003``) that ``err`` or an error behind it names."""
    for link in _chain(err):
        found = _ITEM.search(str(link))
        if found:
            return found.group(0)
    return None


# --------------------------------------------------------------------------- write


def item_names(manifest: Mapping[str, Any]) -> dict[str, str]:
    """Orbax item -> the user's leaf path, from a manifest."""
    return {
        e["item"]: e["path"]
        for e in manifest.get("leaves", [])
        if isinstance(e, dict) and isinstance(e.get("item"), str)
    }


def write_checkpoint(
    path: str, number: int, arrays: dict[str, Any], manifest: dict[str, Any]
) -> None:
    """Write one orbax step of ``arrays`` and ``manifest`` (every process of
    the JAX world calls it; each writes the shards it holds). A failure is a
    one-line error naming the leaf orbax was writing and the cause, and the
    partial step is removed before it is raised."""
    where = Path(path)
    created = not where.exists()
    ocp = _orbax()
    try:
        with opened(where, create=True) as manager:
            manager.save(
                number,
                args=ocp.args.Composite(
                    state=ocp.args.StandardSave(arrays), manifest=ocp.args.JsonSave(manifest)
                ),
                force=True,
            )
            manager.wait_until_finished()
    except BaseException as err:
        remove_partial(where, number, created=created)
        if isinstance(err, AlpaError) or not isinstance(err, Exception):
            raise
        names = item_names(manifest)
        item = blamed_item(err)
        leaf = f": leaf {names.get(item, item)}" if item else ""
        step = manifest.get("step")
        raise AlpaError(
            f"cannot save checkpoint {where} (step {number if step is None else step}){leaf}: "
            f"{describe(err, names)}"
        ) from None


def remove_partial(where: Path, number: int, *, created: bool) -> None:
    """Remove what a failed save of step ``number`` left (its temporary
    folder; the checkpoint folder too when the save made it and it is empty).
    Process 0 does it: the others may still be writing their shards."""
    if jax.process_index() != 0:
        return
    with contextlib.suppress(OSError):
        for tmp in where.glob(f"{number}{TMP_SUFFIX}*"):
            if not tmp.is_symlink():
                shutil.rmtree(tmp, ignore_errors=True)
        if created and where.is_dir() and not any(where.iterdir()):
            where.rmdir()


# --------------------------------------------------------------------------- read


def read_manifest_item(manager: Any, step: int) -> Any:
    """The manifest item of ``step``, as orbax reads its JSON."""
    ocp = _orbax()
    with quiet():
        return manager.restore(
            step, args=ocp.args.Composite(manifest=ocp.args.JsonRestore())
        ).manifest


def read_items(
    manager: Any, step: int, abstract: dict[str, jax.ShapeDtypeStruct]
) -> dict[str, Any]:
    """The arrays of the items in ``abstract`` (any subset of the step's: a
    partial restore), each read with its shape, dtype and sharding."""
    if not abstract:
        return {}
    ocp = _orbax()
    args = ocp.args.PyTreeRestore(
        item=abstract,
        restore_args=ocp.checkpoint_utils.construct_restore_args(abstract),
        partial_restore=True,
    )
    with quiet():
        return dict(manager.restore(step, args=ocp.args.Composite(state=args)).state)


def read_leaves(
    label: str,
    manager: Any,
    step: int,
    abstract: dict[str, jax.ShapeDtypeStruct],
    names: Mapping[str, str],
) -> dict[str, Any]:
    """Every item of ``abstract`` at once; when that fails, each alone, to
    name the leaf that cannot be read with orbax's reason."""
    try:
        return read_items(manager, step, abstract)
    except Exception as err:
        whole = describe(err, names)
    failed: list[tuple[str, str]] = []
    for item, spec in abstract.items():
        try:
            read_items(manager, step, {item: spec})
        except Exception as err:
            failed.append((item, describe(err, names)))
    collect_failed_reads()
    if failed and (len(failed) < len(abstract) or len(abstract) == 1):
        item, reason = failed[0]
        more = f" (and {len(failed) - 1} more)" if len(failed) > 1 else ""
        raise AlpaError(f"{label}: leaf {names.get(item, item)}{more} cannot be read: {reason}")
    which = "any of its" if failed else "its"
    raise AlpaError(f"{label}: cannot read {which} {len(abstract)} array leaves: {whole}")


def collect_failed_reads() -> None:
    """Collect the read coroutines a failed orbax restore leaves behind now,
    dropping what their deaths report ("Exception ignored in ... coroutine
    _read_array_index_and_device_put": the failure, which our error already
    says); left to a later collection they print it on stderr. (Tensorstore
    reads still in flight may yet call into the event loop orbax closed and
    report "Event loop is closed" later: that is not ours to collect.)"""
    original = sys.unraisablehook

    def hook(unraisable: Any) -> None:
        if not _from_orbax(unraisable):
            original(unraisable)

    sys.unraisablehook = hook
    try:
        gc.collect()
    finally:
        sys.unraisablehook = original


def _from_orbax(unraisable: Any) -> bool:
    code = getattr(unraisable.object, "cr_code", None)
    files = [code.co_filename] if code is not None else []
    tb = unraisable.exc_traceback
    while tb is not None:
        files.append(tb.tb_frame.f_code.co_filename)
        tb = tb.tb_next
    return any(f"{os.sep}orbax{os.sep}" in f for f in files)
