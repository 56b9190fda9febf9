#include "python/launch_args.h"

#include "aten/launch_values.h"

#include <pybind11/complex.h>
#include <torch/csrc/Dtype.h>
#include <torch/csrc/autograd/python_variable.h>

#include <complex>
#include <cstring>

namespace torch_tpu::python {

using runtime::Cell;
using runtime::Runtime;

Cell* cell_by_key(uintptr_t key) {
  Cell* c = Runtime::get().cell_at(reinterpret_cast<void*>(key));
  TORCH_CHECK(c && c->addr == key, "no live tpu storage has key ", key);
  return c;
}

c10::ScalarType dtype_of(py::handle dtype) {
  TORCH_CHECK(THPDtype_Check(dtype.ptr()), "expected a torch.dtype");
  return reinterpret_cast<THPDtype*>(dtype.ptr())->scalar_type;
}

runtime::LaunchArg launch_arg(py::handle h, int device) {
  if (PyLong_Check(h.ptr())) return {cell_by_key(h.cast<uintptr_t>()), nullptr};
  if (THPVariable_Check(h.ptr())) {
    const at::Tensor& t = THPVariable_Unpack(h.ptr());
    if (!t.is_cpu()) return {cell_of(t), nullptr};
    return aten::host_tensor_arg(t, device);  // a host operand (0-dim CPU tensor, copy_ source, host pack)
  }
  auto tup = h.cast<py::tuple>();
  auto st = dtype_of(tup[1]);
  py::handle v = tup[0];
  switch (st) {
    case c10::ScalarType::UInt64: return aten::rng_arg(v.cast<std::pair<uint64_t, uint64_t>>());
    case c10::ScalarType::Bool: return aten::scalar_arg(v.cast<bool>(), st, device);
    case c10::ScalarType::Long: return aten::scalar_arg(v.cast<int64_t>(), st, device);
    case c10::ScalarType::ComplexFloat:
    case c10::ScalarType::ComplexDouble:
      return aten::scalar_arg(c10::complex<double>(v.cast<std::complex<double>>()), st, device);
    default: return aten::scalar_arg(v.cast<double>(), st, device);
  }
}

}  // namespace torch_tpu::python
