// The PEP 523 frame hook, the per-code cache and the guard VM of ember.dynamo (CPython 3.11, 3.12).
//
// A compiled function installs the hook on entry and restores it on exit (CompiledFunction).
// While a thread's callback is set, every fresh Python frame it starts comes here: the code
// object's cache of (guards, transformed function) entries is searched; a hit calls the
// transformed function with the frame's arguments; a miss calls back into Python to convert the
// frame. Code marked "skip" and any frame of a thread with no callback run through the default
// evaluator, so unrelated code pays only a thread-local load while some other thread is inside
// compiled code, and nothing at all otherwise (the hook is uninstalled).
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <frameobject.h>
#include <pythread.h>
#include <structmember.h>

#include <cstring>
#include <vector>

#if PY_VERSION_HEX < 0x030B0000 || PY_VERSION_HEX >= 0x030D0000
#error "ember.dynamo's frame hook supports CPython 3.11 and 3.12"
#endif

namespace {

// Mirrors of CPython's private _PyInterpreterFrame (Include/internal/pycore_frame.h). The internal
// headers do not compile as C++, and these layouts are fixed within a minor release.
#if PY_VERSION_HEX >= 0x030C0000
struct Frame {
  PyCodeObject* f_code;
  void* previous;
  PyObject* f_funcobj;
  PyObject* f_globals;
  PyObject* f_builtins;
  PyObject* f_locals;
  PyFrameObject* frame_obj;
  void* prev_instr;
  int stacktop;
  uint16_t return_offset;
  char owner;
  PyObject* localsplus[1];
};
inline PyObject* frame_func(Frame* f) { return f->f_funcobj; }
#else
struct Frame {
  PyFunctionObject* f_func;
  PyObject* f_globals;
  PyObject* f_builtins;
  PyObject* f_locals;
  PyCodeObject* f_code;
  PyFrameObject* frame_obj;
  void* previous;
  void* prev_instr;
  int stacktop;
  bool is_entry;
  char owner;
  PyObject* localsplus[1];
};
inline PyObject* frame_func(Frame* f) { return (PyObject*)f->f_func; }
#endif
constexpr char kOwnedByThread = 0;

// ---------------------------------------------------------------------------------------------
// Guard VM: a flat list of instructions over registers, compiled once per cache entry.

enum GuardOp {
  G_ARG = 0,        // r[dst] = args[idx]
  G_GLOBAL = 1,     // r[dst] = globals[obj] or builtins[obj]
  G_ATTR = 2,       // r[dst] = getattr(r[src], obj)
  G_ITEM = 3,       // r[dst] = r[src][obj]
  G_CELL = 4,       // r[dst] = r[src].__closure__[idx].cell_contents
  G_CONST = 5,      // r[dst] = obj
  G_ID = 10,        // r[src] is obj
  G_TYPE = 11,      // type(r[src]) is obj
  G_EQ = 12,        // type(r[src]) is type(obj) and r[src] == obj
  G_LEN = 13,       // len(r[src]) == idx
  G_TENSOR = 14,    // r[src] matches obj = (type, dtype, device, requires_grad, sizes, strides)
  G_SAME = 15,      // r[src] is r[idx]
  G_DICT_KEYS = 16, // list(r[src].keys()) == obj
  G_GRAD_MODE = 17, // torch.is_grad_enabled() == bool(idx); obj is that function
  G_NOT_ID = 18,    // r[src] is not obj
  G_PARAM = 19,     // r[src] is obj[0] and matches obj[1] as G_TENSOR's obj (its metadata
                    // changes in place: `.data =`, resize_, set_)
  G_NO_HOOKS = 20,  // every attribute named in tuple obj of r[src] is an empty dict
  G_SYM_TENSOR = 21,  // r[src] matches obj = (type, dtype, device, requires_grad, size spec),
                      // is row-major contiguous, and its dynamic sizes go to int slots (below)
  G_INT_EXPR = 22,    // the int program in tuple obj evaluates to non-zero over the int slots
  G_CALL_IS = 23,     // obj[0]() is obj[1]: process state (default dtype, autocast dtype)
  G_SYM_ARRAY = 24,   // r[src] (an ndarray) has the size spec obj, C order with idx-byte items;
                      // its dynamic sizes go to int slots (its type and dtype: other guards)
};

// Programs over int slots (dynamic sizes): postfix, int64. symbolic.py emits them.
enum IntOp {
  I_SLOT, I_CONST, I_ADD, I_MUL, I_FLOORDIV, I_MOD, I_NEG, I_EQ, I_NE, I_LT, I_LE, I_GT, I_GE,
  I_AND, I_OR, I_NOT, I_MIN, I_MAX, I_CEILDIV,
};

struct GuardInstr {
  int op, dst, src;
  Py_ssize_t idx;
  PyObject* obj;               // strong reference
  std::vector<long long> ints;  // G_SYM_TENSOR/G_SYM_ARRAY: size spec (n >= 0 static, -1-k
                                // slot k);
                                // G_INT_EXPR: the program
};

struct GuardProgram {
  PyObject_HEAD
  std::vector<GuardInstr>* code;
  int nregs;
  int nslots;
};

// Python's floor division and modulo (sizes are non-negative, but a guard must never be wrong).
bool floordiv(long long a, long long b, long long* out) {
  if (b == 0) return false;
  long long q = a / b;
  if ((a % b != 0) && ((a < 0) != (b < 0))) q--;
  *out = q;
  return true;
}

bool eval_int_program(const std::vector<long long>& prog, const long long* slots) {
  long long st[32];
  int sp = 0;
  for (size_t i = 0; i < prog.size(); i++) {
    long long op = prog[i];
    if (op == I_SLOT || op == I_CONST) {
      if (sp >= 32) return false;
      long long arg = prog[++i];
      st[sp++] = op == I_SLOT ? slots[arg] : arg;
      continue;
    }
    if (op == I_NEG || op == I_NOT) {
      if (sp < 1) return false;
      st[sp - 1] = op == I_NEG ? -st[sp - 1] : !st[sp - 1];
      continue;
    }
    if (sp < 2) return false;
    long long b = st[--sp], a = st[sp - 1], r = 0;
    switch (op) {
      case I_ADD: r = a + b; break;
      case I_MUL: r = a * b; break;
      case I_FLOORDIV:
        if (!floordiv(a, b, &r)) return false;
        break;
      case I_CEILDIV:
        if (!floordiv(-a, b, &r)) return false;
        r = -r;
        break;
      case I_MOD:
        if (!floordiv(a, b, &r)) return false;
        r = a - r * b;
        break;
      case I_EQ: r = a == b; break;
      case I_NE: r = a != b; break;
      case I_LT: r = a < b; break;
      case I_LE: r = a <= b; break;
      case I_GT: r = a > b; break;
      case I_GE: r = a >= b; break;
      case I_AND: r = a && b; break;
      case I_OR: r = a || b; break;
      case I_MIN: r = a < b ? a : b; break;
      case I_MAX: r = a > b ? a : b; break;
      default: return false;
    }
    st[sp - 1] = r;
  }
  return sp == 1 && st[0] != 0;
}

PyObject *s_dtype, *s_device, *s_requires_grad, *s_shape, *s_stride, *s_closure, *s_keys;
PyObject *s_strides, *s_getattribute;
PyObject* object_getattribute;  // object.__getattribute__ (borrowed from the base type)

// obj.name, as PyObject_GetAttr returns it, without the detour a class with a Python __getattr__
// takes on every read (nn.Module: its hook slot looks __getattribute__ up and calls it): where
// the class keeps object.__getattribute__ and names no data descriptor `name`, the instance's
// __dict__ decides; anything else (or a name the dict lacks) takes the generic path.
PyObject* instance_getattr(PyObject* obj, PyObject* name) {
  PyTypeObject* tp = Py_TYPE(obj);
  if (tp->tp_getattro == PyObject_GenericGetAttr || tp->tp_dictoffset == 0 ||
      _PyType_Lookup(tp, s_getattribute) != object_getattribute)
    return PyObject_GetAttr(obj, name);
  PyObject* descr = _PyType_Lookup(tp, name);
  if (descr && Py_TYPE(descr)->tp_descr_set) return PyObject_GetAttr(obj, name);
  PyObject* dict = PyObject_GenericGetDict(obj, nullptr);
  if (!dict) {
    PyErr_Clear();
    return PyObject_GetAttr(obj, name);
  }
  PyObject* v = PyDict_GetItemWithError(dict, name);
  Py_XINCREF(v);
  Py_DECREF(dict);
  if (v || PyErr_Occurred()) return v;
  return PyObject_GetAttr(obj, name);
}

// spec: (type, dtype, device, requires_grad, sizes, strides). The checks both tensor guards share:
// exact type, dtype and requires_grad (interned objects: identity), then the device.
bool tensor_head_matches(PyObject* x, PyObject* spec) {
  if ((PyObject*)Py_TYPE(x) != PyTuple_GET_ITEM(spec, 0)) return false;
  PyObject* dtype = PyObject_GetAttr(x, s_dtype);
  bool ok = dtype && dtype == PyTuple_GET_ITEM(spec, 1);
  Py_XDECREF(dtype);
  if (!ok) return false;
  PyObject* rg = PyObject_GetAttr(x, s_requires_grad);
  ok = rg && rg == PyTuple_GET_ITEM(spec, 3);
  Py_XDECREF(rg);
  return ok;
}

bool device_matches(PyObject* x, PyObject* spec) {
  PyObject* dev = PyObject_GetAttr(x, s_device);
  bool ok = dev && PyObject_RichCompareBool(dev, PyTuple_GET_ITEM(spec, 2), Py_EQ) == 1;
  Py_XDECREF(dev);
  return ok;
}

bool tensor_matches(PyObject* x, PyObject* spec) {
  if (!tensor_head_matches(x, spec)) return false;
  bool ok = false;
  PyObject* stride = nullptr;
  PyObject* shape = PyObject_GetAttr(x, s_shape);
  if (!shape || PyObject_RichCompareBool(shape, PyTuple_GET_ITEM(spec, 4), Py_EQ) != 1) goto done;
  stride = PyObject_CallMethodNoArgs(x, s_stride);
  if (!stride || PyObject_RichCompareBool(stride, PyTuple_GET_ITEM(spec, 5), Py_EQ) != 1) goto done;
  ok = device_matches(x, spec);
done:
  Py_XDECREF(shape);
  Py_XDECREF(stride);
  return ok;
}

// A tensor with dynamic sizes: exact type, dtype, requires_grad and device; static sizes equal,
// dynamic ones stored into their slots; strides exactly row-major for the actual sizes.
bool sym_tensor_matches(PyObject* x, const GuardInstr& in, long long* slots) {
  PyObject* spec = in.obj;
  if (!tensor_head_matches(x, spec)) return false;
  bool ok = false;
  PyObject* stride = nullptr;
  Py_ssize_t n = (Py_ssize_t)in.ints.size();
  long long expect = 1;
  PyObject* shape = PyObject_GetAttr(x, s_shape);
  if (!shape || !PyTuple_Check(shape) || PyTuple_GET_SIZE(shape) != n) goto done;
  stride = PyObject_CallMethodNoArgs(x, s_stride);
  if (!stride || !PyTuple_Check(stride) || PyTuple_GET_SIZE(stride) != n) goto done;
  for (Py_ssize_t d = n - 1; d >= 0; d--) {
    long long size = PyLong_AsLongLong(PyTuple_GET_ITEM(shape, d));
    long long st = PyLong_AsLongLong(PyTuple_GET_ITEM(stride, d));
    if (PyErr_Occurred() || st != expect) goto done;
    long long want = in.ints[d];
    if (want >= 0 && size != want) goto done;
    if (want < 0) slots[-1 - want] = size;
    expect *= size;
  }
  ok = device_matches(x, spec);
done:
  Py_XDECREF(shape);
  Py_XDECREF(stride);
  return ok;
}

// An ndarray with dynamic sizes: static sizes equal, dynamic ones stored into their slots, byte
// strides exactly C order for the actual sizes (`itemsize` bytes an element).
bool sym_array_matches(PyObject* x, const GuardInstr& in, long long* slots) {
  bool ok = false;
  PyObject* strides = nullptr;
  Py_ssize_t n = (Py_ssize_t)in.ints.size();
  long long expect = (long long)in.idx;
  PyObject* shape = PyObject_GetAttr(x, s_shape);
  if (!shape || !PyTuple_Check(shape) || PyTuple_GET_SIZE(shape) != n) goto done;
  strides = PyObject_GetAttr(x, s_strides);
  if (!strides || !PyTuple_Check(strides) || PyTuple_GET_SIZE(strides) != n) goto done;
  for (Py_ssize_t d = n - 1; d >= 0; d--) {
    long long size = PyLong_AsLongLong(PyTuple_GET_ITEM(shape, d));
    long long st = PyLong_AsLongLong(PyTuple_GET_ITEM(strides, d));
    if (PyErr_Occurred() || st != expect) goto done;
    long long want = in.ints[d];
    if (want >= 0 && size != want) goto done;
    if (want < 0) slots[-1 - want] = size;
    expect *= size;
  }
  ok = true;
done:
  PyErr_Clear();
  Py_XDECREF(shape);
  Py_XDECREF(strides);
  return ok;
}

bool run_check(const GuardInstr& in, PyObject** r, long long* slots) {
  PyObject* v = r[in.src];
  switch (in.op) {
    case G_ID: return v == in.obj;
    case G_NOT_ID: return v != in.obj;
    case G_TYPE: return (PyObject*)Py_TYPE(v) == in.obj;
    case G_EQ:
      return Py_TYPE(v) == Py_TYPE(in.obj) && PyObject_RichCompareBool(v, in.obj, Py_EQ) == 1;
    case G_LEN: return PyObject_Length(v) == in.idx;
    case G_TENSOR: return tensor_matches(v, in.obj);
    case G_SYM_TENSOR: return sym_tensor_matches(v, in, slots);
    case G_SYM_ARRAY: return sym_array_matches(v, in, slots);
    case G_INT_EXPR: return eval_int_program(in.ints, slots);
    case G_NO_HOOKS: {
      for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(in.obj); i++) {
        PyObject* d = instance_getattr(v, PyTuple_GET_ITEM(in.obj, i));
        bool empty = d && PyDict_Check(d) && PyDict_GET_SIZE(d) == 0;
        Py_XDECREF(d);
        if (!empty) return false;
      }
      return true;
    }
    case G_PARAM:
      return v == PyTuple_GET_ITEM(in.obj, 0) && tensor_matches(v, PyTuple_GET_ITEM(in.obj, 1));
    case G_SAME: return v == r[in.idx];
    case G_DICT_KEYS: {
      if (!PyDict_Check(v) || PyDict_GET_SIZE(v) != PyTuple_GET_SIZE(in.obj)) return false;
      Py_ssize_t pos = 0, i = 0;
      PyObject *k, *val;
      while (PyDict_Next(v, &pos, &k, &val)) {
        PyObject* want = PyTuple_GET_ITEM(in.obj, i++);
        if (k != want && PyObject_RichCompareBool(k, want, Py_EQ) != 1) return false;
      }
      return true;
    }
    case G_GRAD_MODE: {
      PyObject* res = PyObject_CallNoArgs(in.obj);
      bool ok = res && ((res == Py_True) == (in.idx != 0));
      Py_XDECREF(res);
      return ok;
    }
    case G_CALL_IS: {
      PyObject* res = PyObject_CallNoArgs(PyTuple_GET_ITEM(in.obj, 0));
      bool ok = res && res == PyTuple_GET_ITEM(in.obj, 1);
      Py_XDECREF(res);
      return ok;
    }
  }
  return false;
}

