// The tpu kernel of every lowered ATen overload, registered with the dispatcher in C++: strict
// eager's hot path (key, plan cache hit, launch) runs without Python; everything else (a cache miss:
// meta, lowering, compile; debug and fused eager; per-call checks; the CPU fallback) calls the
// overload's Python kernel (torch_tpu/aten/kernel.py).
#pragma once

#include <torch/csrc/utils/pybind.h>

namespace torch_tpu::python {

void bind_op_kernels(pybind11::module& m);

}  // namespace torch_tpu::python
