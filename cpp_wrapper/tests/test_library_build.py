"""Model libraries built unit by unit (library_build.py): cached objects, one unit per distinct
kernel, the precompiled prelude, cubins as data units; counted by compiler runs, not timed."""

import ctypes
import dataclasses

import cppw_artifacts as A
import pytest
import torch
from ember.ir import BufferIR, KernelIR, new_artifact, toolchain

import ember.cpp_wrapper._C  # noqa: F401  (the extension, built before the cache moves)
from ember.cpp_wrapper import build_model_library, library_build, load_artifact
from ember.cpp_wrapper.library_build import Unit, counters, data_unit, prelude_of

# A header every kernel inlines (as ember.inductor's kernels inline ember_cpu.h), long enough
# for a precompiled header.
PRELUDE = (
    "#ifndef TEST_PRELUDE_H\n#define TEST_PRELUDE_H\n#include <cstdint>\n#include <cmath>\n"
    + "".join(f"// filler line {i} of a header long enough to be worth precompiling\n"
              for i in range(40))  # fmt: skip
    + "inline float scaled(float v, float s) { return v * s; }\n#endif  // TEST_PRELUDE_H\n\n"
)


def kernel_source(entry: str, body: str) -> str:
    return PRELUDE + (
        f"EMBER_EXPORT void {entry}(void** args) {{\n"
        "  const float* x = static_cast<const float*>(args[0]);\n"
        "  float* out = static_cast<float*>(args[1]);\n"
        f"  for (int64_t i = 0; i < 16; ++i) out[i] = {body};\n}}\n"
    )


def chain(last_body="x[i] + 1.0f"):
    """out = (x * 2 * 2) + 1 through three kernels; the first two differ only in their names."""
    kernels = (
        KernelIR("ka", "cpp", kernel_source("twice_a", "scaled(x[i], 2.0f)"), "twice_a",
                 ("*fp32", "*fp32")),
        KernelIR("kb", "cpp", kernel_source("twice_b", "scaled(x[i], 2.0f)"), "twice_b",
                 ("*fp32", "*fp32")),
        KernelIR("kc", "cpp", kernel_source("last", last_body), "last", ("*fp32", "*fp32")),
    )  # fmt: skip
    return new_artifact(
        device="cpu", symbols=(), guards=(),
        buffers=(BufferIR("x", "input", A.meta((16,))), BufferIR("t0", "intermediate",
                 A.meta((16,))), BufferIR("t1", "intermediate", A.meta((16,))),
                 BufferIR("out", "output", A.meta((16,)))),
        kernels=kernels,
        steps=(A.alloc("t0"), A.kernel("ka", "x", "t0"), A.alloc("t1"), A.kernel("kb", "t0", "t1"),
               A.alloc("out"), A.kernel("kc", "t1", "out")),
        inputs=("x",), outputs=("out",),
    )  # fmt: skip


@pytest.fixture
def fresh_cache(tmp_path, monkeypatch):
    monkeypatch.setattr(toolchain.config, "cache_dir", tmp_path / "cache")
    monkeypatch.setattr(library_build, "MIN_PCH_UNITS", 2)  # the chain has two kernel units
    monkeypatch.setattr(library_build, "KERNELS_PER_UNIT", 1)  # each its own (see grouping)
    counters.reset()
    return tmp_path


def test_prelude_is_cut_outside_conditionals():
    a, b = PRELUDE + "int a;\n", PRELUDE + "int b;\n"
    assert prelude_of([a, b]) == PRELUDE
    # the shared text ends inside an #if: the prelude stops before that #if opened
    inner = PRELUDE + "#if 1\nint x;\n"
    assert prelude_of([inner + "int a;\n#endif\n", inner + "int b;\n#endif\n"]) == PRELUDE
    assert prelude_of([a]) == ""  # nothing to share
    assert prelude_of(["#include <cmath>\nint a;\n", "#include <cmath>\nint b;\n"]) == ""  # short


def test_a_second_build_compiles_nothing_and_equal_kernels_compile_once(fresh_cache):
    first = build_model_library(chain(), standalone=True)
    # the wrapper and two distinct kernels (ka and kb are one source under a content name)
    assert (counters.compiled, counters.linked, counters.precompiled_headers) == (3, 1, 1)
    counters.reset()
    again = build_model_library(chain(), standalone=True)
    assert again == first
    assert (counters.compiled, counters.linked, counters.precompiled_headers) == (0, 0, 0)
    assert counters.cached == 3
    x = torch.randn(16)
    torch.testing.assert_close(load_artifact(chain())(x)[0], x * 4 + 1)


