"""The table of JAX primitives that have a dedicated op in the ``lax`` dialect.

One entry per primitive: its parameters with their codecs, the parameters
that are sub-computations (kept as regions), and its kind, which later passes
use (``merge-trivial-ops`` merges the trivial kinds; sharding rules key on the
primitive name). The table matches jax 0.10; a parameter JAX adds or drops
shows up as a clear import or execution error naming the primitive.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import Enum
from types import MappingProxyType

from alpa_ir.dialects.lax_params import (
    BOOL,
    CONV_DIMS,
    DOT_DIMS,
    DROPPED,
    DTYPE,
    GATHER_DIMS,
    GATHER_MODE,
    INT,
    INTS,
    MEMORY_SPACE,
    NONE_ONLY,
    OPT_DTYPE,
    OPT_INTS,
    PAIRS,
    PRNG_IMPL,
    ROUNDING,
    SCATTER_DIMS,
    TRIPLES,
    Codec,
    IntOrBoolC,
    NumberC,
    PrecisionC,
    PrimitiveNameC,
    StrC,
)
from alpa_ir.dialects.sharding_hint import HINT


class OpKind(Enum):
    """How an op behaves for the purposes of the passes."""

    ELEMENTWISE = "elementwise"  # same shape in and out, pointwise
    LAYOUT = "layout"  # broadcast, reshape, transpose, squeeze, ...: data movement only
    REDUCTION = "reduction"  # reduces some axes
    CONTRACTION = "contraction"  # dot_general, conv: the heavy ops
    INDEXING = "indexing"  # gather, scatter, dynamic slices
    CONTROL = "control"  # while, scan, cond: regions
    MARKER = "marker"  # identity markers (pipeline boundaries)
    OTHER = "other"


@dataclass(frozen=True)
class PrimitiveSpec:
    """How one primitive becomes one op."""

    name: str
    kind: OpKind
    params: Mapping[str, Codec] = field(default_factory=dict)
    # Parameters holding closed jaxprs, kept as regions, in this order.
    region_params: tuple[str, ...] = ()
    # A parameter holding a tuple of closed jaxprs (``cond``'s branches).
    variadic_region_param: str | None = None
    # Parameters that JAX needs but that are rebuilt on export, not stored.
    rebuilt_params: tuple[str, ...] = ()

    @property
    def op_name(self) -> str:
        return "lax." + self.name.replace("-", "_")


_ACCURACY = {"accuracy": NONE_ONLY}

_UNARY_PLAIN = (
    "neg sign floor ceil is_finite abs not erf erfc erf_inv lgamma digamma square real imag "
    "population_count clz stop_gradient copy asin acos atan sinh cosh asinh acosh atanh "
    "bessel_i0e bessel_i1e"
).split()
_UNARY_ACCURACY = "exp exp2 expm1 log log1p logistic sin cos tan tanh sqrt rsqrt cbrt".split()
_BINARY = (
    "add sub div rem pow max min atan2 nextafter and or xor eq ne lt le gt ge "
    "shift_left shift_right_logical shift_right_arithmetic add_any complex igamma igammac "
    "polygamma zeta"
).split()

_WINDOW = {
    "window_dimensions": INTS,
    "window_strides": INTS,
    "padding": PAIRS,
    "base_dilation": INTS,
    "window_dilation": INTS,
}
_SCATTER = {
    "dimension_numbers": SCATTER_DIMS,
    "indices_are_sorted": BOOL,
    "unique_indices": BOOL,
    "mode": GATHER_MODE,
}
_CUMULATIVE = {"axis": INT, "reverse": BOOL}


def _specs() -> list[PrimitiveSpec]:
    e, lay, red = OpKind.ELEMENTWISE, OpKind.LAYOUT, OpKind.REDUCTION
    specs = [PrimitiveSpec(n, e) for n in _UNARY_PLAIN + _BINARY]
    specs += [PrimitiveSpec(n, e, _ACCURACY) for n in _UNARY_ACCURACY]
    specs += [
        PrimitiveSpec("mul", e, {"out_dtype": OPT_DTYPE}),
        PrimitiveSpec("conj", e, {"input_dtype": OPT_DTYPE}),
        PrimitiveSpec("integer_pow", e, {"y": INT}),
        PrimitiveSpec("round", e, {"rounding_method": ROUNDING}),
        PrimitiveSpec("select_n", e),
        PrimitiveSpec("clamp", e),
        PrimitiveSpec(
            "convert_element_type", e, {"new_dtype": DTYPE, "weak_type": BOOL, "sharding": DROPPED}
        ),
        PrimitiveSpec("bitcast_convert_type", e, {"new_dtype": DTYPE}),
        PrimitiveSpec("reduce_precision", e, {"exponent_bits": INT, "mantissa_bits": INT}),
        # Layout ops.
        PrimitiveSpec(
            "broadcast_in_dim",
            lay,
            {"shape": INTS, "broadcast_dimensions": INTS, "sharding": DROPPED},
        ),
        PrimitiveSpec(
            "reshape", lay, {"new_sizes": INTS, "dimensions": OPT_INTS, "sharding": DROPPED}
        ),
        PrimitiveSpec("transpose", lay, {"permutation": INTS}),
        PrimitiveSpec("squeeze", lay, {"dimensions": INTS}),
        PrimitiveSpec("rev", lay, {"dimensions": INTS}),
        PrimitiveSpec("pad", lay, {"padding_config": TRIPLES}),
        PrimitiveSpec("concatenate", lay, {"dimension": INT}),
        PrimitiveSpec("split", lay, {"sizes": INTS, "axis": INT}),
        PrimitiveSpec(
            "slice", lay, {"start_indices": INTS, "limit_indices": INTS, "strides": OPT_INTS}
        ),
        PrimitiveSpec("empty2", OpKind.OTHER, {"dtype": DTYPE, "memory_space": MEMORY_SPACE}),
        PrimitiveSpec(
            "iota",
            OpKind.OTHER,
            {"dtype": DTYPE, "shape": INTS, "dimension": INT, "sharding": DROPPED},
        ),
        # Reductions.
        # out_sharding: reduce_sum's on JAX 0.10, every reduction's since 0.11
        *(
            PrimitiveSpec(n, red, {"axes": INTS, "out_sharding": DROPPED})
            for n in (
                "reduce_sum",
                "reduce_max",
                "reduce_min",
                "reduce_prod",
                "reduce_and",
                "reduce_or",
                "reduce_xor",
            )
        ),
        PrimitiveSpec("argmax", red, {"axes": INTS, "index_dtype": DTYPE}),
        PrimitiveSpec("argmin", red, {"axes": INTS, "index_dtype": DTYPE}),
        *(
            PrimitiveSpec(n, OpKind.OTHER, _CUMULATIVE)
            for n in ("cumsum", "cumprod", "cummax", "cummin", "cumlogsumexp")
        ),
        PrimitiveSpec("sort", OpKind.OTHER, {"dimension": INT, "is_stable": BOOL, "num_keys": INT}),
        PrimitiveSpec("top_k", OpKind.OTHER, {"k": INT, "axis": INT}),
        # Contractions.
        PrimitiveSpec(
            "dot_general",
            OpKind.CONTRACTION,
            {
                "dimension_numbers": DOT_DIMS,
                "precision": PrecisionC(),
                "preferred_element_type": OPT_DTYPE,
                "out_sharding": DROPPED,
            },
        ),
        PrimitiveSpec(
            "conv_general_dilated",
            OpKind.CONTRACTION,
            {
                "window_strides": INTS,
                "padding": PAIRS,
                "lhs_dilation": INTS,
                "rhs_dilation": INTS,
                "dimension_numbers": CONV_DIMS,
                "feature_group_count": INT,
                "batch_group_count": INT,
                "precision": PrecisionC(),
                "preferred_element_type": OPT_DTYPE,
                "out_sharding": DROPPED,
            },
        ),
        # Windowed reductions.
        *(
            PrimitiveSpec(n, OpKind.OTHER, _WINDOW)
            for n in ("reduce_window_sum", "reduce_window_max", "reduce_window_min")
        ),
        PrimitiveSpec(
            "select_and_scatter_add",
            OpKind.OTHER,
            {
                "select_prim": PrimitiveNameC(),
                "window_dimensions": INTS,
                "window_strides": INTS,
                "padding": PAIRS,
            },
        ),
        PrimitiveSpec(
            "select_and_gather_add",
            OpKind.OTHER,
            {
                "select_prim": PrimitiveNameC(),
                "window_dimensions": INTS,
                "window_strides": INTS,
                "padding": PAIRS,
                "base_dilation": INTS,
                "window_dilation": INTS,
            },
        ),
        # Indexing.
        PrimitiveSpec(
            "gather",
            OpKind.INDEXING,
            {
                "dimension_numbers": GATHER_DIMS,
                "slice_sizes": INTS,
                "unique_indices": BOOL,
                "indices_are_sorted": BOOL,
                "mode": GATHER_MODE,
                "fill_value": NumberC(),
            },
        ),
        *(
            PrimitiveSpec(
                n, OpKind.INDEXING, _SCATTER, rebuilt_params=("update_jaxpr", "update_consts")
            )
            for n in (
                "scatter",
                "scatter-add",
                "scatter-mul",
                "scatter-min",
                "scatter-max",
                "scatter-sub",
            )
        ),
        PrimitiveSpec("dynamic_slice", OpKind.INDEXING, {"slice_sizes": INTS}),
        PrimitiveSpec("dynamic_update_slice", OpKind.INDEXING),
        # Control flow: sub-computations are regions.
        PrimitiveSpec(
            "while",
            OpKind.CONTROL,
            {"cond_nconsts": INT, "body_nconsts": INT},
            region_params=("cond_jaxpr", "body_jaxpr"),
        ),
        PrimitiveSpec(
            "scan",
            OpKind.CONTROL,
            {
                "reverse": BOOL,
                "length": INT,
                "num_consts": INT,
                "num_carry": INT,
                "unroll": IntOrBoolC(),
            },
            region_params=("jaxpr",),
        ),
        PrimitiveSpec("cond", OpKind.CONTROL, variadic_region_param="branches"),
        # Random numbers: typed keys (``!lax.key<fry>``) and the bits drawn from them.
        PrimitiveSpec("random_seed", OpKind.OTHER, {"impl": PRNG_IMPL}),
        PrimitiveSpec("random_wrap", OpKind.OTHER, {"impl": PRNG_IMPL}),
        PrimitiveSpec("random_unwrap", OpKind.OTHER),
        PrimitiveSpec("random_bits", OpKind.OTHER, {"bit_width": INT, "shape": INTS}),
        PrimitiveSpec(
            "random_bits_rows",
            OpKind.OTHER,
            {"bit_width": INT, "shape": INTS, "global_shape": INTS},
        ),
        PrimitiveSpec("random_split_rows", OpKind.OTHER, {"shape": INTS, "global_shape": INTS}),
        PrimitiveSpec("random_split", OpKind.OTHER, {"shape": INTS}),
        PrimitiveSpec("random_fold_in", OpKind.OTHER),
        PrimitiveSpec("random_clone", OpKind.OTHER),
        PrimitiveSpec("threefry2x32", OpKind.OTHER),
        # Markers and barriers.
        PrimitiveSpec("pipeline_marker", OpKind.MARKER, {"kind": StrC()}),
        PrimitiveSpec("optimization_barrier", OpKind.MARKER),
        # A user's sharding hint (jax.lax.with_sharding_constraint): an identity
        # that auto-sharding keeps as a constraint (alpa_ir.dialects.sharding_hint).
        PrimitiveSpec(
            "sharding_constraint",
            OpKind.ELEMENTWISE,
            {
                "sharding": HINT,
                "layout": NONE_ONLY,
                "unconstrained_dims": DROPPED,
                "context_mesh": DROPPED,
            },
        ),
        PrimitiveSpec(
            "reshard", OpKind.ELEMENTWISE, {"dst_sharding": HINT, "concrete_mesh": DROPPED}
        ),
    ]
    return specs


def _table() -> Mapping[str, PrimitiveSpec]:
    table = {s.name: s for s in _specs()}
    assert len(table) == len(_specs()), "duplicate primitive in the lax table"
    return MappingProxyType(table)


PRIMITIVES: Mapping[str, PrimitiveSpec] = _table()
"""Primitive name -> spec, for every primitive with a dedicated op (read-only)."""

BOUND_AS_IDENTITY = frozenset({"sharding_constraint", "reshard"})
"""Primitives bound back to JAX as the identity: their effect is the plan's (a hint's
spec is enforced by the planned program, and a one-device run has nothing to shard)."""

# Primitives whose call is inlined on import (their body replaces them).
INLINED_PRIMITIVES = frozenset(
    {
        "jit",
        "pjit",
        "closed_call",
        "core_call",
        "custom_jvp_call",
        "custom_vjp_call",
        "custom_vjp_call_jaxpr",
        "remat2",
        "checkpoint",
        "custom_lin",
    }
)
