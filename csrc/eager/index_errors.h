// Index errors found on the device (lowerings with `bounds`, torch_tpu/lowering/registry.py): the
// program computes whether an index is out of range beside its result, writes nothing then, and
// records (error id, first bad index, the size it was checked against) in its device's status
// tensor, unless an earlier error is already there. The host reads the status at its next synchronisation (a download, .item(),
// synchronize) and raises CPU's error there, naming the op: CUDA's device-side asserts, without
// poisoning the device. Debug eager waits after each op, so it raises at the op.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <string>

namespace torch_tpu::eager {

// The id (>= 1) of the error `message` ({value}: the bad index; {size}: the size it was checked
// against, a run-time value in a bucketed graph) of op `op`; IndexError when
// `index_error`, else RuntimeError. A hash of the triple: the same in every process, so programs
// that bake it in have the same text (and disk-cached executable) everywhere.
int64_t register_index_error(const std::string& op, bool index_error, const std::string& message);
// The status tensor of `device` (int64[3], zeros until an error), made on first use.
at::Tensor index_status(int device);
// Raises the first index error recorded on `device` (-1: every device) since the last call, and
// clears it. Reads the status only when a program wrote it since.
void raise_index_errors(int device);

}  // namespace torch_tpu::eager
