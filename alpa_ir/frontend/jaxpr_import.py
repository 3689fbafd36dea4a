"""Import a JAX function into the IR: jaxpr -> ``builtin.module { func.func @main }``.

Nested calls (``jit``, ``custom_jvp_call``, ``custom_vjp_call``, remat) are
inlined; control flow (``while``, ``scan``, ``cond``) keeps its bodies as
regions. Literals and constants become ``lax.constant``. The pytree structure
of the inputs and outputs is kept as attributes of ``@main`` so that results
come back as the user's pytrees. Each op carries the user's source location.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax._src import source_info_util
from jax.extend.core import Literal, Var
from xdsl.dialects import func
from xdsl.dialects.builtin import (
    ArrayAttr,
    DenseArrayBase,
    DictionaryAttr,
    FileLineColLoc,
    IntAttr,
    ModuleOp,
    StringAttr,
    TensorType,
)
from xdsl.ir import Attribute, Block, Operation, Region, SSAValue

from alpa_ir.dialects.attrs import BATCH_ATTR
from alpa_ir.dialects.lax import PRIMITIVE_OPS, ConstantOp, PrimitiveOp, ReturnOp
from alpa_ir.dialects.lax_attrs import ints_attr
from alpa_ir.dialects.lax_generic_params import encode_generic
from alpa_ir.dialects.lax_params import DroppedC, NoneOnlyC
from alpa_ir.dialects.lax_primitives import INLINED_PRIMITIVES, PRIMITIVES, PrimitiveSpec
from alpa_ir.dialects.types import dtype_of, shape_of, tensor_type
from alpa_ir.errors import AlpaError, UnsupportedPrimitiveError
from alpa_ir.frontend.arguments import (
    OutputStatics,
    StaticArgnums,
    StepArguments,
    step_arguments,
)
from alpa_ir.frontend.differentiation import mark_differentiation
from alpa_ir.frontend.jax_versions import is_jaxpr, jaxpr_and_consts
from alpa_ir.frontend.output_paths import argument_paths, auto_donated, output_paths
from alpa_ir.frontend.pytree_codec import encode_treedef

IN_TREE_ATTR = "alpa.in_tree"
OUT_TREE_ATTR = "alpa.out_tree"
DONATED_ATTR = "alpa.donated"
"""@main attribute: flat indices of the donated inputs."""
ALIASES_ATTR = "alpa.aliases"
"""@main attribute: pairs [output, input]: the output is the new value of the donated input."""


def _aval_type(aval: Any, where: str) -> TensorType:
    shape = getattr(aval, "shape", None)
    dtype = getattr(aval, "dtype", None)
    if shape is None or dtype is None:
        raise UnsupportedPrimitiveError(f"{where}: values of type {aval} are not supported")
    try:
        return tensor_type(shape, dtype)
    except AlpaError as exc:
        raise UnsupportedPrimitiveError(f"{where}: {exc}") from None


# Library code between the user's model and JAX: a location inside these is
# not what a user wants to read ("flax/linen/linear.py:263" says nothing).
_LIBRARY_PARTS = ("/flax/", "/optax/", "/alpa_ir/frontend/markers.py", "/alpa_ir/frontend/")


@functools.cache
def _is_user_file(filename: str) -> bool:
    return source_info_util.is_user_filename(filename) and not any(
        part in filename for part in _LIBRARY_PARTS
    )


def _user_location(eqn: Any) -> tuple[str, int, int] | None:
    """The innermost frame of the user's own code that created ``eqn``."""
    traceback = eqn.source_info.traceback
    if traceback is None:
        return None
    codes, lastis = traceback.raw_frames()
    for code, lasti in zip(codes, lastis, strict=True):
        if _is_user_file(code.co_filename):
            frame = source_info_util.raw_frame_to_frame(code, lasti)
            return frame.file_name, frame.start_line, frame.start_column
    frame = source_info_util.user_frame(traceback)
    return (frame.file_name, frame.start_line, frame.start_column) if frame else None


