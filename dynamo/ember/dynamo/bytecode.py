"""Resume functions: a copy of a code object that restores a stack and jumps to an instruction.

After a graph break the transformed code runs the breaking instruction itself, then calls a
resume function with every local of the original frame and the values left on its stack. The
resume code is the original bytecode, untouched (its relative jumps stay valid), behind a short
prologue; the exception table is shifted and the line table rewritten to match (3.11 and 3.12).
"""

from __future__ import annotations

import dis
import sys
import types
import weakref

PY312 = sys.version_info >= (3, 12)
OP = dis.opmap
_HASFREE = set(dis.hasfree)

# resume code -> (original code, prologue length in code units)
RESUME_ORIGIN: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()
_RESUME_CACHE: dict = {}


def _varint(value: int) -> bytes:
    """Exception-table varint: 6-bit chunks, most significant first, bit 6 = more follow."""
    chunks = [value & 63]
    value >>= 6
    while value:
        chunks.append(value & 63)
        value >>= 6
    chunks.reverse()
    return bytes(c | (64 if i < len(chunks) - 1 else 0) for i, c in enumerate(chunks))


def encode_exception_table(entries) -> bytes:
    """Inverse of dis._parse_exception_table (offsets in bytes)."""
    out = bytearray()
    for e in entries:
        start, length, target = e.start // 2, (e.end - e.start) // 2, e.target // 2
        first = _varint(start)
        out += bytes([first[0] | 128]) + first[1:]
        out += _varint(length) + _varint(target) + _varint((e.depth << 1) | int(e.lasti))
    return bytes(out)


def _svarint(value: int) -> bytes:
    """Location-table signed varint: 6-bit chunks, least significant first, bit 6 = more."""
    v = (-value << 1) | 1 if value < 0 else value << 1
    out = bytearray()
    while v >= 64:
        out.append((v & 63) | 64)
        v >>= 6
    out.append(v)
    return bytes(out)


def encode_line_table(lines: list, firstlineno: int) -> bytes:
    """A location table giving each code unit a line (no columns); None means no location."""
    out = bytearray()
    prev = firstlineno
    i = 0
    while i < len(lines):
        line = lines[i]
        run = 1
        while i + run < len(lines) and lines[i + run] == line and run < 8:
            run += 1
        if line is None:
            out.append(0x80 | (15 << 3) | (run - 1))
        else:
            out.append(0x80 | (13 << 3) | (run - 1))
            out += _svarint(line - prev)
            prev = line
        i += run
    return bytes(out)


def _emit(op: str, arg: int = 0) -> bytes:
    """One instruction with its EXTENDED_ARGs and inline cache entries."""
    code = bytearray()
    ext = []
    a = arg >> 8
    while a:
        ext.append(a & 0xFF)
        a >>= 8
    for e in reversed(ext):
        code += bytes([OP["EXTENDED_ARG"], e])
    code += bytes([OP[op], arg & 0xFF])
    caches = dis._inline_cache_entries[OP[op]] if hasattr(dis, "_inline_cache_entries") else 0
    code += bytes(2 * caches)
    return bytes(code)


def _shift_free_args(co_code: bytes, shift: int, first: int) -> bytes:
    """Add `shift` to every cell/free-variable index at or past `first` (the slots after the
    plain locals; a cell that is also an argument keeps its slot)."""
    if shift == 0:
        return co_code
    out = bytearray(co_code)
    ext = 0
    for i in range(0, len(out), 2):
        op, arg = out[i], out[i + 1]
        if op == OP["EXTENDED_ARG"]:
            ext = (ext | arg) << 8
            continue
        if op in _HASFREE and (ext | arg) >= first:
            full = (ext | arg) + shift
            if ext == 0 and full > 255:
                raise ValueError("cell index overflow in resume code")
            out[i + 1] = full & 0xFF
            if ext:
                out[i - 1] = (full >> 8) & 0xFF
        ext = 0
    return bytes(out)


