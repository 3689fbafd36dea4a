"""Pipeline strings: MLIR and flat syntax, typed options, errors, canonical form."""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import ClassVar, Literal

import pytest
from hypothesis import given
from hypothesis import strategies as st
from xdsl.context import Context
from xdsl.dialects.builtin import ModuleOp
from xdsl.passes import ModulePass

from alpa_ir.errors import PipelineError
from alpa_ir.passmanager.pipeline_syntax import (
    build_passes,
    format_pipeline,
    parse_pipeline,
    parse_pipeline_spec,
)
from alpa_ir.plugins.hookspecs import hookimpl
from alpa_ir.plugins.registry import PluginRegistry, load_registry


class Level(enum.Enum):
    LOW = "low"
    HIGH = "high"


@dataclass(frozen=True)
class AutoSharding(ModulePass):
    """A pass with one option of each supported type."""

    name: ClassVar[str] = "auto-sharding"

    solver: Literal["cbc", "highs"] = "cbc"
    time_limit: float = 60.0
    max_iters: int = 10
    verbose: bool = False
    label: str = "plan"
    mesh: tuple[int, ...] = (2, 4)
    shape: tuple[int, str] = (1, "x")
    tag: str | None = None
    limit: int | None = None
    level: Level = Level.LOW
    names: tuple[str, ...] = ()

    def apply(self, ctx: Context, op: ModuleOp) -> None:
        del ctx, op


@dataclass(frozen=True)
class MergeTrivialOps(ModulePass):
    """A pass without options."""

    name: ClassVar[str] = "merge-trivial-ops"

    def apply(self, ctx: Context, op: ModuleOp) -> None:
        del ctx, op


@dataclass(frozen=True)
class NeedsMesh(ModulePass):
    """A pass with a required option and its own validation."""

    name: ClassVar[str] = "needs-mesh"

    devices: int = field(metadata={"help": "number of devices"})

    def __post_init__(self) -> None:
        if self.devices <= 0:
            raise ValueError("devices must be positive")

    def apply(self, ctx: Context, op: ModuleOp) -> None:
        del ctx, op


class _Plugin:
    @hookimpl
    def alpa_ir_passes(self) -> list[type[ModulePass]]:
        return [AutoSharding, MergeTrivialOps, NeedsMesh]


@pytest.fixture(scope="module")
def registry() -> PluginRegistry:
    return load_registry([_Plugin()], builtin=False, entry_points=False)


def test_mlir_and_flat_forms_give_the_same_passes(registry: PluginRegistry) -> None:
    mlir = "builtin.module(merge-trivial-ops,auto-sharding{solver=highs time-limit=5})"
    flat = "merge-trivial-ops,auto-sharding{solver=highs time-limit=5}"
    spaced = "  builtin.module ( merge-trivial-ops , auto-sharding{ solver=highs  time-limit=5 } ) "
    expected = [MergeTrivialOps(), AutoSharding(solver="highs", time_limit=5.0)]
    assert parse_pipeline(mlir, registry) == expected
    assert parse_pipeline(flat, registry) == expected
    assert parse_pipeline(spaced, registry) == expected


def test_empty_pipelines(registry: PluginRegistry) -> None:
    assert parse_pipeline("", registry) == []
    assert parse_pipeline("builtin.module()", registry) == []


def test_raw_values_keep_what_was_written() -> None:
    [spec] = parse_pipeline_spec('p{a=1,2 b="x y" c d={} e={3, 4}}')
    assert spec.name == "p"
    assert [i.text for i in spec.options["a"].items or ()] == ["1", "2"]
    assert spec.options["b"].items is not None and spec.options["b"].items[0].quoted
    assert spec.options["b"].items[0].text == "x y"
    assert spec.options["c"].items is None
    assert spec.options["d"].items == ()
    assert [i.text for i in spec.options["e"].items or ()] == ["3", "4"]