def test_a_changed_kernel_recompiles_only_itself_and_the_wrapper(fresh_cache):
    build_model_library(chain(), standalone=True)
    counters.reset()
    changed = chain("x[i] - 3.0f")
    build_model_library(changed, standalone=True)
    # the unchanged kernel is cached; the wrapper names the artifact's hash, which changed
    assert (counters.compiled, counters.cached, counters.linked) == (2, 1, 1)
    x = torch.randn(16)
    torch.testing.assert_close(load_artifact(changed)(x)[0], x * 4 - 3)


def test_kernels_of_one_entry_name_and_different_sources_each_get_their_own(fresh_cache):
    art = chain()
    ka, kb, kc = art.kernels
    # kc defines "twice_a" too (as if two generated programs were joined): named by content,
    # each kernel keeps its own definition
    kc = KernelIR("kc", "cpp", kernel_source("twice_a", "x[i] + 1.0f"), "twice_a", kc.arg_types)
    art = dataclasses.replace(art, kernels=(ka, kb, kc))
    x = torch.randn(16)
    torch.testing.assert_close(load_artifact(art)(x)[0], x * 4 + 1)


def test_kernels_are_grouped_by_content():
    units = [Unit(f"k{i}", f"int k{i}() {{ return {i}; }}\n") for i in range(60)]
    groups = library_build.group_kernels(units)
    assert sorted(u.name for g in groups for u in g) == sorted(u.name for u in units)
    assert max(map(len, groups)) <= 2 * library_build.KERNELS_PER_UNIT and len(groups) >= 4
    assert library_build.group_kernels(list(reversed(units))) == groups  # order does not matter
    # one more kernel (a model sharing the others) changes its own group only
    more = library_build.group_kernels([*units, Unit("new", "int fresh() { return -1; }\n")])
    changed = [g for g in more if g not in groups]
    assert len(changed) <= 2 and any(u.name == "new" for g in changed for u in g)
    assert 1 <= sum(g not in more for g in groups) <= 2


def test_grouped_kernels_build_and_run(fresh_cache, monkeypatch):
    monkeypatch.setattr(library_build, "group_kernels", lambda units: [list(units)])
    build_model_library(chain(), standalone=True)
    assert counters.compiled == 2  # the wrapper, and both kernels in one unit
    x = torch.randn(16)
    torch.testing.assert_close(load_artifact(chain())(x)[0], x * 4 + 1)


def test_cubin_bytes_survive_their_data_unit(fresh_cache):
    data = bytes(range(256)) * 3 + b'??"\\\n\x00017'  # every byte; escapes next to digits
    reader = Unit("reader", 'extern "C" const unsigned char blob[];\n'
                  'extern "C" __attribute__((visibility("default"))) const unsigned char* '
                  "get() { return blob; }\n", kernel=False)  # fmt: skip
    flags = library_build.compile_flags(isa="generic", include_dirs=(), defines=(), openmp=False)
    lib = ctypes.CDLL(str(library_build.build_library("blob", [data_unit("blob", data), reader],
                                                      flags)))  # fmt: skip
    lib.get.restype = ctypes.c_void_p
    assert ctypes.string_at(lib.get(), len(data)) == data


def test_a_group_that_does_not_compile_as_one_unit_builds_kernel_by_kernel(fresh_cache,
                                                                          monkeypatch):
    monkeypatch.setattr(library_build, "group_kernels", lambda units: [list(units)])
    flags = library_build.compile_flags(isa="generic", include_dirs=(), defines=(), openmp=False)
    units = [Unit(name, f"static int helper() {{ return {v}; }}\n"
                        f'extern "C" __attribute__((visibility("default"))) int {name}() '
                        "{ return helper(); }\n") for name, v in (("fa", 1), ("fb", 2))]
    lib = ctypes.CDLL(str(library_build.build_library("pair", units, flags)))
    assert (lib.fa(), lib.fb()) == (1, 2)  # each kernel its own helper
    assert counters.compiled == 2


def test_every_failing_unit_is_named(fresh_cache, monkeypatch):
    monkeypatch.setattr(library_build, "group_kernels", lambda units: [list(units)])
    flags = library_build.compile_flags(isa="generic", include_dirs=(), defines=(), openmp=False)
    units = [Unit("good one", "int good() { return 1; }\n"),
             Unit("bad one", "int bad() { return undeclared; }\n"),
             Unit("worse one", "int worse( {\n")]  # fmt: skip
    with pytest.raises(toolchain.BuildError) as e:
        library_build.build_library("broken", units, flags)
    message = str(e.value)
    assert "2 of 3 translation units of broken failed" in message
    assert "bad one" in message and "undeclared" in message and "worse one" in message
    assert "good one" not in message
