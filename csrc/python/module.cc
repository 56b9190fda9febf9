// torch_tpu._C: one submodule per layer (csrc/python/bindings.h), each importable by its dotted name
// (`import torch_tpu._C.eager`) so that pickle finds its classes and errors.
#include <c10/util/Exception.h>

#include "python/bindings.h"

namespace py = pybind11;

PYBIND11_MODULE(_C, m) {
  m.doc() = "TorchTPU core, one submodule per layer: runtime, device, eager, graph, distributed (and testing).";
  // A launch that could not allocate raises c10::OutOfMemoryError (runtime.cc): torch.OutOfMemoryError
  // from our own bindings (torch.tpu.synchronize) too, as from ATen's, which torch translates itself.
  py::register_exception_translator([](std::exception_ptr p) {
    try {
      if (p) std::rethrow_exception(p);
    } catch (const c10::OutOfMemoryError& e) {
      // torch.OutOfMemoryError, looked up once (libtorch_python does not export its handle).
      static PyObject* oom = py::object(py::module_::import("torch").attr("OutOfMemoryError")).release().ptr();
      PyErr_SetString(oom, e.what_without_backtrace());
    }
  });
  py::dict modules = py::module_::import("sys").attr("modules");
  auto layer = [&](const char* name, const char* doc) {
    py::module_ sub = m.def_submodule(name, doc);
    modules[py::str(std::string("torch_tpu._C.") + name)] = sub;
    return sub;
  };
  py::module_ runtime = layer("runtime", "The PJRT runtime: client, devices, compile cache, launches, counters.");
  torch_tpu::python::bind_runtime(runtime);
  py::module_ device = layer("device", "The device integration: devices, generators, storages, fallback.");
  torch_tpu::python::bind_device(device);
  py::module_ eager = layer("eager", "The eager layer: op kernels, plans, modes, fused eager.");
  torch_tpu::python::bind_eager(eager);
  torch_tpu::python::bind_custom_autograd(eager);
  py::module_ graph = layer("graph", "Compiled graphs' per-call runner.");
  torch_tpu::python::bind_graph(graph);
  py::module_ distributed = layer("distributed", "The tpu_dist c10d backend.");
  torch_tpu::python::bind_distributed(distributed);
  py::module_ testing = layer("testing", "What only tests call: a hand-written program launched by hand.");
  torch_tpu::python::bind_testing(testing);
}
