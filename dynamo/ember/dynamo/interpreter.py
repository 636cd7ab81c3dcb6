"""The symbolic bytecode interpreter (CPython 3.11 and 3.12): one method per opcode.

A Translator runs one code object over symbolic values. The root translator owns the frame being
compiled; calls to Python functions run in child translators (inlining) that share its output
graph. Calls, attribute access and operators live in calls.py.
"""

from __future__ import annotations

import dis
import operator
import sys
import weakref
from typing import Optional

import torch

from . import calls
from . import variables as V
from .config import config
from .exc import PyExc, RestartAnalysis, Unsupported

PY312 = sys.version_info >= (3, 12)

BINARY_OPS = {
    "+": operator.add, "&": operator.and_, "//": operator.floordiv, "<<": operator.lshift,
    "@": operator.matmul, "*": operator.mul, "%": operator.mod, "|": operator.or_,
    "**": operator.pow, ">>": operator.rshift, "-": operator.sub, "/": operator.truediv,
    "^": operator.xor, "+=": operator.iadd, "&=": operator.iand, "//=": operator.ifloordiv,
    "<<=": operator.ilshift, "@=": operator.imatmul, "*=": operator.imul, "%=": operator.imod,
    "|=": operator.ior, "**=": operator.ipow, ">>=": operator.irshift, "-=": operator.isub,
    "/=": operator.itruediv, "^=": operator.ixor,
}  # fmt: skip
NB_OPS = [BINARY_OPS[sym] for _, sym in dis._nb_ops]
COMPARE_OPS = {"<": operator.lt, "<=": operator.le, "==": operator.eq, "!=": operator.ne,
               ">": operator.gt, ">=": operator.ge}  # fmt: skip

# Instructions a graph break may stop at (the instruction then runs in Python).
BREAKABLE = {"CALL", "CALL_FUNCTION_EX", "BINARY_SUBSCR", "POP_JUMP_IF_TRUE", "POP_JUMP_IF_FALSE",
             "POP_JUMP_FORWARD_IF_TRUE", "POP_JUMP_FORWARD_IF_FALSE",
             "POP_JUMP_BACKWARD_IF_TRUE", "POP_JUMP_BACKWARD_IF_FALSE"}  # fmt: skip


class Return(Exception):
    """Internal: the translated code object returned `value`."""

    def __init__(self, value):
        self.value = value


_INSTRUCTION_CACHE: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()


_EXC_TABLES: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()


def exception_table(code) -> list:
    table = _EXC_TABLES.get(code)
    if table is None:
        table = _EXC_TABLES[code] = dis._parse_exception_table(code)
    return table


def instructions(code) -> tuple[list, dict]:
    """The instructions of `code` (no CACHE entries) and a map from offset to list index."""
    hit = _INSTRUCTION_CACHE.get(code)
    if hit is None:
        insts = [i for i in dis.get_instructions(code) if i.opname != "CACHE"]
        hit = (insts, {inst.offset: k for k, inst in enumerate(insts)})
        _INSTRUCTION_CACHE[code] = hit
    return hit