def test_options_are_converted_by_field_type(registry: PluginRegistry) -> None:
    [p] = parse_pipeline(
        'auto-sharding{solver=highs time-limit=1e-3 max-iters=0x10 verbose label="a \\"b\\"" '
        "mesh=1,8 shape=3,y tag=none limit=7 level=HIGH names={a,b}}",
        registry,
    )
    assert p == AutoSharding(
        solver="highs",
        time_limit=0.001,
        max_iters=16,
        verbose=True,
        label='a "b"',
        mesh=(1, 8),
        shape=(3, "y"),
        tag=None,
        limit=7,
        level=Level.HIGH,
        names=("a", "b"),
    )


def test_snake_case_option_names_are_accepted(registry: PluginRegistry) -> None:
    [p] = parse_pipeline("auto-sharding{time_limit=3 max-iters=4}", registry)
    assert (p.time_limit, p.max_iters) == (3.0, 4)


def test_key_without_value_means_true_none_or_empty(registry: PluginRegistry) -> None:
    [p] = parse_pipeline("auto-sharding{verbose tag limit names}", registry)
    assert (p.verbose, p.tag, p.limit, p.names) == (True, None, None, ())


@pytest.mark.parametrize(
    ("pipeline", "message"),
    [
        (
            "auto-sharding{time-limit=abc}",
            "option 'time-limit' of pass 'auto-sharding' expects float, got 'abc'",
        ),
        (
            "auto-sharding{solver=glpk}",
            "option 'solver' of pass 'auto-sharding' expects one of 'cbc', 'highs', got 'glpk'",
        ),
        (
            "auto-sharding{mesh=1,x}",
            "option 'mesh' of pass 'auto-sharding' expects tuple[int, ...], got '1,x'",
        ),
        (
            "auto-sharding{shape=1,2,3}",
            "option 'shape' of pass 'auto-sharding' expects tuple[int, str], got '1,2,3'",
        ),
        (
            "auto-sharding{max-iters=1,2}",
            "option 'max-iters' of pass 'auto-sharding' expects int, got '1,2'",
        ),
        (
            "auto-sharding{verbose=maybe}",
            "option 'verbose' of pass 'auto-sharding' expects bool, got 'maybe'",
        ),
        (
            "auto-sharding{max-iters}",
            "option 'max-iters' of pass 'auto-sharding' expects int, got no value",
        ),
        (
            "auto-sharding{level=medium}",
            "option 'level' of pass 'auto-sharding' expects one of 'LOW', 'HIGH', got 'medium'",
        ),
    ],
)
def test_ill_typed_values_name_pass_option_type_and_value(
    registry: PluginRegistry, pipeline: str, message: str
) -> None:
    with pytest.raises(PipelineError) as info:
        parse_pipeline(pipeline, registry)
    assert str(info.value) == message


def test_unknown_option_lists_the_options(registry: PluginRegistry) -> None:
    with pytest.raises(PipelineError) as info:
        parse_pipeline("auto-sharding{time-limt=3}", registry)
    assert str(info.value).startswith(
        "unknown option 'time-limt' of pass 'auto-sharding'; its options: solver, time-limit, "
    )
    with pytest.raises(PipelineError, match="it has no options"):
        parse_pipeline("merge-trivial-ops{x=1}", registry)


def test_unknown_pass_lists_the_known_ones(registry: PluginRegistry) -> None:
    with pytest.raises(PipelineError) as info:
        parse_pipeline("merge-trivial-op", registry)
    assert str(info.value) == (
        "unknown pass 'merge-trivial-op' (did you mean 'merge-trivial-ops'?); "
        "known passes: auto-sharding, merge-trivial-ops, needs-mesh"
    )


def test_required_options_and_pass_validation(registry: PluginRegistry) -> None:
    with pytest.raises(PipelineError, match=r"pass 'needs-mesh' requires option 'devices' \(int\)"):
        parse_pipeline("needs-mesh", registry)
    with pytest.raises(PipelineError, match="invalid options for pass 'needs-mesh': devices must"):
        parse_pipeline("needs-mesh{devices=0}", registry)
    assert parse_pipeline("needs-mesh{devices=8}", registry) == [NeedsMesh(devices=8)]