def where_text(location: tuple[str, int, int] | None) -> str:
    """``file:line`` of a location, for error messages."""
    return f"{location[0]}:{location[1]}" if location else "<unknown location>"


@dataclass
class _BlockEmitter:
    """Emits the eqns of one jaxpr into one block."""

    importer: JaxprImporter
    block: Block
    env: dict[Var, SSAValue] = field(default_factory=dict)
    constants: dict[tuple[Any, ...], SSAValue] = field(default_factory=dict)
    # Location of the call an inlined body came from: JAX cuts tracebacks at
    # jit boundaries, so eqns inside a jitted helper (jnp.take, ...) have no
    # user frame of their own.
    fallback_location: tuple[str, int, int] | None = None
    backward: bool = False
    """Whether the eqns emitted come from a transpose (the backward pass)."""
    backward_ops: set[Operation] | None = None
    """Where the top-level block collects its backward ops (None in regions)."""

    def location(self, eqn: Any) -> tuple[str, int, int] | None:
        return _user_location(eqn) or self.fallback_location

    def where(self, eqn: Any) -> str:
        return where_text(self.location(eqn))

    def add(self, op: Operation) -> Operation:
        self.block.add_op(op)
        return op

    def constant(self, value: Any, aval: Any) -> SSAValue:
        array = np.asarray(value, dtype=aval.dtype)
        key = (array.dtype.str, array.shape, array.tobytes())
        if key not in self.constants:
            op = ConstantOp.from_array(array, _aval_type(aval, "constant"))
            self.constants[key] = self.add(op).results[0]
        return self.constants[key]

    def read(self, atom: Any) -> SSAValue:
        if isinstance(atom, Literal):
            return self.constant(atom.val, atom.aval)
        return self.env[atom]

    def emit_jaxpr(
        self, jaxpr: Any, consts: Sequence[Any], inputs: Sequence[SSAValue]
    ) -> list[SSAValue]:
        for var, const in zip(jaxpr.constvars, consts, strict=True):
            self.env[var] = self.constant(const, var.aval)
        for var, value in zip(jaxpr.invars, inputs, strict=True):
            self.env[var] = value
        for eqn in jaxpr.eqns:
            self.emit_eqn(eqn)
        return [self.read(v) for v in jaxpr.outvars]

    def emit_eqn(self, eqn: Any) -> None:
        name = eqn.primitive.name
        inputs = [self.read(v) for v in eqn.invars]
        backward = self.backward or "transpose(" in str(eqn.source_info.name_stack)
        if name in INLINED_PRIMITIVES:
            outs = self.inline(eqn, inputs, backward)
        elif (
            name == "scan"
            and self.importer.unroll_differentiated_loops
            and self.backward_ops is not None
            and _differentiates(eqn.params["jaxpr"])
        ):
            outs = self.unroll_scan(eqn, inputs, backward)
        else:
            outs = self.importer.make_op(self, eqn, inputs)
            if backward and self.backward_ops is not None and outs:
                owner = outs[0].owner
                if isinstance(owner, Operation):
                    self.backward_ops.add(owner)
        for var, value in zip(eqn.outvars, outs, strict=True):
            self.env[var] = value

    def inline(self, eqn: Any, inputs: list[SSAValue], backward: bool) -> list[SSAValue]:
        params = eqn.params
        sub = params.get("jaxpr", params.get("call_jaxpr", params.get("fun_jaxpr")))
        if sub is None:
            raise UnsupportedPrimitiveError(
                f"{self.where(eqn)}: cannot inline primitive '{eqn.primitive.name}' (no sub-jaxpr)"
            )
        jaxpr, consts = jaxpr_and_consts(sub)
        if _is_remat(eqn) and inputs:
            inputs = self._barrier(eqn, inputs, backward)
        return self._nested(eqn, backward).emit_jaxpr(jaxpr, consts, inputs)

    def _nested(self, eqn: Any, backward: bool) -> _BlockEmitter:
        """An emitter into this block for the body of ``eqn`` (its location the
        fallback, the same backward state)."""
        return _BlockEmitter(
            self.importer,
            self.block,
            constants=self.constants,
            fallback_location=self.location(eqn),
            backward=backward,
            backward_ops=self.backward_ops,
        )

    def traced(self, fn: Callable[..., Any], inputs: list[SSAValue]) -> list[SSAValue]:
        """Emit the ops of ``fn`` (a small JAX function) applied to ``inputs``."""
        closed = jax.make_jaxpr(fn)(
            *[jax.ShapeDtypeStruct(shape_of(v.type), dtype_of(v.type)) for v in inputs]
        )
        nested = _BlockEmitter(self.importer, self.block, constants=self.constants)
        return nested.emit_jaxpr(*jaxpr_and_consts(closed), inputs)

    def unroll_scan(self, eqn: Any, inputs: list[SSAValue], backward: bool) -> list[SSAValue]:
        """A ``scan`` as its iterations one after the other."""
        params = eqn.params
        body, body_consts = jaxpr_and_consts(params["jaxpr"])
        num_consts, num_carry, length = params["num_consts"], params["num_carry"], params["length"]
        consts = inputs[:num_consts]
        carry = inputs[num_consts : num_consts + num_carry]
        xs = inputs[num_consts + num_carry :]
        order = range(length - 1, -1, -1) if params["reverse"] else range(length)
        ys: dict[int, list[SSAValue]] = {}
        for i in order:
            x_i = [self.traced(lambda a, i=i: a[i], [x])[0] for x in xs]
            outs = self._nested(eqn, backward).emit_jaxpr(
                body, body_consts, [*consts, *carry, *x_i]
            )
            carry, ys[i] = outs[:num_carry], outs[num_carry:]
        stacked = [
            self.traced(lambda *a: jnp.stack(a), [ys[i][k] for i in range(length)])[0]
            for k in range(len(eqn.outvars) - num_carry)
        ]
        return [*carry, *stacked]

    def _barrier(self, eqn: Any, inputs: list[SSAValue], backward: bool) -> list[SSAValue]:
        """The inputs of a rematerialized computation through an
        ``optimization_barrier``, as JAX lowers ``jax.checkpoint``: XLA may then
        not merge the recomputation with the forward computation it repeats.
        The inputs of a transposed checkpoint include its cotangents, so on GPU
        (barrier expanded after scheduling) the recomputation runs in the
        backward pass. XLA on CPU expands barriers before scheduling
        (``cse_barrier_expander``), as for plain ``jax.jit``: the recomputation
        may run during the forward pass, and ``cpu-all-reduce-combiner`` then
        merges its all-reduces with the forward's (Alpa's
        test_bert_layer_model_parallel_remat: 11 all-reduced tensors in 9 ops)."""
        op = PRIMITIVE_OPS["optimization_barrier"].create(
            operands=inputs, result_types=[v.type for v in inputs]
        )
        if self.importer.locations and (loc := self.location(eqn)) is not None:
            op.location = FileLineColLoc(StringAttr(loc[0]), IntAttr(loc[1]), IntAttr(loc[2]))
        self.add(op)
        if backward and self.backward_ops is not None:
            self.backward_ops.add(op)
        return list(op.results)


