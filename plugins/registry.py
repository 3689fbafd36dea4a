"""The plugin registry: loads plugins with pluggy and merges their contributions.

A :class:`PluginRegistry` is an immutable value built once by
:func:`load_registry` and passed down to whoever needs it (the pass manager,
the CLI tools, the API). There is no global registry; :func:`default_registry`
caches the one built from the built-in plugin and the installed entry points.
"""

from __future__ import annotations

import functools
import importlib
import warnings
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType, ModuleType
from typing import Any

import pluggy

from alpa_ir.errors import AlpaError
from alpa_ir.plugins.contributions import NamedPipeline, PluginLoadError, resolved
from alpa_ir.plugins.hookspecs import PROJECT_NAME, AlpaIrHookSpecs


@dataclass(frozen=True)
class PluginRegistry:
    """Everything the loaded plugins contribute, by name.

    Each table maps a name to the contribution and ``owners`` records which
    plugin contributed each ``(kind, name)``. ``load_errors`` holds the plugins
    found through entry points that failed to load; they are reported by the
    commands that would have needed them, and never stop the others.
    """

    dialects: Mapping[str, Any]
    """Dialects by name: ``xdsl.ir.Dialect`` objects or :class:`Lazy` ones."""
    passes: Mapping[str, Any]
    """Pass classes by name, or :class:`Lazy` ones (use :meth:`get_pass`)."""
    solvers: Mapping[str, Callable[[], Any]]
    backends: Mapping[str, Callable[[], Any]]
    cost_models: Mapping[str, Callable[[], Any]]
    stage_cost_models: Mapping[str, Callable[[Any], Any]]
    sharding_rules: Mapping[str, Any]
    cluster_presets: Mapping[str, Callable[[], Any]]
    pipelines: Mapping[str, NamedPipeline] = field(default_factory=dict)
    """Named pass pipelines (``alpa_ir_pipelines``)."""
    schedules: Mapping[str, Any] = field(default_factory=dict)
    """Pipeline schedule builders (``alpa_ir_schedules``)."""
    owners: Mapping[tuple[str, str], str] = field(default_factory=dict)
    plugin_names: tuple[str, ...] = ()
    load_errors: tuple[str, ...] = ()
    explicit_plugins: tuple[str, ...] = ()
    """The module names loaded on request (``extra_plugins``, ``--load-plugin``), in
    order: what a reproducer must load again to find the same passes."""

    def load_error_hint(self) -> str:
        """A suffix for 'unknown X' errors naming the plugins that failed to load."""
        if not self.load_errors:
            return ""
        return " (plugins that failed to load: " + "; ".join(self.load_errors) + ")"

    def get_pass(self, name: str) -> type:
        """The pass class registered as ``name`` (imported now if it is lazy)."""
        try:
            return resolved(self.passes[name])  # type: ignore[no-any-return]
        except KeyError:
            known = ", ".join(sorted(self.passes))
            raise AlpaError(
                f"unknown pass '{name}'; known passes: {known}{self.load_error_hint()}"
            ) from None

    def get(self, kind: str, name: str) -> Any:
        """Look up a contribution of ``kind`` (e.g. ``"solvers"``) by name."""
        table: Mapping[str, Any] = getattr(self, kind)
        try:
            return table[name]
        except KeyError:
            singular = _singular(kind)
            known = ", ".join(sorted(table)) or "none"
            raise AlpaError(
                f"unknown {singular} '{name}'; known: {known}{self.load_error_hint()}"
            ) from None


_TABLES: tuple[tuple[str, str], ...] = (
    ("passes", "alpa_ir_passes"),
    ("solvers", "alpa_ir_solvers"),
    ("backends", "alpa_ir_backends"),
    ("cost_models", "alpa_ir_cost_models"),
    ("stage_cost_models", "alpa_ir_stage_cost_models"),
    ("sharding_rules", "alpa_ir_sharding_rules"),
    ("cluster_presets", "alpa_ir_cluster_presets"),
    ("pipelines", "alpa_ir_pipelines"),
    ("schedules", "alpa_ir_schedules"),
)


_ON_FIRST_USE = frozenset({"sharding_rules", "cluster_presets"})
"""Tables whose hooks import much (the rules and presets need the dialects,
hence JAX): merged when first used, so that ``--list-passes`` imports neither."""


class _TableOnFirstUse(Mapping[str, Any]):
    """A table merged from its hook when first read (then fixed)."""

    def __init__(self, merge: Callable[[], dict[str, Any]]) -> None:
        self._merge = merge
        self._merged: Mapping[str, Any] | None = None

    def _table(self) -> Mapping[str, Any]:
        if self._merged is None:
            self._merged = MappingProxyType(self._merge())
        return self._merged

    def __getitem__(self, name: str) -> Any:
        return self._table()[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self._table())

    def __len__(self) -> int:
        return len(self._table())


class _Owners(Mapping[tuple[str, str], str]):
    """``(table, name) -> plugin``; reading an entry of a table merged on first
    use merges it first."""

    def __init__(self, owners: dict[tuple[str, str], str], later: Mapping[str, Any]) -> None:
        self._owners, self._later = owners, later

    def _all(self) -> dict[tuple[str, str], str]:
        for table in self._later.values():
            len(table)  # merge it
        return self._owners

    def __getitem__(self, key: tuple[str, str]) -> str:
        table = self._later.get(key[0])
        if table is not None:
            len(table)
        return self._owners[key]

    def __iter__(self) -> Iterator[tuple[str, str]]:
        return iter(dict(self._all()))

    def __len__(self) -> int:
        return len(self._all())


