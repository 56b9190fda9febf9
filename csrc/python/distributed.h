// Registers the tpu_dist backend's Python type on torch_tpu._C.
#pragma once

#include <torch/csrc/utils/pybind.h>

namespace torch_tpu::python {
void init_distributed(pybind11::module& m);
}
