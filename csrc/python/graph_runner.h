// torch_tpu._C.GraphRunner: the per-call work of a compiled graph (torch.compile(backend="tpu")),
// in C++ because it runs on every step and the host thread competes with the device's.
#pragma once

#include <torch/csrc/utils/pybind.h>

namespace torch_tpu::python {

void bind_graph_runner(pybind11::module_& m);

}  // namespace torch_tpu::python