class Translator:
    """Symbolic execution of one code object."""

    def __init__(self, tx_root, code, f_locals: dict, cells: dict, globals_vt_fn, parent=None):
        self.root = tx_root or self
        self.code = code
        self.insts, self.offset_index = instructions(code)
        self.stack: list[V.VT] = []
        self.locals = f_locals  # name -> VT
        self.cells = cells  # name -> CellVT (cellvars and freevars)
        self.load_global = globals_vt_fn  # name -> VT
        self.parent = parent
        self.depth = 0 if parent is None else parent.depth + 1
        self.ip = 0
        self.kw_names: tuple = ()
        self.inst = None
        if tx_root is not None:
            self.output = tx_root.output
            self.builder = tx_root.builder
        if self.depth > config.max_inline_depth:
            raise Unsupported("inlining too deep (recursion?)")

    # -- helpers ------------------------------------------------------------------------------
    def where(self) -> str:
        inst = self.inst
        line = None
        if inst is not None:
            line = inst.positions.lineno if inst.positions else None
        return f"{self.code.co_filename}:{line or self.code.co_firstlineno}"

    def push(self, v):
        self.stack.append(v)

    def pop(self):
        return self.stack.pop()

    def popn(self, n):
        if n == 0:
            return []
        items = self.stack[-n:]
        del self.stack[-n:]
        return items

    def jump(self, inst):
        self.ip = self.offset_index[inst.argval]

    # -- main loop ----------------------------------------------------------------------------
    def run(self) -> V.VT:
        try:
            while True:
                self.step()
        except Return as r:
            return r.value

    def step(self):
        inst = self.insts[self.ip]
        self.inst = inst
        self.ip += 1
        root = self.root
        root.current = self
        root.steps += 1
        if root.steps > config.max_instructions:
            raise Unsupported("too many instructions (a very long unrolled loop?)")
        handler = getattr(self, inst.opname, None)
        if handler is None:
            raise Unsupported(f"opcode {inst.opname}", self.where())
        try:
            handler(inst)
        except PyExc as e:
            if not e.where:
                e.where = self.where()
            if not self.handle_exception(inst, e):
                raise
        except Unsupported as e:
            if not e.where:
                e.where = self.where()
            raise

    def handle_exception(self, inst, e) -> bool:
        """Jump to the handler covering `inst` (the frame's exception table), as CPython does."""
        for entry in exception_table(self.code):
            if entry.start <= inst.offset < entry.end:
                del self.stack[entry.depth :]
                if entry.lasti:
                    self.push(V.ConstVT(inst.offset))
                self.push(e.exc_vt)
                self.ip = self.offset_index[entry.target]
                return True
        return False

    # -- exceptions ---------------------------------------------------------------------------
    def RAISE_VARARGS(self, inst):
        if inst.arg == 0:
            raise Unsupported("bare raise")
        if inst.arg == 2:
            self.pop()  # the cause
        exc = self.pop()
        if isinstance(exc, V.ClassVT) and issubclass(exc.cls, BaseException):
            exc = V.ExcVT(exc.cls, [])
        if not isinstance(exc, V.ExcVT):
            raise Unsupported(f"raise of a {type(exc).__name__}")
        raise PyExc(exc)

    def PUSH_EXC_INFO(self, inst):
        exc = self.pop()
        self.push(V.ConstVT(None))  # the previous exception being handled
        self.push(exc)

    def POP_EXCEPT(self, inst):
        self.pop()

    def CHECK_EXC_MATCH(self, inst):
        from .pybuiltins import const_classes

        classes = const_classes(self.pop())
        exc = self.stack[-1]
        self.push(V.ConstVT(isinstance(exc, V.ExcVT) and issubclass(exc.cls, classes)))

    def RERAISE(self, inst):
        exc = self.pop()
        if not isinstance(exc, V.ExcVT):
            raise Unsupported("re-raising a non-exception")
        raise PyExc(exc)

    def WITH_EXCEPT_START(self, inst):
        exit_fn = self.stack[-4]
        if not isinstance(exit_fn, V.ContextExitVT) or exit_fn.user:
            raise Unsupported("exception inside a with-block")
        from .pybuiltins import exit_grad_mode

        exit_grad_mode(self, exit_fn.ctx)
        self.push(V.ConstVT(False))  # __exit__ does not swallow the exception

    # -- stack and constants ------------------------------------------------------------------
    def NOP(self, inst):
        pass

    RESUME = EXTENDED_ARG = PRECALL = COPY_FREE_VARS = NOP

    def PUSH_NULL(self, inst):
        self.push(V.NULL)

    def POP_TOP(self, inst):
        self.pop()

    def COPY(self, inst):
        self.push(self.stack[-inst.arg])

    def SWAP(self, inst):
        s = self.stack
        s[-1], s[-inst.arg] = s[-inst.arg], s[-1]

    def LOAD_CONST(self, inst):
        self.push(V.ConstVT(inst.argval))

    def RETURN_VALUE(self, inst):
        self.do_return(self.pop())

    def RETURN_CONST(self, inst):
        self.do_return(V.ConstVT(inst.argval))

    def do_return(self, value):
        raise Return(value)

    # -- locals, cells, globals ---------------------------------------------------------------
    def LOAD_FAST(self, inst):
        name = inst.argval
        if name not in self.locals:
            raise Unsupported(f"local variable {name!r} read before assignment")
        self.push(self.locals[name])

    LOAD_FAST_CHECK = LOAD_FAST

    def LOAD_FAST_AND_CLEAR(self, inst):
        self.push(self.locals.pop(inst.argval, V.NULL))

    def STORE_FAST(self, inst):
        value = self.pop()
        if value is V.NULL:
            self.locals.pop(inst.argval, None)
        else:
            self.locals[inst.argval] = value

    def DELETE_FAST(self, inst):
        self.locals.pop(inst.argval, None)

    def MAKE_CELL(self, inst):
        name = inst.argval
        self.cells[name] = V.CellVT(self.locals.pop(name, None))

    def LOAD_CLOSURE(self, inst):
        self.push(self.cell(inst.argval))

    def cell(self, name):
        if name not in self.cells:
            raise Unsupported(f"free variable {name!r}")
        return self.cells[name]

    def LOAD_DEREF(self, inst):
        cell = self.cell(inst.argval)
        value = cell.value if isinstance(cell, V.CellVT) else cell.load(self)
        if value is None:
            raise Unsupported(f"free variable {inst.argval!r} referenced before assignment")
        self.push(value)

    def STORE_DEREF(self, inst):
        cell = self.cell(inst.argval)
        value = self.pop()
        if isinstance(cell, V.CellVT):
            cell.value = value
        else:
            cell.store(self, value)

    def LOAD_GLOBAL(self, inst):
        if inst.arg & 1:
            self.push(V.NULL)
        self.push(self.load_global(inst.argval))

    def STORE_GLOBAL(self, inst):
        value = self.pop()
        self.root.store_global(self, inst.argval, value)

    def LOAD_ASSERTION_ERROR(self, inst):
        self.push(V.ClassVT(AssertionError))

    # -- attributes ---------------------------------------------------------------------------
    def LOAD_ATTR(self, inst):
        obj = self.pop()
        if PY312 and inst.arg & 1:
            self.push(V.NULL)
        self.push(calls.getattr_vt(self, obj, inst.argval))

    def LOAD_METHOD(self, inst):
        obj = self.pop()
        self.push(V.NULL)
        self.push(calls.getattr_vt(self, obj, inst.argval))

    def LOAD_SUPER_ATTR(self, inst):
        _, cls, obj = self.popn(3)
        if not isinstance(cls, V.ClassVT):
            raise Unsupported("super() with a non-constant class")
        if inst.arg & 1:
            self.push(V.NULL)
        self.push(calls.getattr_vt(self, V.SuperVT(cls.cls, obj), inst.argval))

    def STORE_ATTR(self, inst):
        obj = self.pop()
        value = self.pop()
        calls.setattr_vt(self, obj, inst.argval, value)

    def DELETE_ATTR(self, inst):
        from .attrs import delattr_impl

        delattr_impl(self, self.pop(), inst.argval)

    # -- operators ----------------------------------------------------------------------------
    def BINARY_OP(self, inst):
        b = self.pop()
        a = self.pop()
        self.push(calls.binop(self, NB_OPS[inst.arg], a, b))

    def COMPARE_OP(self, inst):
        b = self.pop()
        a = self.pop()
        self.push(calls.binop(self, COMPARE_OPS[inst.argval], a, b))

    def IS_OP(self, inst):
        b = self.pop()
        a = self.pop()
        result = calls.is_same(self, a, b)
        self.push(V.ConstVT(result != bool(inst.arg)))

    def CONTAINS_OP(self, inst):
        container = self.pop()
        item = self.pop()
        result = calls.contains(self, container, item)
        self.push(V.ConstVT(result != bool(inst.arg)))

    def UNARY_NEGATIVE(self, inst):
        self.push(calls.unop(self, operator.neg, self.pop()))

    def UNARY_POSITIVE(self, inst):
        self.push(calls.unop(self, operator.pos, self.pop()))

    def UNARY_INVERT(self, inst):
        self.push(calls.unop(self, operator.invert, self.pop()))

    def UNARY_NOT(self, inst):
        self.push(V.ConstVT(not calls.truth(self, self.pop())))

    def BINARY_SUBSCR(self, inst):
        key = self.pop()
        obj = self.pop()
        self.push(calls.getitem(self, obj, key))

    def STORE_SUBSCR(self, inst):
        key = self.pop()
        obj = self.pop()
        value = self.pop()
        calls.setitem(self, obj, key, value)

    def DELETE_SUBSCR(self, inst):
        key = self.pop()
        obj = self.pop()
        calls.delitem(self, obj, key)

    def BUILD_SLICE(self, inst):
        parts = self.popn(inst.arg)
        self.push(calls.make_slice(parts))

    def BINARY_SLICE(self, inst):
        start, stop = self.popn(2)
        obj = self.pop()
        self.push(calls.getitem(self, obj, calls.make_slice([start, stop])))

    def STORE_SLICE(self, inst):
        start, stop = self.popn(2)
        obj = self.pop()
        value = self.pop()
        calls.setitem(self, obj, calls.make_slice([start, stop]), value)

    # -- containers ---------------------------------------------------------------------------
    def BUILD_TUPLE(self, inst):
        self.push(V.TupleVT(self.popn(inst.arg)))

    def BUILD_LIST(self, inst):
        self.push(V.ListVT(self.popn(inst.arg)))

    def BUILD_SET(self, inst):
        items = self.popn(inst.arg)
        self.push(V.SetVT([calls.const_key(i) for i in items]))

    def BUILD_MAP(self, inst):
        flat = self.popn(2 * inst.arg)
        items = {calls.const_key(flat[i]): flat[i + 1] for i in range(0, len(flat), 2)}
        self.push(V.DictVT(items))

    def BUILD_CONST_KEY_MAP(self, inst):
        keys = self.pop()
        values = self.popn(inst.arg)
        self.push(V.DictVT(dict(zip(keys.value, values))))

    def BUILD_STRING(self, inst):
        parts = self.popn(inst.arg)
        self.push(V.ConstVT("".join(calls.const_of(p, "f-string part") for p in parts)))

    def LIST_APPEND(self, inst):
        item = self.pop()
        calls.mutate_list(self, self.stack[-inst.arg]).items.append(item)

    def LIST_EXTEND(self, inst):
        items = calls.unpack(self, self.pop())
        calls.mutate_list(self, self.stack[-inst.arg]).items.extend(items)

    def SET_ADD(self, inst):
        item = self.pop()
        self.stack[-inst.arg].items[calls.const_key(item)] = None

    def SET_UPDATE(self, inst):
        items = calls.unpack(self, self.pop())
        for i in items:
            self.stack[-inst.arg].items[calls.const_key(i)] = None

    def MAP_ADD(self, inst):
        key, value = self.popn(2)
        self.stack[-inst.arg].items[calls.const_key(key)] = value

    def DICT_UPDATE(self, inst):
        other = self.pop()
        target = self.stack[-inst.arg]
        target.items.update(calls.dict_items(self, other))

    DICT_MERGE = DICT_UPDATE

    def LIST_TO_TUPLE(self, inst):
        self.push(V.TupleVT(self.pop().items))

    def CALL_INTRINSIC_1(self, inst):
        name = dis._intrinsic_1_descs[inst.arg]
        if name == "INTRINSIC_LIST_TO_TUPLE":
            self.push(V.TupleVT(self.pop().items))
        elif name == "INTRINSIC_UNARY_POSITIVE":
            self.push(calls.unop(self, operator.pos, self.pop()))
        else:
            raise Unsupported(f"CALL_INTRINSIC_1 {name}")

    def UNPACK_SEQUENCE(self, inst):
        items = calls.unpack(self, self.pop())
        if len(items) != inst.arg:
            raise Unsupported(f"unpacking {len(items)} values into {inst.arg}")
        self.stack.extend(reversed(items))

    def UNPACK_EX(self, inst):
        before, after = inst.arg & 0xFF, inst.arg >> 8
        items = calls.unpack(self, self.pop())
        if len(items) < before + after:
            raise Unsupported("not enough values to unpack")
        middle = V.ListVT(items[before : len(items) - after])
        out = items[:before] + [middle] + items[len(items) - after :]
        self.stack.extend(reversed(out))

    def FORMAT_VALUE(self, inst):
        spec = self.pop() if inst.arg & 0x04 else V.ConstVT("")
        value = calls.const_of(self.pop(), "an f-string value")
        conv = inst.arg & 0x03
        value = (value, str(value), repr(value), ascii(value))[conv]
        self.push(V.ConstVT(format(value, calls.const_of(spec, "a format spec"))))

    # -- control flow -------------------------------------------------------------------------
    def JUMP_FORWARD(self, inst):
        self.jump(inst)

    JUMP_BACKWARD = JUMP_BACKWARD_NO_INTERRUPT = JUMP = JUMP_FORWARD

    def _pop_jump(self, inst, jump_if: bool):
        cond = self.stack[-1]
        value = calls.truth(self, cond)
        self.pop()
        if value == jump_if:
            self.jump(inst)

    def POP_JUMP_IF_TRUE(self, inst):
        self._pop_jump(inst, True)

    def POP_JUMP_IF_FALSE(self, inst):
        self._pop_jump(inst, False)

    POP_JUMP_FORWARD_IF_TRUE = POP_JUMP_BACKWARD_IF_TRUE = POP_JUMP_IF_TRUE
    POP_JUMP_FORWARD_IF_FALSE = POP_JUMP_BACKWARD_IF_FALSE = POP_JUMP_IF_FALSE

    def POP_JUMP_IF_NONE(self, inst):
        if calls.is_none(self.pop()):
            self.jump(inst)

    def POP_JUMP_IF_NOT_NONE(self, inst):
        if not calls.is_none(self.pop()):
            self.jump(inst)

    POP_JUMP_FORWARD_IF_NONE = POP_JUMP_BACKWARD_IF_NONE = POP_JUMP_IF_NONE
    POP_JUMP_FORWARD_IF_NOT_NONE = POP_JUMP_BACKWARD_IF_NOT_NONE = POP_JUMP_IF_NOT_NONE

    def JUMP_IF_TRUE_OR_POP(self, inst):
        if calls.truth(self, self.stack[-1]):
            self.jump(inst)
        else:
            self.pop()

    def JUMP_IF_FALSE_OR_POP(self, inst):
        if not calls.truth(self, self.stack[-1]):
            self.jump(inst)
        else:
            self.pop()

    def GET_ITER(self, inst):
        self.push(calls.get_iter(self, self.pop()))

    def FOR_ITER(self, inst):
        it = self.stack[-1]
        if not isinstance(it, V.IteratorVT):
            raise Unsupported(f"for loop over {type(it).__name__}")
        if it.pos < len(it.items):
            self.push(it.items[it.pos])
            it.pos += 1
            return
        self.pop()
        self.jump(inst)
        if PY312 and self.insts[self.ip].opname == "END_FOR":
            self.ip += 1

    def END_FOR(self, inst):
        self.popn(2)

    # -- calls --------------------------------------------------------------------------------
    def KW_NAMES(self, inst):
        self.kw_names = self.code.co_consts[inst.arg]

    def CALL(self, inst):
        argc = inst.arg
        args = self.popn(argc)
        second = self.pop()
        first = self.pop()
        if first is V.NULL:
            fn = second
        else:
            fn, args = first, [second, *args]
        kwargs = {}
        if self.kw_names:
            names, self.kw_names = self.kw_names, ()
            kwargs = dict(zip(names, args[len(args) - len(names) :]))
            args = args[: len(args) - len(names)]
        self.push(calls.call(self, fn, args, kwargs))

    def CALL_FUNCTION_EX(self, inst):
        kwargs = self.pop() if inst.arg & 1 else V.DictVT({})
        args = self.pop()
        fn = self.pop()
        null = self.pop()
        if null is not V.NULL:
            raise Unsupported("CALL_FUNCTION_EX without NULL")
        args = calls.unpack(self, args)
        kw = calls.dict_items(self, kwargs)
        self.push(calls.call(self, fn, list(args), {k: v for k, v in kw.items()}))

    def MAKE_FUNCTION(self, inst):
        code = self.pop()
        flags = inst.arg
        closure = self.pop().items if flags & 0x08 else None
        if flags & 0x04:
            self.pop()  # annotations
        kwdefaults = calls.dict_items(self, self.pop()) if flags & 0x02 else None
        if kwdefaults is not None:
            kwdefaults = {k: v if isinstance(v, V.VT) else calls.wrap_const(v)
                          for k, v in kwdefaults.items()}  # fmt: skip
        defaults = tuple(calls.unpack(self, self.pop())) if flags & 0x01 else None
        code = code.value
        self.push(V.NestedFunctionVT(code, self.globals_dict(), code.co_name, defaults,
                                     kwdefaults, closure))  # fmt: skip

    def globals_dict(self):
        return self.f_globals

    # -- generators (run to completion by frame.inline_call) ----------------------------------
    def RETURN_GENERATOR(self, inst):
        if getattr(self, "yielded", None) is None:
            raise Unsupported("generator frame")
        self.push(V.ConstVT(None))

    def YIELD_VALUE(self, inst):
        if getattr(self, "yielded", None) is None:
            raise Unsupported("yield outside an inlined generator")
        self.yielded.append(self.pop())
        self.push(V.ConstVT(None))  # the value sent back in

    def GET_YIELD_FROM_ITER(self, inst):
        if getattr(self, "yielded", None) is None:
            raise Unsupported("yield from outside an inlined generator")
        self.push(calls.get_iter(self, self.pop()))

    def SEND(self, inst):
        self.pop()  # the value sent in: always None when a generator runs to completion
        it = self.stack[-1]
        if not isinstance(it, V.IteratorVT):
            raise Unsupported(f"yield from a {type(it).__name__}")
        if it.pos < len(it.items):
            self.push(it.items[it.pos])
            it.pos += 1
            return
        if PY312:  # [receiver, return value]; END_SEND drops the receiver
            self.push(V.ConstVT(None))
        else:
            self.stack[-1] = V.ConstVT(None)
        self.jump(inst)

    def END_SEND(self, inst):
        value = self.pop()
        self.pop()
        self.push(value)

    # -- with blocks --------------------------------------------------------------------------
    def BEFORE_WITH(self, inst):
        ctx = self.pop()
        if isinstance(ctx, (V.ObjectVT, V.NewObjectVT)) and _is_profiler_range(ctx):
            # record_function: a profiler range has no meaning inside a graph (the compiled call
            # is what the profiler sees), so the block is traced as if it were not there; a
            # grad-mode context with nothing to restore makes its exit a no-op.
            self.push(V.ContextExitVT(V.GradModeVT(torch.is_grad_enabled())))
            self.push(ctx)  # record_function.__enter__ returns self
            return
        if isinstance(ctx, (V.ObjectVT, V.NewObjectVT)) and all(
            calls.py_method(ctx.python_type(), m) for m in ("__enter__", "__exit__")
        ):  # a context manager written in Python: its __enter__ and __exit__ are inlined
            entered = calls.call_method(self, ctx, "__enter__", [], {})
            self.push(V.ContextExitVT(ctx, user=True))
            self.push(entered)
            return
        if not isinstance(ctx, V.GradModeVT):
            raise Unsupported(f"with-block over {type(ctx).__name__}")
        from .pybuiltins import enter_grad_mode

        enter_grad_mode(self, ctx)
        self.push(V.ContextExitVT(ctx))
        self.push(V.ConstVT(None))

    # -- imports ------------------------------------------------------------------------------
    def IMPORT_NAME(self, inst):
        level, fromlist = self.popn(2)
        module = __import__(inst.argval, self.f_globals, None, fromlist.value, level.value)
        self.push(V.PyModuleVT(module, None))

    def IMPORT_FROM(self, inst):
        self.push(calls.getattr_vt(self, self.stack[-1], inst.argval))