// Runs the program; returns the index of the first failing instruction, or -1 when all pass.
Py_ssize_t run_guards(GuardProgram* p, PyObject* const* args, Py_ssize_t nargs, PyObject* globals,
                      PyObject* builtins) {
  PyObject* stack_regs[64];
  std::vector<PyObject*> heap_regs;
  PyObject** r = stack_regs;
  if (p->nregs > 64) {
    heap_regs.assign(p->nregs, nullptr);
    r = heap_regs.data();
  } else {
    std::memset(stack_regs, 0, sizeof(PyObject*) * p->nregs);
  }
  long long stack_slots[16];
  std::vector<long long> heap_slots;
  long long* slots = stack_slots;
  if (p->nslots > 16) {
    heap_slots.assign(p->nslots, 0);
    slots = heap_slots.data();
  }
  Py_ssize_t failed = -1;
  const std::vector<GuardInstr>& code = *p->code;
  for (size_t i = 0; i < code.size(); i++) {
    const GuardInstr& in = code[i];
    PyObject* out = nullptr;
    switch (in.op) {
      case G_ARG:
        if (in.idx >= nargs) break;
        out = args[in.idx];
        Py_INCREF(out);
        break;
      case G_GLOBAL:
        out = PyDict_GetItemWithError(globals, in.obj);
        if (!out && !PyErr_Occurred() && builtins && PyDict_Check(builtins))
          out = PyDict_GetItemWithError(builtins, in.obj);
        Py_XINCREF(out);
        break;
      case G_ATTR: out = instance_getattr(r[in.src], in.obj); break;
      case G_CONST:
        out = in.obj;
        Py_INCREF(out);
        break;
      case G_ITEM:
        if (PyDict_CheckExact(r[in.src])) {
          out = PyDict_GetItemWithError(r[in.src], in.obj);
          Py_XINCREF(out);
        } else {
          out = PyObject_GetItem(r[in.src], in.obj);
        }
        break;
      case G_CELL: {
        PyObject* clo = PyObject_GetAttr(r[in.src], s_closure);
        if (clo && PyTuple_Check(clo) && in.idx < PyTuple_GET_SIZE(clo)) {
          out = PyCell_Get(PyTuple_GET_ITEM(clo, in.idx));
        }
        Py_XDECREF(clo);
        break;
      }
      default:
        if (!run_check(in, r, slots)) failed = (Py_ssize_t)i;
        if (failed >= 0) goto finish;
        continue;
    }
    if (!out) {
      failed = (Py_ssize_t)i;
      goto finish;
    }
    r[in.dst] = out;
  }
finish:
  if (PyErr_Occurred()) PyErr_Clear();
  for (int i = 0; i < p->nregs; i++) Py_XDECREF(r[i]);
  return failed;
}