def _differentiates(closed: Any) -> bool:
    """Whether a jaxpr (or one nested in it) holds a backward pass."""
    jaxpr = jaxpr_and_consts(closed)[0]
    for eqn in jaxpr.eqns:
        if "transpose(" in str(eqn.source_info.name_stack):
            return True
        for value in eqn.params.values():
            subs = value if isinstance(value, tuple | list) else (value,)
            for sub in subs:
                if is_jaxpr(sub) and _differentiates(sub):
                    return True
    return False


def _is_remat(eqn: Any) -> bool:
    """A differentiated ``jax.checkpoint`` whose recomputation must survive
    (``prevent_cse``, the default)."""
    params = eqn.params
    return (
        eqn.primitive.name in ("checkpoint", "remat2")
        and bool(params.get("prevent_cse", True))
        and bool(params.get("differentiated", False))
    )


REFUSED_PRIMITIVES = {
    "shard_map": (
        "jax.shard_map regions (hand-written per-device code and collectives) are not "
        "supported: the planner would have to keep them as written on its own mesh; write "
        "the step without shard_map (the plan inserts the collectives), or run it with jax.jit"
    ),
}
"""Primitives the importer refuses, with the reason (never silently replicated)."""


class JaxprImporter:
    """Builds ops from jaxpr eqns; one instance per import."""

    def __init__(
        self, *, locations: bool = True, unroll_differentiated_loops: bool = False
    ) -> None:
        self.locations = locations
        self.unroll_differentiated_loops = unroll_differentiated_loops
        """Unroll a ``scan`` whose body differentiates (a user's own gradient
        accumulation over chunks of the batch), so that a pipeline can cut its
        forward and backward passes (see :mod:`alpa_ir.pipeline.layer_mirroring`)."""
        self._types: dict[tuple[tuple[int, ...], Any], TensorType] = {}
        """The tensor type of each (shape, dtype) met so far: a large model's
        values have few distinct types, and building (verifying) an xDSL type
        took a tenth of an import."""

    def value_type(self, aval: Any, where: Callable[[], str]) -> TensorType:
        """``aval``'s tensor type; ``where()`` names the value in an error."""
        shape, dtype = getattr(aval, "shape", None), getattr(aval, "dtype", None)
        try:
            key = (tuple(shape), dtype)  # type: ignore[arg-type]
            hash(key)
        except TypeError:  # not an array value: _aval_type says so
            return _aval_type(aval, where())
        found = self._types.get(key)
        if found is None:
            found = self._types[key] = _aval_type(aval, where())
        return found

    def region_of(self, closed: Any, location: tuple[str, int, int] | None, where: str) -> Region:
        jaxpr, consts = jaxpr_and_consts(closed)
        block = Block(arg_types=[self.value_type(v.aval, lambda: where) for v in jaxpr.invars])
        emitter = _BlockEmitter(self, block, fallback_location=location)
        outs = emitter.emit_jaxpr(jaxpr, consts, list(block.args))
        block.add_op(ReturnOp.create(operands=outs))
        return Region(block)

    def make_op(self, emitter: _BlockEmitter, eqn: Any, inputs: list[SSAValue]) -> list[SSAValue]:
        name = eqn.primitive.name
        loc = emitter.location(eqn)
        where = where_text(loc)
        result_types = [
            self.value_type(v.aval, lambda: f"{where}: primitive '{name}'") for v in eqn.outvars
        ]
        spec = PRIMITIVES.get(name)
        if name in REFUSED_PRIMITIVES:
            raise UnsupportedPrimitiveError(f"{where}: {REFUSED_PRIMITIVES[name]}")
        if spec is not None:
            op = self._table_op(spec, eqn, inputs, result_types, loc)
        else:
            op = self._generic_op(eqn, inputs, result_types, where)
        if self.locations and loc is not None:
            op.location = FileLineColLoc(StringAttr(loc[0]), IntAttr(loc[1]), IntAttr(loc[2]))
        emitter.add(op)
        return list(op.results)

    def _table_op(
        self,
        spec: PrimitiveSpec,
        eqn: Any,
        inputs: list[SSAValue],
        result_types: list[Attribute],
        location: tuple[str, int, int] | None,
    ) -> Operation:
        """The op of a primitive of the table (``location``: where the user's
        code made ``eqn``, found once by :meth:`make_op`)."""
        params = eqn.params
        where = where_text(location)
        known = set(spec.params) | set(spec.region_params) | set(spec.rebuilt_params)
        if spec.variadic_region_param:
            known.add(spec.variadic_region_param)
        unknown = set(params) - known
        if unknown:
            raise UnsupportedPrimitiveError(
                f"{where}: primitive '{spec.name}' has parameters {sorted(unknown)} "
                "that the lax dialect does not know (JAX version mismatch?)"
            )
        properties: dict[str, Attribute] = {}
        for pname, codec in spec.params.items():
            try:
                attr = codec.encode(params.get(pname))
            except AlpaError as exc:
                raise UnsupportedPrimitiveError(
                    f"{where}: primitive '{spec.name}' parameter '{pname}': {exc}"
                ) from None
            if attr is not None and not isinstance(codec, DroppedC | NoneOnlyC):
                properties[pname] = attr
        regions = [self.region_of(params[p], location, where) for p in spec.region_params]
        if spec.variadic_region_param:
            regions += [
                self.region_of(b, location, where) for b in params[spec.variadic_region_param]
            ]
        return PRIMITIVE_OPS[spec.name].create(
            operands=inputs, result_types=result_types, properties=properties, regions=regions
        )

    def _generic_op(
        self, eqn: Any, inputs: list[SSAValue], result_types: list[Attribute], where: str
    ) -> Operation:
        name = eqn.primitive.name
        try:
            params = {k: encode_generic(v, where=f"'{k}' ") for k, v in eqn.params.items()}
        except AlpaError as exc:
            raise UnsupportedPrimitiveError(
                f"{where}: primitive '{name}' is not supported by the lax dialect ({exc})"
            ) from None
        return PrimitiveOp.create(
            operands=inputs,
            result_types=result_types,
            properties={"primitive": StringAttr(name), "params": DictionaryAttr(params)},
        )