def _is_profiler_range(ctx) -> bool:
    """Whether `ctx` is a torch.autograd.profiler.record_function (torch.profiler's too)."""
    profiler = sys.modules.get("torch.autograd.profiler")
    cls = getattr(profiler, "record_function", None)
    return isinstance(cls, type) and issubclass(ctx.python_type(), cls)


def catches_at(code, offset: int) -> bool:
    """Whether an exception raised at `offset` would be caught or run a finally/with-exit there.

    A graph break runs its instruction in the transformed function, outside the original's
    exception table, so it may only do that where a raise just propagates (3.12's comprehension
    cleanup handlers restore a variable and re-raise: those are fine)."""
    insts, index = instructions(code)
    for entry in dis._parse_exception_table(code):
        if not entry.start <= offset < entry.end:
            continue
        k = index.get(entry.target)
        while k is not None and k < len(insts):
            name = insts[k].opname
            if name in ("PUSH_EXC_INFO", "CHECK_EXC_MATCH", "WITH_EXCEPT_START"):
                return True
            if name in ("RERAISE", "RETURN_VALUE", "RETURN_CONST") or "JUMP" in name:
                break
            k += 1
    return False


class RootTranslator(Translator):
    """The frame being compiled: decides graph breaks and produces the transformed code."""

    def __init__(self, output, builder, code, fn, f_globals, args, break_at: Optional[int]):
        from .frame import root_frame_state

        self.output = output
        self.builder = builder
        self.f_globals = f_globals
        self.fn = fn
        self.fn_args = args
        self.steps = 0
        self.break_at = break_at
        self.result = None  # ("return", vt) or ("break", inst, stack, locals)
        self.current = self  # the translator (root or inlined) running the current instruction
        f_locals, cells, load_global = root_frame_state(self, code, fn, f_globals, args)
        super().__init__(None, code, f_locals, cells, load_global)

    def innermost_where(self) -> str:
        """file:line of the user's instruction being traced, inside inlined calls too."""
        return self.current.where()

    def store_global(self, tx, name, value):
        if tx.f_globals is not self.f_globals:
            raise Unsupported("assignment to another module's global")
        self.output.record_side_effect("global", name, value)
        self.pending_globals[name] = value

    def run_root(self):
        self.pending_globals = {}
        try:
            while True:
                if self.ip == self.break_at:
                    inst = self.insts[self.ip]
                    self.inst = inst
                    self.result = ("break", inst, list(self.stack), dict(self.locals))
                    return
                index = self.ip
                try:
                    self.step()
                except Unsupported as e:
                    inst = self.insts[index]
                    if inst.opname in BREAKABLE and self.break_at is None:
                        if catches_at(self.code, inst.offset):
                            e.msg += " (inside a try block: the frame runs eagerly)"
                            raise
                        raise RestartAnalysis(index, e) from None
                    raise
        except Return as r:
            self.result = ("return", r.value)
