// Python binding of the tpu_dist backend: torch_tpu._C._TpuBackend, a subclass of c10d's Backend
// type (so torch.distributed accepts it from the creator that torch_tpu.distributed registers).
#include <pybind11/chrono.h>
#include <torch/csrc/distributed/c10d/Backend.hpp>
#include <torch/csrc/utils/pybind.h>

#include "distributed/backend.h"
#include "python/distributed.h"

namespace py = pybind11;

namespace torch_tpu::python {

void init_distributed(py::module& m) {
  // torch registers c10d::Backend's Python type when torch.distributed's C module loads.
  py::module::import("torch._C._distributed_c10d");
  py::class_<distributed::TpuBackend, c10d::Backend, c10::intrusive_ptr<distributed::TpuBackend>>(
      m, "_TpuBackend",
      "tpu_dist's c10d Backend; built by torch_tpu.distributed's backend creator, not by hand.")
      .def(py::init([](const c10::intrusive_ptr<c10d::Backend>& host, int rank, int size,
                       std::chrono::milliseconds timeout) {
             return c10::make_intrusive<distributed::TpuBackend>(host, rank, size, timeout);
           }),
           py::arg("host"), py::arg("rank"), py::arg("size"), py::arg("timeout"))
      // new_group() calls this on the ranks left out of a group split from a device-bound default
      // group (NCCL needs every rank in ncclCommSplit). A split host group is made by its members
      // alone, so the others have nothing to do.
      // split_group() copies the parent's options into the split: the host backend's.
      .def_property_readonly("options", &distributed::TpuBackend::getBackendOptions)
      .def("perform_nocolor_split", [](distributed::TpuBackend&, const at::Device&) {});
}

}  // namespace torch_tpu::python