def _singular(table: str) -> str:
    """``passes`` -> ``pass``, ``cost_models`` -> ``cost model``."""
    word = table[:-2] if table.endswith("sses") else table[:-1]
    return word.replace("_", " ")


def _import_plugin(spec: str) -> ModuleType:
    try:
        return importlib.import_module(spec)
    except Exception as exc:  # any exception of a plugin's import is the plugin's failure
        raise PluginLoadError(
            f"plugin '{spec}' failed to load: {type(exc).__name__}: {exc}"
        ) from exc


def _entry_point_plugins() -> list[tuple[str, Any | None, str | None]]:
    """(name, plugin object or None, error or None) for the ``alpa_ir`` entry points."""
    from importlib.metadata import entry_points

    found: list[tuple[str, Any | None, str | None]] = []
    for ep in entry_points(group=PROJECT_NAME):
        try:
            found.append((ep.name, ep.load(), None))
        except Exception as exc:  # a broken third-party plugin must not take the tool down
            found.append((ep.name, None, f"'{ep.name}' ({type(exc).__name__}: {exc})"))
    return found


def _contributions(
    pm: pluggy.PluginManager, hook_name: str
) -> list[tuple[str, Iterable[tuple[str, Any]]]]:
    hook = getattr(pm.hook, hook_name)
    results: list[tuple[str, Iterable[tuple[str, Any]]]] = []
    for impl in hook.get_hookimpls():
        plugin_name = pm.get_name(impl.plugin) or repr(impl.plugin)
        try:
            value = impl.function()
        except Exception as exc:
            raise PluginLoadError(
                f"plugin '{plugin_name}' failed in {hook_name}: {type(exc).__name__}: {exc}"
            ) from exc
        if value is None:
            continue
        if isinstance(value, Mapping):
            items: Iterable[tuple[str, Any]] = value.items()
        else:
            items = ((_contribution_name(hook_name, plugin_name, v), v) for v in value)
        results.append((plugin_name, list(items)))
    return results


def _contribution_name(hook_name: str, plugin_name: str, value: Any) -> str:
    name = getattr(value, "name", None)
    if not isinstance(name, str):
        raise PluginLoadError(
            f"plugin '{plugin_name}' returned from {hook_name} an object without a "
            f"string 'name': {value!r}"
        )
    return name


def load_registry(
    extra_plugins: Sequence[str | object] = (),
    *,
    entry_points: bool = True,
    builtin: bool = True,
) -> PluginRegistry:
    """Build a registry from the built-in plugin, the installed entry points and
    ``extra_plugins`` (module names to import, or plugin objects).

    An explicitly requested plugin that fails raises :class:`PluginLoadError`;
    an entry-point plugin that fails is recorded in ``load_errors`` and warned about.
    """
    pm = pluggy.PluginManager(PROJECT_NAME)
    pm.add_hookspecs(AlpaIrHookSpecs)
    load_errors: list[str] = []
    if builtin:
        from alpa_ir.plugins import builtin as builtin_plugin

        pm.register(builtin_plugin, name="builtin")
    if entry_points:
        for name, plugin, error in _entry_point_plugins():
            if error is not None:
                load_errors.append(error)
                warnings.warn(f"alpa_ir plugin {error} failed to load", stacklevel=2)
            elif pm.get_plugin(name) is None:
                pm.register(plugin, name=name)
    for spec in extra_plugins:
        plugin = _import_plugin(spec) if isinstance(spec, str) else spec
        name = spec if isinstance(spec, str) else repr(spec)
        if pm.get_plugin(name) is None and not pm.is_registered(plugin):
            try:
                pm.register(plugin, name=name)
            except Exception as exc:
                raise PluginLoadError(f"plugin '{name}' failed to register: {exc}") from exc
            if isinstance(spec, str) and not pm.get_hookcallers(plugin):
                hooks = ", ".join(sorted({"alpa_ir_dialects", *(h for _, h in _TABLES)}))
                raise PluginLoadError(
                    f"plugin '{name}' contributes nothing: it implements none of the hooks "
                    f"({hooks})"
                )

    owners: dict[tuple[str, str], str] = {}

    def merge(table: str, hook_name: str) -> dict[str, Any]:
        merged: dict[str, Any] = {}
        for plugin_name, items in _contributions(pm, hook_name):
            for name, value in items:
                if name in merged:
                    raise PluginLoadError(
                        f"{_singular(table)} '{name}' is contributed twice: by "
                        f"plugin '{owners[(table, name)]}' and by plugin '{plugin_name}'"
                    )
                merged[name] = value
                owners[(table, name)] = plugin_name
        return merged

    tables: dict[str, Mapping[str, Any]] = {}
    for table, hook_name in (("dialects", "alpa_ir_dialects"), *_TABLES):
        if table in _ON_FIRST_USE:
            tables[table] = _TableOnFirstUse(functools.partial(merge, table, hook_name))
        else:
            tables[table] = MappingProxyType(merge(table, hook_name))
    return PluginRegistry(
        **tables,
        owners=_Owners(owners, {k: v for k, v in tables.items() if k in _ON_FIRST_USE}),
        plugin_names=tuple(n for n, _ in pm.list_name_plugin()),
        load_errors=tuple(load_errors),
        explicit_plugins=tuple(spec for spec in extra_plugins if isinstance(spec, str)),
    )


@functools.cache
def default_registry() -> PluginRegistry:
    """The registry of the built-in plugin and the installed entry points (built once)."""
    return load_registry()


def registry_of(ctx: object) -> PluginRegistry:
    """The registry a pass should use: the one its context carries (see
    ``alpa_ir.ir.context.AlpaContext``), else the default one."""
    registry = getattr(ctx, "registry", None)
    return registry if isinstance(registry, PluginRegistry) else default_registry()
