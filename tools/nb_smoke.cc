// A minimal nanobind extension, built by Bazel against @local_python//:nanobind.
#include <nanobind/nanobind.h>

NB_MODULE(nb_smoke, m) {
  m.def("add", [](int a, int b) { return a + b; });
}