void GuardProgram_dealloc(GuardProgram* self) {
  if (self->code) {
    for (auto& in : *self->code) Py_XDECREF(in.obj);
    delete self->code;
  }
  Py_TYPE(self)->tp_free((PyObject*)self);
}

// The int operands of G_SYM_TENSOR (its size spec) and G_INT_EXPR (its program), checked:
// every slot they name exists. Returns false with an exception set otherwise.
bool parse_ints(GuardInstr& in, int nslots) {
  if (in.op == G_CALL_IS && !(PyTuple_Check(in.obj) && PyTuple_GET_SIZE(in.obj) == 2)) {
    PyErr_SetString(PyExc_ValueError, "G_CALL_IS takes (callable, expected)");
    return false;
  }
  if (in.op != G_SYM_TENSOR && in.op != G_INT_EXPR && in.op != G_SYM_ARRAY) return true;
  PyObject* t = in.op != G_SYM_TENSOR ? in.obj : PyTuple_Check(in.obj) && PyTuple_GET_SIZE(in.obj) == 5
                                                  ? PyTuple_GET_ITEM(in.obj, 4)
                                                  : nullptr;
  if (!t || !PyTuple_Check(t)) {
    PyErr_SetString(PyExc_TypeError, "malformed int-slot guard operand");
    return false;
  }
  for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(t); i++) {
    long long v = PyLong_AsLongLong(PyTuple_GET_ITEM(t, i));
    if (v == -1 && PyErr_Occurred()) return false;
    in.ints.push_back(v);
  }
  bool bad = false;
  if (in.op != G_INT_EXPR) {
    for (long long v : in.ints) bad |= v < 0 && -1 - v >= nslots;
  } else {
    for (size_t i = 0; i < in.ints.size(); i++) {
      long long op = in.ints[i];
      if (op == I_SLOT || op == I_CONST) {
        if (i + 1 >= in.ints.size()) bad = true;
        else if (op == I_SLOT) bad |= in.ints[i + 1] < 0 || in.ints[i + 1] >= nslots;
        i++;
      }
    }
  }
  if (bad) PyErr_SetString(PyExc_ValueError, "guard int slot out of range");
  return !bad;
}