def make_resume_code(code, offset: int, stack_kinds: tuple, unbound: tuple, cells: tuple = ()):
    """A function code taking (*co_varnames, *stack) that resumes `code` at byte `offset`.

    stack_kinds[i] is "val" (passed), "null" (the call protocol's NULL: pushed, not passed) or
    "iter" (an iterator, passed as a tuple of its remaining items and re-iterated);
    `unbound` lists locals that are unbound at `offset` (passed as None, then deleted);
    cells[k] says whether the k-th cell variable that is not an argument holds a value (passed
    after the stack, stored into a fresh cell).
    """
    origin = RESUME_ORIGIN.get(code)
    if origin is not None:  # resuming inside a resume function: resume the original instead
        code, prologue = origin
        offset -= 2 * prologue
    key = (code, offset, stack_kinds, unbound, cells)
    if key in _RESUME_CACHE:
        return _RESUME_CACHE[key]
    nvars = len(code.co_varnames)
    stack_names = tuple(f"___stack{i}" for i in range(len(stack_kinds)))
    own_cells = [c for c in code.co_cellvars if c not in code.co_varnames]
    cell_names = tuple(f"___cell{i}" for i in range(len(own_cells)))
    varnames = code.co_varnames + stack_names + cell_names
    shift = len(stack_names) + len(cell_names)

    def prologue_for(jump_arg):
        p = bytearray()
        if code.co_freevars:
            p += _emit("COPY_FREE_VARS", len(code.co_freevars))
        for name in code.co_cellvars:  # fresh cells, filled with the values passed in
            if name in code.co_varnames:
                p += _emit("MAKE_CELL", code.co_varnames.index(name))
            else:
                k = own_cells.index(name)
                p += _emit("MAKE_CELL", len(varnames) + k)
                if cells[k]:
                    p += _emit("LOAD_FAST", nvars + len(stack_names) + k)
                    p += _emit("STORE_DEREF", len(varnames) + k)
        p += _emit("RESUME", 0)
        for name in unbound:
            p += _emit("DELETE_FAST", code.co_varnames.index(name))
        for i, kind in enumerate(stack_kinds):
            if kind == "null":
                p += _emit("PUSH_NULL")
            else:
                p += _emit("LOAD_FAST", nvars + i)
                if kind == "iter":
                    p += _emit("GET_ITER")
        p += _emit("JUMP_FORWARD", jump_arg)
        return bytes(p)

    # JUMP_FORWARD counts from the next instruction, which is where the original code begins.
    jump = offset // 2
    prologue = prologue_for(jump)
    body = _shift_free_args(code.co_code, shift, nvars)
    units = len(prologue) // 2
    entries = [
        _Entry(e.start + len(prologue), e.end + len(prologue), e.target + len(prologue), e.depth,
               e.lasti)  # fmt: skip
        for e in dis._parse_exception_table(code)
    ]
    positions = [p[0] for p in code.co_positions()]
    lines = [code.co_firstlineno] * units + positions
    flags = code.co_flags & ~(0x04 | 0x08)  # no *args / **kwargs: every slot is positional
    new = code.replace(
        co_code=prologue + body,
        co_varnames=varnames,
        co_argcount=len(varnames),
        co_posonlyargcount=0,
        co_kwonlyargcount=0,
        co_nlocals=len(varnames),
        co_flags=flags,
        co_stacksize=code.co_stacksize + len(stack_kinds) + 2,
        co_linetable=encode_line_table(lines, code.co_firstlineno),
        co_exceptiontable=encode_exception_table(entries),
        co_name=f"__resume_{code.co_name}_at_{offset}",
        co_qualname=f"{code.co_qualname}.<resume at {offset}>",
    )
    RESUME_ORIGIN[new] = (code, units)
    _RESUME_CACHE[key] = new
    return new


class _Entry:
    def __init__(self, start, end, target, depth, lasti):
        self.start, self.end, self.target, self.depth, self.lasti = start, end, target, depth, lasti


def make_resume_function(resume_code, f_globals: dict, closure) -> types.FunctionType:
    return types.FunctionType(resume_code, f_globals, resume_code.co_name, None, closure)
