"""Hook specifications of the ``alpa_ir`` plugin system (pluggy project name ``alpa_ir``).

A plugin is any Python object or module with functions marked ``@hookimpl`` whose
names match the specs below. Each hook returns a sequence (or mapping) of
contributions; the registry merges the contributions of all plugins and rejects
duplicate names. Everything built in is contributed by ``alpa_ir.plugins.builtin``
through these same hooks.

Third-party plugins are found through the entry-point group ``alpa_ir``::

    [project.entry-points.alpa_ir]
    my_plugin = "my_package.my_plugin"

or loaded explicitly with ``alpa-opt --load-plugin=my_package.my_plugin``.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

import pluggy

if TYPE_CHECKING:
    from xdsl.ir import Dialect
    from xdsl.passes import ModulePass

PROJECT_NAME = "alpa_ir"

hookspec = pluggy.HookspecMarker(PROJECT_NAME)
hookimpl = pluggy.HookimplMarker(PROJECT_NAME)


class AlpaIrHookSpecs:
    """The hooks a plugin may implement. Every hook is optional."""

    @hookspec
    def alpa_ir_dialects(self) -> Sequence[Dialect]:
        """xDSL dialects to load into the parsing context."""
        raise NotImplementedError

    @hookspec
    def alpa_ir_passes(self) -> Sequence[type[ModulePass]]:
        """Pass classes: frozen dataclasses subclassing ``xdsl.passes.ModulePass``
        with a kebab-case ``name``; their fields are their options."""
        raise NotImplementedError

    @hookspec
    def alpa_ir_solvers(self) -> Mapping[str, Callable[[], Any]]:
        """ILP solvers by name: a factory returning an object with
        ``solve(problem, time_limit) -> solution`` (see ``alpa_ir.solvers.ilp``)."""
        raise NotImplementedError

    @hookspec
    def alpa_ir_backends(self) -> Mapping[str, Callable[[], Any]]:
        """Backends by name (``xla``, ``ray``, ``simulate``): a factory returning
        an object that executes or estimates a compiled module."""
        raise NotImplementedError

    @hookspec
    def alpa_ir_cost_models(self) -> Mapping[str, Callable[[], Any]]:
        """Communication cost models by name (the default is ``alpha-beta``)."""
        raise NotImplementedError

    @hookspec
    def alpa_ir_stage_cost_models(self) -> Mapping[str, Callable[[Any], Any]]:
        """Stage cost models by name (``analytical``, ``profile``): factories
        called with the ``StageCostOptions`` of ``construct-stages``' options."""
        raise NotImplementedError

    @hookspec
    def alpa_ir_sharding_rules(self) -> Mapping[str, Any]:
        """Sharding rules by primitive name (e.g. ``dot_general``)."""
        raise NotImplementedError

    @hookspec
    def alpa_ir_cluster_presets(self) -> Mapping[str, Callable[[], Any]]:
        """Cluster / system presets by name: a factory returning a cluster description."""
        raise NotImplementedError

    @hookspec
    def alpa_ir_pipelines(self) -> Mapping[str, Any]:
        """Named pass pipelines (MLIR's ``PassPipelineRegistration``) by name: a
        :class:`alpa_ir.plugins.registry.NamedPipeline` (description and the
        pipeline text it stands for); a pipeline string may name one like a pass."""
        raise NotImplementedError

    @hookspec
    def alpa_ir_schedules(self) -> Mapping[str, Callable[..., Any]]:
        """Pipeline schedules by name: a builder ``(meshes, micro_batches,
        virtual_stages, stage_times or None) -> TaskOrder`` (see
        ``alpa_ir.pipeline.schedule_kinds``); ``emit-instructions{schedule=}``
        and ``construct-stages{schedule=}`` accept the name."""
        raise NotImplementedError