PyObject* GuardProgram_new(PyTypeObject* type, PyObject* args, PyObject*) {
  PyObject* instrs;
  int nregs, nslots = 0;
  if (!PyArg_ParseTuple(args, "Oi|i", &instrs, &nregs, &nslots)) return nullptr;
  PyObject* seq = PySequence_Fast(instrs, "instructions must be a sequence");
  if (!seq) return nullptr;
  auto* code = new std::vector<GuardInstr>();
  for (Py_ssize_t i = 0; i < PySequence_Fast_GET_SIZE(seq); i++) {
    GuardInstr in{};
    if (!PyArg_ParseTuple(PySequence_Fast_GET_ITEM(seq, i), "iiinO", &in.op, &in.dst, &in.src,
                          &in.idx, &in.obj)) {
      for (auto& prev : *code) Py_XDECREF(prev.obj);
      delete code;
      Py_DECREF(seq);
      return nullptr;
    }
    if (in.dst >= nregs || in.src >= nregs || in.dst < 0 || in.src < 0 ||
        !parse_ints(in, nslots)) {
      if (!PyErr_Occurred())
        PyErr_SetString(PyExc_ValueError, "guard instruction register out of range");
      for (auto& prev : *code) Py_XDECREF(prev.obj);
      delete code;
      Py_DECREF(seq);
      return nullptr;
    }
    Py_INCREF(in.obj);
    code->push_back(in);
  }
  Py_DECREF(seq);
  auto* self = (GuardProgram*)type->tp_alloc(type, 0);
  if (!self) return nullptr;
  self->code = code;
  self->nregs = nregs;
  self->nslots = nslots;
  return (PyObject*)self;
}

// check(args_tuple, globals, builtins) -> index of the first failing instruction or -1.
PyObject* GuardProgram_check(GuardProgram* self, PyObject* args) {
  PyObject *tup, *globals, *builtins;
  if (!PyArg_ParseTuple(args, "O!O!O", &PyTuple_Type, &tup, &PyDict_Type, &globals, &builtins))
    return nullptr;
  Py_ssize_t failed = run_guards(self, &PyTuple_GET_ITEM(tup, 0), PyTuple_GET_SIZE(tup), globals,
                                 builtins);
  return PyLong_FromSsize_t(failed);
}