@pytest.mark.parametrize(
    ("pipeline", "message"),
    [
        ("builtin.module(a,b", "malformed pipeline at column 19: expected ')', found the end"),
        ("builtin.module(a,b}", "malformed pipeline at column 19: expected ')', found '}'"),
        ("a b", "malformed pipeline at column 3: expected ',' between passes, found 'b'"),
        ("a,,b", "malformed pipeline at column 3: expected a pass name, found ','"),
        ("a{k=1", "malformed pipeline at column 6: expected a space or '}' after the value"),
        ('a{k="x}', "malformed pipeline at column 8: expected '\"' closing the string opened at"),
        ("a{k:1}", "malformed pipeline at column 4: expected '=', a space or '}' after option"),
        ("a{k=1 k=2}", "malformed pipeline at column 7: option 'k' of pass 'a' is given twice"),
        ("a{k=}", "malformed pipeline at column 5: expected an option value, found '}'"),
        ("builtin.module(func.func(a))", "malformed pipeline at column 16: nested pipeline"),
        ("func.func(a)", "malformed pipeline at column 1: nested pipeline 'func.func(...)'"),
    ],
)
def test_malformed_pipelines_say_where(pipeline: str, message: str) -> None:
    with pytest.raises(PipelineError) as info:
        parse_pipeline_spec(pipeline)
    assert str(info.value).startswith(message)
    assert "\n" not in str(info.value)


def test_format_pipeline_spells_out_every_option(registry: PluginRegistry) -> None:
    passes = [MergeTrivialOps(), AutoSharding(solver="highs", tag="a b")]
    text = format_pipeline(passes)
    assert text == (
        "builtin.module(merge-trivial-ops,auto-sharding{solver=highs time-limit=60.0 "
        'max-iters=10 verbose=false label=plan mesh=2,4 shape=1,x tag="a b" limit=none '
        "level=LOW names={}})"
    )
    assert parse_pipeline(text, registry) == passes


def test_strings_that_read_as_other_types_are_quoted(registry: PluginRegistry) -> None:
    passes = [AutoSharding(label="none", tag="none", names=("1", "true", ""))]
    text = format_pipeline(passes)
    assert 'tag="none"' in text and 'names="1","true",""' in text
    assert parse_pipeline(text, registry) == passes


_texts = st.text(max_size=12)


@given(
    solver=st.sampled_from(["cbc", "highs"]),
    time_limit=st.floats(allow_nan=False),
    max_iters=st.integers(),
    verbose=st.booleans(),
    label=_texts,
    mesh=st.lists(st.integers(-5, 5), max_size=4).map(tuple),
    shape=st.tuples(st.integers(), _texts),
    tag=st.none() | _texts,
    limit=st.none() | st.integers(),
    level=st.sampled_from(Level),
    names=st.lists(_texts, max_size=3).map(tuple),
)
def test_format_then_parse_round_trips(**options: object) -> None:
    registry = load_registry([_Plugin()], builtin=False, entry_points=False)
    passes = [AutoSharding(**options), MergeTrivialOps()]  # type: ignore[arg-type]
    assert parse_pipeline(format_pipeline(passes), registry) == passes


def test_build_passes_rejects_registry_entries_that_are_not_passes() -> None:
    class NotAPass:
        name = "not-a-pass"

    class _Bad:
        @hookimpl
        def alpa_ir_passes(self) -> list[type]:
            return [NotAPass]

    registry = load_registry([_Bad()], builtin=False, entry_points=False)
    with pytest.raises(PipelineError, match=r"pass 'not-a-pass' of plugin .* is not a subclass"):
        build_passes(parse_pipeline_spec("not-a-pass"), registry)