def _sanitize(name: str) -> str:
    clean = "".join(c if c.isalnum() or c in "_.$-" else "_" for c in name)
    if not clean or not (clean[0].isalpha() or clean[0] == "_"):
        clean = "v" + clean
    return clean


@dataclass(frozen=True)
class ImportedStep:
    """A traced step: its module and the real pytree structures of its
    (dynamic) inputs and outputs, which executables keep in memory."""

    module: ModuleOp
    in_tree: Any
    out_tree: Any
    arguments: StepArguments
    outputs: OutputStatics


def import_step(
    fn: Callable[..., Any],
    *example_args: Any,
    static_argnums: StaticArgnums = (),
    donate_argnums: Sequence[int] | str = (),
    batch_argnums: Sequence[int] = (),
    locations: bool = True,
    unroll_differentiated_loops: bool = False,
) -> ImportedStep:
    """:func:`import_jax`, also returning the pytree structures (see :class:`ImportedStep`);
    ``unroll_differentiated_loops`` unrolls ``scan``s whose body differentiates."""
    arguments = step_arguments(fn, example_args, static_argnums)
    abstract = arguments.abstract()
    outputs = OutputStatics()
    try:
        closed, out_shape = jax.make_jaxpr(arguments.bind(fn, outputs), return_shape=True)(
            *abstract
        )
    except AlpaError:
        raise
    except (TypeError, ValueError) as exc:
        raise AlpaError(
            f"tracing {getattr(fn, '__name__', 'the step')}: {_first_line(exc)}"
        ) from exc
    in_tree = jax.tree.structure(abstract)
    out_tree = jax.tree.structure(out_shape)
    jaxpr, consts = jaxpr_and_consts(closed)

    importer = JaxprImporter(
        locations=locations, unroll_differentiated_loops=unroll_differentiated_loops
    )
    names = arguments.leaf_names()
    arg_types = [_aval_type(v.aval, n) for v, n in zip(jaxpr.invars, names, strict=True)]
    block = Block(arg_types=arg_types)
    for arg, name in zip(block.args, names, strict=True):
        arg.name_hint = _sanitize(name)
    backward_ops: set[Operation] = set()
    emitter = _BlockEmitter(importer, block, backward_ops=backward_ops)
    outs = emitter.emit_jaxpr(jaxpr, consts, list(block.args))
    block.add_op(func.ReturnOp(*outs))
    mark_differentiation(block, backward_ops)

    main = func.FuncOp("main", (arg_types, [o.type for o in outs]), Region(block))
    main.attributes[IN_TREE_ATTR] = StringAttr(
        encode_treedef(jax.tree.structure(arguments.dynamic), dict(arguments.static_leaves()))
    )
    main.attributes[OUT_TREE_ATTR] = StringAttr(encode_treedef(outputs.tree, outputs.statics))
    if isinstance(donate_argnums, str):  # "auto" (checked by the API)
        positions = auto_donated(abstract, out_shape)
    else:
        positions = arguments.dynamic_positions(donate_argnums)
    donated = _leaves_of(abstract, positions)
    if donated:
        main.attributes[DONATED_ATTR] = _int_array(donated)
        aliases = _aliases(abstract, out_shape, donated)
        if aliases:
            main.attributes[ALIASES_ATTR] = ArrayAttr([_int_array(pair) for pair in aliases])
    batch = _leaves_of(abstract, arguments.dynamic_positions(batch_argnums))
    if batch:
        main.attributes[BATCH_ATTR] = _int_array(batch)
    return ImportedStep(ModuleOp([main]), in_tree, out_tree, arguments, outputs)


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