PyMethodDef GuardProgram_methods[] = {
    {"check", (PyCFunction)GuardProgram_check, METH_VARARGS,
     "check(args, globals, builtins) -> index of the first failing guard, or -1"},
    {nullptr, nullptr, 0, nullptr}};

PyObject* GuardProgram_len(GuardProgram* self, void*) {
  return PyLong_FromSize_t(self->code->size());
}

PyGetSetDef GuardProgram_getset[] = {
    {"size", (getter)GuardProgram_len, nullptr, "number of instructions", nullptr},
    {nullptr, nullptr, nullptr, nullptr, nullptr}};

PyTypeObject GuardProgramType = {PyVarObject_HEAD_INIT(nullptr, 0) "ember.dynamo._C.GuardProgram"};

// ---------------------------------------------------------------------------------------------
// Per-code cache, stored in the code object's extra slot.

struct Entry {
  PyObject* program;  // GuardProgram
  PyObject* fn;       // transformed function, or None: run the original code
  PyObject* owner;    // the compile context that made it (backend and options)
  PyObject* globals;  // borrowed identity only: the globals dict the guards assumed
};

// Changes whenever any code's entries do (an insert, a new state after reset): a thread that
// waited for the compile lock sees whether another thread compiled this code meanwhile.
uint64_t cache_generation = 0;

struct CodeState {
  bool skip = false;
  uint64_t generation = ++cache_generation;
  std::vector<Entry> entries;
};

Py_ssize_t extra_index = -1;

void free_code_state(void* p) {
  // CPython calls every registered free function for every slot of a code object's extras, set or
  // not: a code object that only another hook (torch's own compiler, say) gave extras reaches us
  // with nullptr.
  if (!p) return;
  auto* st = (CodeState*)p;
  // At interpreter shutdown the collector frees code objects in an order that can leave an
  // entry's objects already torn down; the process is ending, so let them go without DECREFs.
  if (_Py_IsFinalizing()) {
    delete st;
    return;
  }
  for (auto& e : st->entries) {
    Py_XDECREF(e.program);
    Py_XDECREF(e.fn);
    Py_XDECREF(e.owner);
  }
  delete st;
}

CodeState* get_state(PyObject* code, bool create) {
  void* extra = nullptr;
  if (_PyCode_GetExtra(code, extra_index, &extra) < 0) {
    PyErr_Clear();
    return nullptr;
  }
  if (!extra && create) {
    extra = new CodeState();
    if (_PyCode_SetExtra(code, extra_index, extra) < 0) {
      delete (CodeState*)extra;
      return nullptr;
    }
  }
  return (CodeState*)extra;
}

// ---------------------------------------------------------------------------------------------
// The hook.

thread_local PyObject* tl_callback = nullptr;  // strong; nullptr or None: inactive
int active_threads = 0;

bool is_active(PyObject* cb) { return cb != nullptr && cb != Py_None; }

#if PY_VERSION_HEX >= 0x030C0000
// 3.12 makes the evaluator responsible for clearing and popping the frame it was handed.
void clear_and_pop_frame(PyThreadState* ts, Frame* f) {
  for (int i = 0; i < f->stacktop; i++) Py_XDECREF(f->localsplus[i]);
  Py_XDECREF(f->f_locals);
  Py_DECREF(f->f_funcobj);
  Py_DECREF(f->f_code);
  PyObject** base = (PyObject**)f;
  _PyStackChunk* chunk = ts->datastack_chunk;
  if (base == &chunk->data[0]) {
    _PyStackChunk* prev = chunk->previous;
    ts->datastack_top = &prev->data[prev->top];
    ts->datastack_chunk = prev;
    ts->datastack_limit = (PyObject**)(((char*)prev) + prev->size);
    PyObjectArenaAllocator arena;
    PyObject_GetArenaAllocator(&arena);
    arena.free(arena.ctx, chunk, chunk->size);
  } else {
    ts->datastack_top = base;
  }
}
#else
void clear_and_pop_frame(PyThreadState*, Frame*) {}  // 3.11: the caller does it
#endif

Py_ssize_t frame_nargs(PyCodeObject* code) {
  Py_ssize_t n = code->co_argcount + code->co_kwonlyargcount;
  if (code->co_flags & CO_VARARGS) n++;
  if (code->co_flags & CO_VARKEYWORDS) n++;
  return n;
}

PyObject* call_entry_fn(PyObject* fn, PyObject* const* argv, Py_ssize_t n) {
  return PyObject_Vectorcall(fn, argv, (size_t)n, nullptr);
}

// One thread converts at a time: conversion reads and writes process-wide state (torch's RNG,
// dynamo's statistics and automatic-dynamic memory, a backend's caches). The lock is
// ember.ir.locks.COMPILE_LOCK, a threading.RLock that aot_autograd's lazy compile and inductor
// take too: one lock for every compile in the process, so no two locks can be taken in opposite
// orders. Re-entrant for its owner, whose conversion may run compiled code that misses in turn;
// a waiting thread releases the GIL (RLock.acquire does) so the owner can finish.
PyObject* compile_lock = nullptr;
PyObject* s_acquire = nullptr;
PyObject* s_release = nullptr;

// False with an exception set (a signal handler raised while waiting).
bool acquire_compile_lock() {
  PyObject* r = PyObject_CallMethodNoArgs(compile_lock, s_acquire);
  if (!r) return false;
  Py_DECREF(r);
  return true;
}

