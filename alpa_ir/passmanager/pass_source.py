"""A pass's summary and options read from its module's source, without importing it.

``alpa-opt --list-passes`` shows every pass with its options. A pass the
registry names lazily (:class:`~alpa_ir.plugins.registry.Lazy`) is listed
from the text of its module: the class's docstring gives the summary, each
annotated field an option (type from the annotation, default from the
literal or the module-level constant it names, help from the docstring
written under it; a base class's fields first, read from its module where
it is an ``alpa_ir`` one), exactly as :func:`~alpa_ir.passmanager.pass_options.pass_options`
reads them from the imported class. Nothing is imported, so listing passes
costs neither JAX nor a solver.
"""

from __future__ import annotations

import ast
import importlib.util
import inspect
import typing
from dataclasses import dataclass
from typing import Any, Literal

from alpa_ir.errors import PipelineError
from alpa_ir.passmanager.pass_options import OptionInfo, field_docs

_TYPE_NAMES: dict[str, Any] = {
    "Literal": Literal,
    "tuple": tuple,
    "list": list,
    "int": int,
    "float": float,
    "bool": bool,
    "str": str,
    "None": None,
    "Any": Any,
}


@dataclass(frozen=True)
class PassSource:
    """What the source says of one pass class."""

    summary: str
    options: tuple[OptionInfo, ...]


def _annotation_type(node: ast.expr) -> Any:
    text = ast.unparse(node)
    try:
        return eval(compile(ast.Expression(node), "<annotation>", "eval"), dict(_TYPE_NAMES))
    except Exception:  # a type this reader does not know: shown as written
        return typing.ForwardRef(text)


def _default(node: ast.expr | None, constants: dict[str, ast.expr]) -> tuple[bool, Any]:
    """(required, default) of a field's value."""
    if node is None:
        return True, None
    if isinstance(node, ast.Name) and node.id in constants:
        node = constants[node.id]
    if isinstance(node, ast.Call) and ast.unparse(node.func) == "field":
        for keyword in node.keywords:
            if keyword.arg == "default":
                return _default(keyword.value, constants)
        return False, None
    try:
        return False, ast.literal_eval(node)
    except ValueError:
        return False, ast.unparse(node)


def _metadata_help(node: ast.expr | None) -> str:
    """The ``help`` of ``field(..., metadata={"help": ...})``, else empty."""
    if not (isinstance(node, ast.Call) and ast.unparse(node.func) == "field"):
        return ""
    for keyword in node.keywords:
        if keyword.arg == "metadata":
            try:
                metadata = ast.literal_eval(keyword.value)
            except ValueError:
                return ""
            return str(metadata.get("help", "")) if isinstance(metadata, dict) else ""
    return ""


def _class(tree: ast.Module, name: str) -> ast.ClassDef:
    for stmt in tree.body:
        if isinstance(stmt, ast.ClassDef) and stmt.name == name:
            return stmt
    raise PipelineError(f"no class {name} in the module's source")


def _parse(module: str) -> ast.Module:
    spec = importlib.util.find_spec(module)
    if spec is None or spec.origin is None:
        raise PipelineError(f"module {module} not found")
    with open(spec.origin, encoding="utf-8") as f:
        return ast.parse(f.read())


def _imported_from(tree: ast.Module, name: str) -> str | None:
    """The module ``name`` is imported from (``from M import name``), if it is."""
    for stmt in tree.body:
        if isinstance(stmt, ast.ImportFrom) and stmt.module and stmt.level == 0:
            if any((a.asname or a.name) == name for a in stmt.names):
                return stmt.module
    return None


def _options(tree: ast.Module, cls: ast.ClassDef) -> list[OptionInfo]:
    """The options of ``cls``: its bases' first (a dataclass's field order; a
    base defined in this module or imported from an ``alpa_ir`` module, such
    as a planner's options a pass inherits), then its own."""
    options: list[OptionInfo] = []
    for base in cls.bases:
        if not isinstance(base, ast.Name):
            continue
        if any(isinstance(s, ast.ClassDef) and s.name == base.id for s in tree.body):
            options += _options(tree, _class(tree, base.id))
            continue
        origin = _imported_from(tree, base.id)
        if origin is not None and origin.split(".")[0] == "alpa_ir":
            base_tree = _parse(origin)
            options += _options(base_tree, _class(base_tree, base.id))
    constants = {
        target.id: stmt.value
        for stmt in tree.body
        if isinstance(stmt, ast.Assign)
        for target in stmt.targets
        if isinstance(target, ast.Name)
    }
    docs = field_docs(cls)
    for stmt in cls.body:
        if not (isinstance(stmt, ast.AnnAssign) and isinstance(stmt.target, ast.Name)):
            continue
        if ast.unparse(stmt.annotation).startswith(("ClassVar", "typing.ClassVar")):
            continue
        required, default = _default(stmt.value, constants)
        field_name = stmt.target.id
        help_text = _metadata_help(stmt.value) or docs.get(field_name, "")
        options.append(
            OptionInfo(
                name=field_name.replace("_", "-"),
                field=field_name,
                type=_annotation_type(stmt.annotation),
                required=required,
                default=default,
                help=help_text,
            )
        )
    return options


def read_pass_source(module: str, attribute: str) -> PassSource:
    """The summary and options of class ``attribute`` of ``module``, from its source."""
    tree = _parse(module)
    cls = _class(tree, attribute)
    doc = ast.get_docstring(cls) or ""
    lines = inspect.cleandoc(doc).splitlines()
    summary = lines[0].strip() if lines else "(no description)"
    return PassSource(summary, tuple(_options(tree, cls)))
