// The autograd kernel (AutogradPrivateUse1) of a custom kernel's operator (torch_tpu/pallas/ops.py).
// A call that needs no gradient (grad mode off, or no input requiring grad) goes straight to the tpu
// kernel below autograd, in C++; only a call that does calls back into Python, whose
// torch.autograd.Function records the backward. torch.library's own autograd kernel is Python on
// every call, which costs a small op several times its launch.
#pragma once

#include <torch/csrc/utils/pybind.h>

namespace torch_tpu::python {

void bind_custom_autograd(pybind11::module& m);

}  // namespace torch_tpu::python