// May be called with an exception pending (a failed conversion): kept as it was.
void release_compile_lock() {
  PyObject *type, *value, *tb;
  PyErr_Fetch(&type, &value, &tb);
  PyObject* r = PyObject_CallMethodNoArgs(compile_lock, s_release);
  if (r) {
    Py_DECREF(r);
  } else {
    PyErr_WriteUnraisable(compile_lock);
  }
  PyErr_Restore(type, value, tb);
}

// Runs `fn` (a new reference, consumed) in place of the frame; None runs the original code.
PyObject* run_entry(PyThreadState* ts, struct _PyInterpreterFrame* iframe, PyObject* fn,
                    PyObject* const* argv, Py_ssize_t n) {
  if (fn == Py_None) {
    Py_DECREF(fn);
    return _PyEval_EvalFrameDefault(ts, iframe, 0);
  }
  PyObject* result = call_entry_fn(fn, argv, n);
  Py_DECREF(fn);
  clear_and_pop_frame(ts, (Frame*)iframe);
  return result;
}

// The transformed function (a new reference) of the first entry whose guards pass, or nullptr.
// Guards may run Python, and so let another thread insert entries or reset this code's cache:
// the entry being checked is held by reference, never through the vector.
PyObject* lookup(PyObject* code, PyObject* owner, Frame* f, PyObject* const* argv, Py_ssize_t n) {
  for (size_t i = 0;; i++) {
    CodeState* st = get_state(code, false);
    if (!st || i >= st->entries.size()) return nullptr;
    Entry e = st->entries[i];
    if (e.owner != owner || e.globals != f->f_globals) continue;
    Py_INCREF(e.program);
    Py_INCREF(e.fn);
    // Guards may run Python (a property, a class's __getattribute__): never capture those frames.
    PyObject* cb = tl_callback;
    tl_callback = nullptr;
    Py_ssize_t failed = run_guards((GuardProgram*)e.program, argv, n, f->f_globals, f->f_builtins);
    tl_callback = cb;
    if (failed >= 0) {
      Py_DECREF(e.program);
      Py_DECREF(e.fn);
      continue;
    }
    st = get_state(code, false);  // most recently used first, if it is still there
    if (st) {
      for (size_t j = 0; j < st->entries.size(); j++) {
        if (st->entries[j].program == e.program) {
          if (j != 0) std::swap(st->entries[0], st->entries[j]);
          break;
        }
      }
    }
    Py_DECREF(e.program);
    return e.fn;
  }
}

PyObject* eval_hook(PyThreadState* ts, struct _PyInterpreterFrame* iframe, int throwflag) {
  PyObject* cb = tl_callback;
  Frame* f = (Frame*)iframe;
  if (!is_active(cb) || throwflag) return _PyEval_EvalFrameDefault(ts, iframe, throwflag);
  PyCodeObject* code = f->f_code;
  if ((code->co_flags & (CO_GENERATOR | CO_COROUTINE | CO_ASYNC_GENERATOR)) ||
      f->prev_instr != (void*)((_Py_CODEUNIT*)code->co_code_adaptive - 1) ||
      f->frame_obj != nullptr || f->owner != kOwnedByThread || frame_func(f) == nullptr) {
    return _PyEval_EvalFrameDefault(ts, iframe, throwflag);
  }
  CodeState* st = get_state((PyObject*)code, true);
  if (!st || st->skip) return _PyEval_EvalFrameDefault(ts, iframe, throwflag);

  Py_ssize_t nargs = frame_nargs(code);
  PyObject* small[16];
  std::vector<PyObject*> big;
  PyObject** argv = small;
  if (nargs + 1 > 16) {
    big.resize(nargs + 1);
    argv = big.data();
  }
  argv[0] = frame_func(f);
  for (Py_ssize_t i = 0; i < nargs; i++) argv[i + 1] = f->localsplus[i];

  // `cb` stays alive while this frame runs: the CompiledFunction that set it holds it.
  PyObject* fn = lookup((PyObject*)code, cb, f, argv, nargs + 1);
  if (fn) return run_entry(ts, iframe, fn, argv, nargs + 1);

  // Miss. Wait for the compile lock; if another thread changed this code's entries meanwhile
  // (it compiled the same frame, or reset the cache), look again before converting.
  for (;;) {
    st = get_state((PyObject*)code, true);
    if (!st) return _PyEval_EvalFrameDefault(ts, iframe, throwflag);
    uint64_t seen = st->generation;
    if (!acquire_compile_lock()) {
      clear_and_pop_frame(ts, f);
      return nullptr;
    }
    st = get_state((PyObject*)code, true);
    if (st && st->generation == seen) break;
    release_compile_lock();
    if (st && st->skip) return _PyEval_EvalFrameDefault(ts, iframe, throwflag);
    fn = lookup((PyObject*)code, cb, f, argv, nargs + 1);
    if (fn) return run_entry(ts, iframe, fn, argv, nargs + 1);
  }

  // Convert with the hook inactive for this thread (the translator runs Python and torch).
  PyObject* args = PyTuple_New(nargs);
  if (!args) {
    release_compile_lock();
    clear_and_pop_frame(ts, f);
    return nullptr;
  }
  for (Py_ssize_t i = 0; i < nargs; i++) {
    PyObject* v = f->localsplus[i];
    if (!v) v = Py_None;
    Py_INCREF(v);
    PyTuple_SET_ITEM(args, i, v);
  }
  PyObject* saved = tl_callback;
  tl_callback = nullptr;
  PyObject* res = PyObject_CallFunction(cb, "OOOOO", (PyObject*)code, frame_func(f), f->f_globals,
                                        f->f_builtins, args);
  tl_callback = saved;
  Py_DECREF(args);
  if (!res) {
    release_compile_lock();
    clear_and_pop_frame(ts, f);
    return nullptr;
  }
  st = get_state((PyObject*)code, true);  // conversion may have reset the cache
  if (res == Py_None || !st) {
    Py_DECREF(res);
    if (st) st->skip = true;
    release_compile_lock();
    return _PyEval_EvalFrameDefault(ts, iframe, throwflag);
  }
  PyObject* program;
  if (!PyArg_ParseTuple(res, "O!O", &GuardProgramType, &program, &fn)) {
    Py_DECREF(res);
    release_compile_lock();
    clear_and_pop_frame(ts, f);
    return nullptr;
  }
  Py_INCREF(program);
  Py_INCREF(fn);
  Py_INCREF(cb);
  st->entries.insert(st->entries.begin(), Entry{program, fn, cb, f->f_globals});
  st->generation = ++cache_generation;
  release_compile_lock();
  Py_INCREF(fn);
  Py_DECREF(res);  // may run destructors (Python): after the entry is in place and the lock free
  return run_entry(ts, iframe, fn, argv, nargs + 1);
}

