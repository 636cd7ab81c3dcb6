// ember.cpp_wrapper._C: the runtime's C ABI for Python, with tensors as DLPack capsules.
//
// Inputs arrive as "dltensor" capsules (torch.utils.dlpack.to_dlpack) and are borrowed for the
// call; outputs leave as fresh "dltensor" capsules that torch.utils.dlpack.from_dlpack adopts
// without a copy. The GIL is released while a model runs, so Python threads run it in parallel.
#include <nanobind/nanobind.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include <string>
#include <vector>

#include "ember_runtime.h"

namespace nb = nanobind;

namespace {

[[noreturn]] void raise_status(EmberStatus status) {
  std::string message = ember_last_error();
  nb::object cls = nb::module_::import_("ember.cpp_wrapper.errors").attr("EmberRuntimeError");
  nb::object err = cls(int(status), ember_status_name(status), message);
  PyErr_SetObject(cls.ptr(), err.ptr());
  throw nb::python_error();
}

DLManagedTensor* borrow_capsule(nb::handle capsule, const char* what) {
  if (!PyCapsule_IsValid(capsule.ptr(), "dltensor")) {
    throw nb::type_error((std::string(what) + " must be an unconsumed DLPack capsule").c_str());
  }
  return static_cast<DLManagedTensor*>(PyCapsule_GetPointer(capsule.ptr(), "dltensor"));
}

void capsule_destructor(PyObject* capsule) {
  // Consumers rename an adopted capsule to "used_dltensor"; only an unadopted one is ours to free.
  if (PyCapsule_IsValid(capsule, "dltensor")) {
    auto* t = static_cast<DLManagedTensor*>(PyCapsule_GetPointer(capsule, "dltensor"));
    if (t && t->deleter) t->deleter(t);
  }
}

nb::object to_capsule(DLManagedTensor* t) {
  PyObject* cap = PyCapsule_New(t, "dltensor", capsule_destructor);
  if (!cap) {
    t->deleter(t);
    throw nb::python_error();
  }
  return nb::steal(cap);
}

nb::dict describe(const EmberTensorInfo& info) {
  nb::list shape, dims;
  for (int d = 0; d < info.ndim; ++d) {
    nb::object size = nb::none(), name = nb::none();  // None: a dynamic size / a static one
    if (info.shape[d] >= 0) size = nb::int_(info.shape[d]);
    if (info.dim_names[d]) name = nb::str(info.dim_names[d]);
    shape.append(size);
    dims.append(name);
  }
  nb::dict out;
  out["name"] = info.name;
  out["dtype"] = nb::make_tuple(int(info.dtype.code), int(info.dtype.bits), int(info.dtype.lanes));
  out["shape"] = shape;
  out["dim_names"] = dims;
  return out;
}

class Model {
 public:
  Model(EmberModel* m, std::vector<nb::object> keep) : m_(m), keep_(std::move(keep)) {}
  ~Model() { ember_model_free(m_); }

  std::vector<nb::object> run(const std::vector<nb::handle>& inputs, uintptr_t stream) {
    std::vector<DLManagedTensor*> in;
    in.reserve(inputs.size());
    for (size_t i = 0; i < inputs.size(); ++i) in.push_back(borrow_capsule(inputs[i], "an input"));
    std::vector<DLManagedTensor*> out(ember_model_num_outputs(m_), nullptr);
    EmberStatus st;
    {
      nb::gil_scoped_release release;
      st = ember_model_run(m_, in.data(), in.size(), out.data(), out.size(),
                           reinterpret_cast<void*>(stream));
    }
    if (st != EMBER_OK) raise_status(st);
    std::vector<nb::object> result;
    for (DLManagedTensor* t : out) result.push_back(to_capsule(t));
    return result;
  }

  // ember_generate: `prompt` is a list of equal-length rows of token ids; returns the new
  // tokens, batch x max_new_tokens, flat and row-major.
  std::vector<int64_t> generate(const std::vector<std::vector<int64_t>>& prompt, size_t n_new,
                                int top_k, float temperature, uint64_t seed) {
    size_t batch = prompt.size(), len = batch ? prompt[0].size() : 0;
    std::vector<int64_t> flat;
    for (const auto& row : prompt) {
      if (row.size() != len) throw nb::value_error("the prompt's rows differ in length");
      flat.insert(flat.end(), row.begin(), row.end());
    }
    EmberGenerateOptions o;
    ember_generate_options_init(&o);
    o.top_k = top_k, o.temperature = temperature, o.seed = seed;
    std::vector<int64_t> out(batch * n_new);
    EmberStatus st;
    {
      nb::gil_scoped_release release;
      st = ember_generate(m_, flat.data(), batch, len, n_new, &o, out.data());
    }
    if (st != EMBER_OK) raise_status(st);
    return out;
  }