def import_jax(
    fn: Callable[..., Any],
    *example_args: Any,
    static_argnums: StaticArgnums = (),
    donate_argnums: Sequence[int] = (),
    batch_argnums: Sequence[int] = (),
    locations: bool = True,
) -> ModuleOp:
    """Trace ``fn`` on ``example_args`` and return the module. ``str(module)``
    is its text.

    Arguments are any pytrees of arrays, ``jax.ShapeDtypeStruct``, PRNG keys
    (raw ``uint32[2]`` or typed ``jax.random.key``) and Python scalars (0-d
    arrays); ``static_argnums`` (or ``"auto"``: Alpa's rule, see
    :mod:`alpa_ir.frontend.arguments`) are bound as constants and are not
    arguments of ``@main``. ``donate_argnums`` name the arguments whose buffers
    the step replaces (the training state): each of their leaves is paired
    with the output leaf at the same path (``state.params.w`` in,
    ``new_state.params.w`` out). ``batch_argnums`` name the batch arguments."""
    return import_step(
        fn,
        *example_args,
        static_argnums=static_argnums,
        donate_argnums=donate_argnums,
        batch_argnums=batch_argnums,
        locations=locations,
    ).module


def _int_array(values: Sequence[int]) -> DenseArrayBase:
    return ints_attr(values)


