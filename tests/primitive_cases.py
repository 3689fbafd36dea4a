"""Small JAX functions that between them use every primitive of the lax table.

Each case is (name, function, example arguments). Used by the dialect tests
(import -> print -> parse -> print, execute == JAX) and to count coverage.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from alpa_ir.frontend.markers import mark_pipeline_boundary, value_and_grad

_rng = np.random.default_rng(0)
X = jnp.asarray(_rng.uniform(0.1, 0.9, (4, 8)), jnp.float32)
Y = jnp.asarray(_rng.uniform(0.1, 0.9, (4, 8)), jnp.float32)
IDX = jnp.asarray([3, 1, 2, 0], jnp.int32)
U = jnp.asarray([3, 1, 2, 7], jnp.uint32)
IMG = jnp.asarray(_rng.normal(size=(2, 6, 6, 3)), jnp.float32)
KER = jnp.asarray(_rng.normal(size=(3, 3, 3, 4)), jnp.float32)

Case = tuple[str, Callable[..., Any], tuple[Any, ...]]


def _unary() -> list[Case]:
    fns = {
        "neg": lax.neg,
        "sign": lax.sign,
        "floor": lax.floor,
        "ceil": lax.ceil,
        "is_finite": lax.is_finite,
        "abs": lax.abs,
        "erf": lax.erf,
        "erfc": lax.erfc,
        "erf_inv": lambda x: lax.erf_inv(x - 0.5),
        "lgamma": lax.lgamma,
        "digamma": lax.digamma,
        "square": lax.square,
        "stop_gradient": lax.stop_gradient,
        "copy": lax.copy_p.bind,
        "asin": lax.asin,
        "acos": lax.acos,
        "atan": lax.atan,
        "sinh": lax.sinh,
        "cosh": lax.cosh,
        "asinh": lax.asinh,
        "acosh": lambda x: lax.acosh(x + 1.0),
        "atanh": lax.atanh,
        "bessel_i0e": lax.bessel_i0e,
        "bessel_i1e": lax.bessel_i1e,
        "exp": lax.exp,
        "exp2": lax.exp2,
        "expm1": lax.expm1,
        "log": lax.log,
        "log1p": lax.log1p,
        "logistic": lax.logistic,
        "sin": lax.sin,
        "cos": lax.cos,
        "tan": lax.tan,
        "tanh": lax.tanh,
        "sqrt": lax.sqrt,
        "rsqrt": lax.rsqrt,
        "cbrt": lax.cbrt,
        "integer_pow": lambda x: x**3,
        "round": jnp.round,
        "reduce_precision": lambda x: lax.reduce_precision(x, 5, 10),
        "convert_element_type": lambda x: x.astype(jnp.bfloat16).astype(jnp.float32),
        "bitcast_convert_type": lambda x: lax.bitcast_convert_type(x, jnp.int32),
        "real_imag_complex_conj": lambda x: (
            lax.real(lax.conj(lax.complex(x, x))) + lax.imag(lax.complex(x, x))
        ),
    }
    return [(n, f, (X,)) for n, f in fns.items()]


def _binary() -> list[Case]:
    fns = {
        "add": lax.add,
        "sub": lax.sub,
        "mul": lax.mul,
        "div": lax.div,
        "rem": lax.rem,
        "pow": lax.pow,
        "max": lax.max,
        "min": lax.min,
        "atan2": lax.atan2,
        "nextafter": lax.nextafter,
        "eq": lax.eq,
        "ne": lax.ne,
        "lt": lax.lt,
        "le": lax.le,
        "gt": lax.gt,
        "ge": lax.ge,
        "igamma": lax.igamma,
        "igammac": lax.igammac,
        "zeta": lambda x, y: lax.zeta(x + 1.5, y),
        "polygamma": lambda x, y: lax.polygamma(jnp.ones_like(x), y),
        "select_n": lambda x, y: lax.select_n(x > y, x, y),
        "clamp": lambda x, y: lax.clamp(0.3, x, 0.6) + y,
    }
    cases: list[Case] = [(n, f, (X, Y)) for n, f in fns.items()]
    ints = {
        "and_or_xor_not": lambda a, b: (a & b) | (a ^ b) | ~a,
        "shifts": lambda a, b: (
            lax.shift_left(a, b) + lax.shift_right_logical(a, b) + lax.shift_right_arithmetic(a, b)
        ),
        "population_count_clz": lambda a, b: lax.population_count(a) + lax.clz(b),
    }
    cases += [(n, f, (IDX, IDX)) for n, f in ints.items()]
    cases.append(("unsigned", lambda u: u * 3 + (u >> 1), (U,)))
    cases.append(("add_any", lambda x: jax.grad(lambda a: jnp.sum(a * a + jnp.sin(a)))(x), (X,)))
    return cases


def _layout_and_reductions() -> list[Case]:
    fns: dict[str, Callable[..., Any]] = {
        "broadcast_reshape_transpose": lambda x: x.reshape(2, 16).T[None] + 1.0,
        "squeeze_rev": lambda x: lax.rev(x[None], (2,))[0],
        "pad": lambda x: lax.pad(x, 0.5, ((1, 2, 1), (0, -1, 0))),
        "concatenate_split": lambda x: jnp.split(jnp.concatenate([x, x], 1), 4, 1)[1],
        "slice": lambda x: x[1:3, ::3],
        "iota": lambda x: x + lax.iota(jnp.float32, 8),
        "reduce_sum_max_min_prod": lambda x: x.sum(0) + x.max(1).sum() + x.min() * x.prod(),
        "reduce_and_or_xor": lambda x: (
            jnp.all(x > 0.2) | jnp.any(x > 0.8) | lax.reduce_xor_p.bind(x > 0.5, axes=(0, 1))
        ),
        "argmax_argmin": lambda x: jnp.argmax(x, 1) + jnp.argmin(x, 0).sum(),
        "cumulative": lambda x: (
            lax.cumsum(x, 0)
            + lax.cumprod(x, 1)
            + lax.cummax(x, 0)
            + lax.cummin(x, 1, reverse=True)
            + lax.cumlogsumexp(x, 0)
        ),
        "sort": lambda x: lax.sort((x, x * 2), dimension=1, num_keys=1)[1],
        "top_k": lambda x: lax.top_k(x, 3)[0].sum() + lax.top_k(x, 2)[1].sum(),
        "dot_general": lambda x: jnp.einsum("ij,kj->ik", x, x, precision=lax.Precision.HIGHEST),
        "batched_dot": lambda x: jnp.einsum("bij,bkj->bik", x.reshape(2, 2, 8), x.reshape(2, 2, 8)),
    }
    return [(n, f, (X,)) for n, f in fns.items()]


def _indexing() -> list[Case]:
    return [
        ("gather", lambda x, i: x[i] + x[:, i].sum(), (X, IDX)),
        ("scatter_add", lambda x, i: x.at[i].add(1.0), (X, IDX)),
        ("scatter", lambda x, i: x.at[i].set(2.0), (X, IDX)),
        (
            "scatter_mul_min_max",
            lambda x, i: x.at[i].mul(2.0) + x.at[i].min(0.5) + x.at[i].max(0.5),
            (X, IDX),
        ),
        ("dynamic_slice", lambda x, i: lax.dynamic_slice(x, (i[1], 0), (2, 4)), (X, IDX)),
        (
            "dynamic_update_slice",
            lambda x, i: lax.dynamic_update_slice(x, x[:2, :2] * 3, (i[1], i[2])),
            (X, IDX),
        ),
        ("one_hot", lambda x, i: jax.nn.one_hot(i, 8) @ x.T, (X, IDX)),
        (
            "scatter_sub",
            lambda x, i: lax.scatter_sub(
                x,
                i[:, None],
                jnp.ones((4, 8)),
                lax.ScatterDimensionNumbers((1,), (0,), (0,)),
            ),
            (X, IDX),
        ),
    ]


def _windows_and_conv() -> list[Case]:
    conv = lambda im, k: lax.conv_general_dilated(  # noqa: E731
        im, k, (1, 1), "SAME", dimension_numbers=("NHWC", "HWIO", "NHWC")
    )
    return [
        ("conv_general_dilated", conv, (IMG, KER)),
        (
            "conv_grad",
            lambda im, k: jax.grad(lambda a, b: jnp.sum(conv(a, b) ** 2), (0, 1))(im, k),
            (IMG, KER),
        ),
        (
            "reduce_window_sum",
            lambda im: lax.reduce_window(im, 0.0, lax.add, (1, 2, 2, 1), (1, 2, 2, 1), "VALID"),
            (IMG,),
        ),
        (
            "reduce_window_max_min",
            lambda im: (
                lax.reduce_window(im, -jnp.inf, lax.max, (1, 3, 3, 1), (1, 1, 1, 1), "SAME")
                + lax.reduce_window(im, jnp.inf, lax.min, (1, 2, 2, 1), (1, 1, 1, 1), "SAME")
            ),
            (IMG,),
        ),
        (
            "select_and_gather_add",
            lambda im: jax.jvp(
                lambda a: lax.reduce_window(
                    a, -jnp.inf, lax.max, (1, 2, 2, 1), (1, 2, 2, 1), "VALID"
                ),
                (im,),
                (im * 2,),
            )[1],
            (IMG,),
        ),
        (
            "select_and_scatter_add",
            lambda im: jax.grad(
                lambda a: jnp.sum(
                    lax.reduce_window(a, -jnp.inf, lax.max, (1, 2, 2, 1), (1, 2, 2, 1), "VALID")
                    ** 2
                )
            )(im),
            (IMG,),
        ),
    ]


def _control_flow() -> list[Case]:
    return [
        (
            "while",
            lambda x: lax.while_loop(lambda c: c[0] < 3, lambda c: (c[0] + 1, c[1] * 1.5), (0, x))[
                1
            ],
            (X,),
        ),
        ("fori_loop_consts", lambda x, y: lax.fori_loop(0, 3, lambda k, c: c + y * k, x), (X, Y)),
        ("scan", lambda x: lax.scan(lambda c, a: (c + a, c * a), x[0], x), (X,)),
        ("cond", lambda x: lax.cond(x[0, 0] > 0.5, lambda a: a + 1, lambda a: a * 2, x), (X,)),
        (
            "switch",
            lambda x, i: lax.switch(i[0], [lambda a: a, lambda a: -a, jnp.sin, jnp.cos], x),
            (X, IDX),
        ),
        (
            "remat_custom_jvp",
            lambda x: jax.grad(lambda a: jnp.sum(jax.checkpoint(jax.nn.gelu)(a) + jax.nn.relu(a)))(
                x
            ),
            (X,),
        ),
        ("custom_vjp_logsumexp", lambda x: jax.grad(lambda a: jax.nn.logsumexp(a))(x), (X,)),
        ("optimization_barrier", lambda x: lax.optimization_barrier((x, x + 1))[1], (X,)),
        (
            "pipeline_marker",
            lambda x: value_and_grad(lambda a: jnp.sum(mark_pipeline_boundary(a * 2) ** 2))(x),
            (X,),
        ),
        ("mul_out_dtype", lambda i: lax.mul(i, i), (IDX,)),
        # a user's hint and, in its gradient, the seed's reshard
        ("sharding_constraint_reshard", lambda x: jax.grad(_hinted_sum)(x), (X,)),
    ]


def _hinted_sum(x: jax.Array) -> jax.Array:
    from jax.sharding import AxisType, NamedSharding, PartitionSpec

    mesh = jax.make_mesh(
        (1, len(jax.devices())), ("data", "model"), axis_types=(AxisType.Auto,) * 2
    )
    hinted = lax.with_sharding_constraint(x * 2, NamedSharding(mesh, PartitionSpec(None, "model")))
    return jnp.sum(hinted**2)


def _random() -> list[Case]:
    from jax.extend.random import threefry_2x32

    def typed(x: jax.Array) -> Any:
        key = jax.random.clone(jax.random.key(3))  # random_seed, random_clone
        k1, k2 = jax.random.split(key)  # random_split
        k3 = jax.random.fold_in(k1, 5)  # random_fold_in
        data = jax.random.key_data(k3)  # random_unwrap
        k4 = jax.random.wrap_key_data(data)  # random_wrap
        return x * jax.random.uniform(k4, x.shape) + jax.random.normal(k2, x.shape)  # random_bits

    def empty(x: jax.Array) -> Any:
        from jax._src.core import MemorySpace
        from jax._src.lax.lax import empty2

        return x + empty2(x.dtype, memory_space=MemorySpace.Device) * 0

    def rows(x: jax.Array) -> Any:
        from alpa_ir.frontend.random_rows import random_bits_rows_p

        bits = random_bits_rows_p.bind(
            jax.random.key(5), jnp.int32(4), bit_width=32, shape=(4, 8), global_shape=(8, 8)
        )
        from alpa_ir.frontend.random_rows import random_split_rows_p

        keys = random_split_rows_p.bind(
            jax.random.key(6), jnp.int32(2), shape=(2,), global_shape=(4,)
        )
        return x + bits.astype(jnp.float32) + jax.random.uniform(keys[1], x.shape)

    return [
        ("empty2", empty, (X,)),
        ("random_bits_rows", rows, (X,)),
        ("random_typed_keys", typed, (X,)),
        (
            "random_raw_key",
            lambda k, x: x + jax.random.normal(k, x.shape),
            (jax.random.PRNGKey(1), X),
        ),
        ("threefry2x32", lambda k, c: threefry_2x32(k, c), (jnp.asarray([1, 2], jnp.uint32), U)),
    ]


def all_cases() -> list[Case]:
    return (
        _unary()
        + _binary()
        + _layout_and_reductions()
        + _indexing()
        + _windows_and_conv()
        + _control_flow()
        + _random()
    )
