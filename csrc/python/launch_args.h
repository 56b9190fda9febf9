// Launch operands from Python for _C.runtime.launch and launch_replicas (the runtime tests' and the
// device collectives' launches): the storage cell of a tpu tensor, host operands uploaded as buffers
// of their own, and scalar operands.
#pragma once

#include <torch/csrc/utils/pybind.h>
#include <ATen/Tensor.h>

#include <cstdint>
#include <vector>

#include "aten/device.h"
#include "eager/plan.h"
#include "runtime/runtime.h"

namespace torch_tpu::python {

namespace py = pybind11;

using aten::cell_of;
// The live cell whose fake device address is `key` (_C.device.storage_key). Raises if none is.
runtime::Cell* cell_by_key(uintptr_t key);
// One launch operand from Python: an int (a storage key), a tpu tensor (its storage), a CPU tensor
// (uploaded to `device`, row-major), or a (number, torch.dtype) pair (a 0-dim scalar; uint64 takes a
// (seed, offset) pair and is 1-D of 2). Raises for an unsupported scalar dtype.
runtime::LaunchArg launch_arg(py::handle h, int device);
// The scalar type of a torch.dtype object.
c10::ScalarType dtype_of(py::handle dtype);

}  // namespace torch_tpu::python
