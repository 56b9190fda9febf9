// The tpu kernel of every lowered ATen overload, registered with the dispatcher in C++: strict
// eager's hot path (key, plan cache hit, launch) runs without Python; everything else (a cache miss:
// meta, lowering, compile; debug and fused eager; per-call checks; the CPU fallback) calls the
// overload's Python kernel (torch_tpu/eager/kernel.py).
#pragma once

#include <torch/csrc/utils/pybind.h>
#include <ATen/core/stack.h>

#include <cstdint>

namespace torch_tpu::python {

void bind_op_kernels(pybind11::module& m);

// Runs the kernel registered as `id` (_register_op_kernel) on `stack` (its arguments, schema order),
// as the Python kernel's own entry does (no prepare step).
void run_op_kernel(int64_t id, torch::jit::Stack* stack);

// The tpu kernels of copy_, _copy_from, _copy_from_and_resize and _local_scalar_dense (copies.cc):
// host <-> tpu transfers, with the lowered device-side copy `copy_kernel` (an op kernel id).
void register_copy_ops(int64_t copy_kernel);
// The error raised for complex32 on the tpu device (PJRT has no complex type with float16 parts).
extern const char* const kComplex32Error;

}  // namespace torch_tpu::python