  uint64_t run_count() const { return ember_model_run_count(m_); }

  nb::dict info() const {
    nb::list ins, outs;
    EmberTensorInfo info;
    for (size_t i = 0; i < ember_model_num_inputs(m_); ++i) {
      ember_model_input_info(m_, i, &info);
      ins.append(describe(info));
    }
    for (size_t i = 0; i < ember_model_num_outputs(m_); ++i) {
      ember_model_output_info(m_, i, &info);
      outs.append(describe(info));
    }
    DLDevice dev = ember_model_device(m_);
    nb::dict d;
    d["inputs"] = ins;
    d["outputs"] = outs;
    d["device"] = nb::make_tuple(int(dev.device_type), dev.device_id);
    return d;
  }

 private:
  EmberModel* m_;
  std::vector<nb::object> keep_;  // capsules whose tensors back the constants
};

EmberLoadOptions make_options(int device_id, const std::string& cublas_path) {
  EmberLoadOptions o;
  ember_load_options_init(&o);
  o.device_id = device_id;
  o.cublas_path = cublas_path.empty() ? nullptr : cublas_path.c_str();
  return o;
}

Model* load_library(const std::string& path, const std::vector<std::string>& names,
                    const std::vector<nb::object>& constants, int device_id,
                    const std::string& cublas_path) {
  if (names.size() != constants.size()) throw nb::value_error("one name per constant");
  std::vector<const char*> cnames;
  std::vector<const DLTensor*> tensors;
  for (size_t i = 0; i < names.size(); ++i) {
    cnames.push_back(names[i].c_str());
    tensors.push_back(&borrow_capsule(constants[i], "a constant")->dl_tensor);
  }
  EmberLoadOptions o = make_options(device_id, cublas_path);
  EmberModel* m = nullptr;
  EmberStatus st = ember_model_load_library(path.c_str(), cnames.data(), tensors.data(),
                                            tensors.size(), &o, &m);
  if (st != EMBER_OK) raise_status(st);
  return new Model(m, constants);
}

Model* load_package(const std::string& path, int device_id, const std::string& cublas_path) {
  EmberLoadOptions o = make_options(device_id, cublas_path);
  EmberModel* m = nullptr;
  EmberStatus st;
  {
    nb::gil_scoped_release release;  // checksumming a large package takes a while
    st = ember_package_load(path.c_str(), &o, &m);
  }
  if (st != EMBER_OK) raise_status(st);
  return new Model(m, {});
}

}  // namespace

NB_MODULE(_C, m) {
  m.doc() = "The Ember C++ runtime (ember_runtime.h) for Python.";
  m.attr("ABI_VERSION") = EMBER_ABI_VERSION;
  m.def("abi_version", &ember_abi_version, "The ABI version of the runtime library.");
  nb::class_<Model>(m, "Model")
      .def("run", &Model::run, nb::arg("inputs"), nb::arg("stream") = 0,
           "Run on DLPack capsules; returns output capsules.")
      .def("info", &Model::info, "Names, dtypes and shapes of inputs and outputs.")
      .def("run_count", &Model::run_count, "Runs since loading (ember_model_run_count).")
      .def("generate", &Model::generate, nb::arg("prompt"), nb::arg("max_new_tokens"),
           nb::arg("top_k") = 1, nb::arg("temperature") = 1.0f, nb::arg("seed") = 0,
           "ember_generate on a decode-step package: the new tokens, flat and row-major.");
  m.def("load_library", &load_library, nb::arg("path"), nb::arg("constant_names"),
        nb::arg("constants"), nb::arg("device_id") = 0, nb::arg("cublas_path") = "",
        nb::rv_policy::take_ownership, "Load a model library with caller-owned constants.");
  m.def("load_package", &load_package, nb::arg("path"), nb::arg("device_id") = 0,
        nb::arg("cublas_path") = "", nb::rv_policy::take_ownership, "Load an AOT package.");
}