// Sets this thread's callback (None or NULL: inactive) and returns the previous one (a new ref).
PyObject* swap_callback(PyObject* cb) {
  PyObject* prev = tl_callback;
  bool was = is_active(prev), now = is_active(cb);
  Py_XINCREF(cb);
  tl_callback = cb;
  PyInterpreterState* interp = PyThreadState_GET()->interp;
  if (!was && now && active_threads++ == 0) {
    _PyInterpreterState_SetEvalFrameFunc(interp, eval_hook);
  } else if (was && !now && --active_threads == 0) {
    _PyInterpreterState_SetEvalFrameFunc(interp, _PyEval_EvalFrameDefault);
  }
  if (!prev) Py_RETURN_NONE;
  return prev;
}

// ---------------------------------------------------------------------------------------------
// CompiledFunction: calls `fn` with this thread's callback set to `callback` (None disables).

struct CompiledFunction {
  PyObject_HEAD
  PyObject* fn;
  PyObject* callback;
  PyObject* dict;
  vectorcallfunc vectorcall;
};

PyObject* CompiledFunction_vectorcall(PyObject* self_, PyObject* const* args, size_t nargsf,
                                      PyObject* kwnames) {
  auto* self = (CompiledFunction*)self_;
  PyObject* prev = swap_callback(self->callback);
  PyObject* res = PyObject_Vectorcall(self->fn, args, nargsf, kwnames);
  PyObject* cur = swap_callback(prev);
  Py_DECREF(prev);
  Py_DECREF(cur);
  return res;
}

PyObject* CompiledFunction_new(PyTypeObject* type, PyObject* args, PyObject*) {
  PyObject *fn, *cb;
  if (!PyArg_ParseTuple(args, "OO", &fn, &cb)) return nullptr;
  auto* self = (CompiledFunction*)type->tp_alloc(type, 0);
  if (!self) return nullptr;
  Py_INCREF(fn);
  Py_INCREF(cb);
  self->fn = fn;
  self->callback = cb;
  self->dict = nullptr;
  self->vectorcall = CompiledFunction_vectorcall;
  return (PyObject*)self;
}

int CompiledFunction_traverse(CompiledFunction* self, visitproc visit, void* arg) {
  Py_VISIT(self->fn);
  Py_VISIT(self->callback);
  Py_VISIT(self->dict);
  return 0;
}

int CompiledFunction_clear(CompiledFunction* self) {
  Py_CLEAR(self->fn);
  Py_CLEAR(self->callback);
  Py_CLEAR(self->dict);
  return 0;
}

void CompiledFunction_dealloc(CompiledFunction* self) {
  PyObject_GC_UnTrack(self);
  CompiledFunction_clear(self);
  Py_TYPE(self)->tp_free((PyObject*)self);
}

PyObject* CompiledFunction_descr_get(PyObject* self, PyObject* obj, PyObject*) {
  if (obj == nullptr || obj == Py_None) {
    Py_INCREF(self);
    return self;
  }
  return PyMethod_New(self, obj);
}

PyMemberDef CompiledFunction_members[] = {
    {"_ember_fn", T_OBJECT, offsetof(CompiledFunction, fn), READONLY, "the wrapped callable"},
    {"_ember_callback", T_OBJECT, offsetof(CompiledFunction, callback), READONLY, "the callback"},
    {nullptr, 0, 0, 0, nullptr}};

PyGetSetDef CompiledFunction_getset[] = {
    {"__dict__", PyObject_GenericGetDict, PyObject_GenericSetDict, nullptr, nullptr},
    {nullptr, nullptr, nullptr, nullptr, nullptr}};

PyTypeObject CompiledFunctionType = {
    PyVarObject_HEAD_INIT(nullptr, 0) "ember.dynamo._C.CompiledFunction"};

// ---------------------------------------------------------------------------------------------
// Module functions.

PyObject* py_set_callback(PyObject*, PyObject* cb) { return swap_callback(cb); }

PyObject* py_get_callback(PyObject*, PyObject*) {
  PyObject* cb = tl_callback ? tl_callback : Py_None;
  Py_INCREF(cb);
  return cb;
}

PyObject* py_mark_skip(PyObject*, PyObject* code) {
  if (!PyCode_Check(code)) return PyErr_Format(PyExc_TypeError, "expected a code object");
  CodeState* st = get_state(code, true);
  if (!st) return nullptr;
  st->skip = true;
  Py_RETURN_NONE;
}

PyObject* py_clear_code(PyObject*, PyObject* code) {
  if (!PyCode_Check(code)) return PyErr_Format(PyExc_TypeError, "expected a code object");
  CodeState* st = get_state(code, false);
  if (st) {
    // Setting the slot frees the old state (CPython calls our free function); detach the entries
    // first so their destructors run after the code no longer points at freed memory.
    std::vector<Entry> entries;
    entries.swap(st->entries);
    _PyCode_SetExtra(code, extra_index, nullptr);
    for (auto& e : entries) {
      Py_XDECREF(e.program);
      Py_XDECREF(e.fn);
      Py_XDECREF(e.owner);
    }
  }
  Py_RETURN_NONE;
}

