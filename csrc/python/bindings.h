// The binding layer: torch_tpu._C is one submodule per layer, each bound by one function here.
// Names inside a submodule carry no underscore: `_C` itself is the private part.
#pragma once

#include <torch/csrc/utils/pybind.h>

namespace torch_tpu::python {

namespace py = pybind11;

void bind_runtime(py::module_& m);          // _C.runtime: client, devices, compile cache, launches (runtime.cc)
void bind_host_caches(py::module_& m);      //   its in-memory caches' policy and counters (host_caches.cc)
void bind_compile_targets(py::module_& m);  //   compile-only targets and the cache's store (targets.cc)
void bind_device(py::module_& m);           // _C.device: the device integration (device.cc)
void bind_eager(py::module_& m);            // _C.eager: the eager layer's entry and its front end (eager.cc)
void bind_custom_autograd(py::module_& m);  //   custom kernels' autograd kernels (custom_autograd.cc)
void bind_graph(py::module_& m);            // _C.graph: compiled graphs' per-call runner (graph.cc)
void bind_distributed(py::module_& m);      // _C.distributed: the tpu_dist backend (distributed.cc)
void bind_testing(py::module_& m);          // _C.testing: what only tests call (runtime.cc)

// Waits (without the GIL) until the compile pool has nothing in flight, then raises its compiles'
// warnings as Python warnings: counters and cache statistics are read after it (runtime.cc).
void settle_compiles();

}  // namespace torch_tpu::python
