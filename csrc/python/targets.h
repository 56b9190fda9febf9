// Registers compile-only targets (pjrt::Topology) and the cache's store on torch_tpu._C.
#pragma once

#include <torch/csrc/utils/pybind.h>

namespace torch_tpu::python {
void bind_compile_targets(pybind11::module& m);
}
