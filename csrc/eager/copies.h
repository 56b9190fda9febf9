// The tpu kernels of copy_, _copy_from, _copy_from_and_resize and _local_scalar_dense (copies.cc):
// host <-> tpu transfers, and tpu -> tpu copies through the lowered `copy_` program.
#pragma once

#include <cstdint>

namespace torch_tpu::eager {

// Registers them with the dispatcher; `copy_kernel` is the op kernel (register_op_kernel's id) of
// the device-side copy.
void register_copy_ops(int64_t copy_kernel);
// The error raised for complex32 on the tpu device (PJRT has no complex type with float16 parts).
extern const char* const kComplex32Error;

}  // namespace torch_tpu::eager