def _leaves_of(example_args: tuple[Any, ...], argnums: Sequence[int]) -> list[int]:
    """Flat indices of the leaves of the arguments ``argnums``."""
    out: list[int] = []
    start = 0
    for k, arg in enumerate(example_args):
        n = len(jax.tree.leaves(arg))
        if k in argnums:
            out += list(range(start, start + n))
        start += n
    return out


def _aliases(
    example_args: tuple[Any, ...], out_shape: Any, donated: Sequence[int]
) -> list[list[int]]:
    """[output, input] for each donated input leaf whose path (below its
    argument) and type an output leaf repeats (its path below its output
    element, or below the output when the step returns one bare pytree:
    :func:`~alpa_ir.frontend.output_paths.output_paths`)."""
    ins = argument_paths(example_args)
    by_path: dict[tuple[Any, ...], list[tuple[int, int]]] = {}
    for j, (paths, leaf) in enumerate(output_paths(out_shape)):
        for rank, path in enumerate(paths):
            key = (path, tuple(leaf.shape), str(leaf.dtype))
            by_path.setdefault(key, []).append((rank, j))
    pairs, taken = [], set()
    for i in donated:
        path, leaf = ins[i]
        key = (path, tuple(np.shape(leaf)), str(leaf.dtype))
        for _, j in sorted(by_path.get(key, [])):
            if j not in taken:
                taken.add(j)
                pairs.append([j, i])
                break
    return pairs