// entries(code) -> [(program, fn, owner)], most recently used first; None when marked skip.
PyObject* py_entries(PyObject*, PyObject* code) {
  if (!PyCode_Check(code)) return PyErr_Format(PyExc_TypeError, "expected a code object");
  CodeState* st = get_state(code, false);
  if (st && st->skip) Py_RETURN_NONE;
  PyObject* out = PyList_New(0);
  if (!st || !out) return out;
  for (auto& e : st->entries) {
    PyObject* t = Py_BuildValue("(OOO)", e.program, e.fn, e.owner);
    if (!t || PyList_Append(out, t) < 0) {
      Py_XDECREF(t);
      Py_DECREF(out);
      return nullptr;
    }
    Py_DECREF(t);
  }
  return out;
}

PyObject* py_hook_installed(PyObject*, PyObject*) {
  PyInterpreterState* interp = PyThreadState_GET()->interp;
  return PyBool_FromLong(_PyInterpreterState_GetEvalFrameFunc(interp) == eval_hook);
}

PyMethodDef module_methods[] = {
    {"set_callback", py_set_callback, METH_O, "set this thread's callback, return the previous"},
    {"get_callback", py_get_callback, METH_NOARGS, "this thread's callback"},
    {"mark_skip", py_mark_skip, METH_O, "run this code object eagerly from now on"},
    {"clear_code", py_clear_code, METH_O, "drop a code object's cache entries and skip mark"},
    {"entries", py_entries, METH_O, "a code object's cache entries"},
    {"hook_installed", py_hook_installed, METH_NOARGS, "whether the frame hook is installed"},
    {nullptr, nullptr, 0, nullptr}};

PyModuleDef module_def = {PyModuleDef_HEAD_INIT, "_C", "ember.dynamo frame hook and guards", -1,
                          module_methods};

}  // namespace

PyMODINIT_FUNC PyInit__C(void) {
  GuardProgramType.tp_basicsize = sizeof(GuardProgram);
  GuardProgramType.tp_flags = Py_TPFLAGS_DEFAULT;
  GuardProgramType.tp_new = GuardProgram_new;
  GuardProgramType.tp_dealloc = (destructor)GuardProgram_dealloc;
  GuardProgramType.tp_methods = GuardProgram_methods;
  GuardProgramType.tp_getset = GuardProgram_getset;
  GuardProgramType.tp_doc = "GuardProgram(instructions, nregs, nslots=0): a compiled list of guard checks";
  if (PyType_Ready(&GuardProgramType) < 0) return nullptr;

  CompiledFunctionType.tp_basicsize = sizeof(CompiledFunction);
  CompiledFunctionType.tp_flags =
      Py_TPFLAGS_DEFAULT | Py_TPFLAGS_BASETYPE | Py_TPFLAGS_HAVE_GC | Py_TPFLAGS_HAVE_VECTORCALL;
  CompiledFunctionType.tp_new = CompiledFunction_new;
  CompiledFunctionType.tp_dealloc = (destructor)CompiledFunction_dealloc;
  CompiledFunctionType.tp_traverse = (traverseproc)CompiledFunction_traverse;
  CompiledFunctionType.tp_clear = (inquiry)CompiledFunction_clear;
  CompiledFunctionType.tp_call = PyVectorcall_Call;
  CompiledFunctionType.tp_vectorcall_offset = offsetof(CompiledFunction, vectorcall);
  CompiledFunctionType.tp_descr_get = CompiledFunction_descr_get;
  CompiledFunctionType.tp_dictoffset = offsetof(CompiledFunction, dict);
  CompiledFunctionType.tp_members = CompiledFunction_members;
  CompiledFunctionType.tp_getset = CompiledFunction_getset;
  CompiledFunctionType.tp_doc = "CompiledFunction(fn, callback): calls fn with the frame hook on";
  if (PyType_Ready(&CompiledFunctionType) < 0) return nullptr;

  PyObject* locks = PyImport_ImportModule("ember.ir.locks");
  if (!locks) return nullptr;
  compile_lock = PyObject_GetAttrString(locks, "COMPILE_LOCK");
  Py_DECREF(locks);
  if (!compile_lock) return nullptr;
  s_acquire = PyUnicode_InternFromString("acquire");
  s_release = PyUnicode_InternFromString("release");
  extra_index = _PyEval_RequestCodeExtraIndex(free_code_state);
  if (extra_index < 0) return PyErr_Format(PyExc_RuntimeError, "no code extra index left");
  s_dtype = PyUnicode_InternFromString("dtype");
  s_device = PyUnicode_InternFromString("device");
  s_requires_grad = PyUnicode_InternFromString("requires_grad");
  s_shape = PyUnicode_InternFromString("shape");
  s_stride = PyUnicode_InternFromString("stride");
  s_strides = PyUnicode_InternFromString("strides");
  s_closure = PyUnicode_InternFromString("__closure__");
  s_keys = PyUnicode_InternFromString("keys");
  s_getattribute = PyUnicode_InternFromString("__getattribute__");
  object_getattribute = _PyType_Lookup(&PyBaseObject_Type, s_getattribute);

  PyObject* m = PyModule_Create(&module_def);
  if (!m) return nullptr;
  Py_INCREF(&GuardProgramType);
  PyModule_AddObject(m, "GuardProgram", (PyObject*)&GuardProgramType);
  Py_INCREF(&CompiledFunctionType);
  PyModule_AddObject(m, "CompiledFunction", (PyObject*)&CompiledFunctionType);
  return m;
}
