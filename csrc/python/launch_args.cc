#include "python/launch_args.h"

#include <ATen/EmptyTensor.h>
#include <pybind11/complex.h>
#include <c10/core/DeviceGuard.h>
#include <torch/csrc/Dtype.h>
#include <torch/csrc/autograd/python_variable.h>

#include <complex>
#include <cstring>

namespace torch_tpu::python {

using runtime::Cell;
using runtime::Runtime;

// Host operands up to this size (step counts, scalars, small index tensors) are copied during the
// transfer call.
constexpr size_t kSmallOperandBytes = 64 << 10;

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
  auto& rt = Runtime::get();
  if (PyLong_Check(h.ptr())) return {cell_by_key(h.cast<uintptr_t>()), nullptr};
  if (THPVariable_Check(h.ptr())) {
    const at::Tensor& t = THPVariable_Unpack(h.ptr());
    if (!t.is_cpu()) return {cell_of(t), nullptr};
    at::Tensor c = t.contiguous();  // a host operand (0-dim CPU tensor, copy_ source, host pack)
    std::vector<int64_t> dims(c.sizes().begin(), c.sizes().end());
    runtime::counters().h2d_transfers++;
    auto type = runtime::to_pjrt_type(c.scalar_type());
    if (c.nbytes() <= kSmallOperandBytes)  // copied inside the call: no completion event to wait for
      return {nullptr, rt.client().small_buffer_from_host(c.data_ptr(), type, dims, device)};
    return {nullptr, rt.client().buffer_from_host(c.data_ptr(), type, dims, device)};
  }
  auto tup = h.cast<py::tuple>();
  auto st = dtype_of(tup[1]);
  alignas(16) unsigned char bytes[16] = {0};
  py::handle v = tup[0];
  switch (st) {
    case c10::ScalarType::Bool: { bool x = v.cast<bool>(); std::memcpy(bytes, &x, 1); break; }
    case c10::ScalarType::Long: { int64_t x = v.cast<int64_t>(); std::memcpy(bytes, &x, 8); break; }
    case c10::ScalarType::Float: { float x = v.cast<float>(); std::memcpy(bytes, &x, 4); break; }
    case c10::ScalarType::Double: { double x = v.cast<double>(); std::memcpy(bytes, &x, 8); break; }
    case c10::ScalarType::UInt64: {
      auto pair = v.cast<std::pair<uint64_t, uint64_t>>();
      std::memcpy(bytes, &pair.first, 8);
      std::memcpy(bytes + 8, &pair.second, 8);
      break;
    }
    case c10::ScalarType::ComplexFloat: {
      auto c = v.cast<std::complex<double>>();
      float x[2] = {static_cast<float>(c.real()), static_cast<float>(c.imag())};
      std::memcpy(bytes, x, 8);
      break;
    }
    case c10::ScalarType::ComplexDouble: {
      auto c = v.cast<std::complex<double>>();
      std::memcpy(bytes, &c, 16);
      break;
    }
    default: TORCH_CHECK(false, "unsupported scalar operand dtype ", st);
  }
  std::vector<int64_t> dims;
  if (st == c10::ScalarType::UInt64) dims.push_back(2);  // an RNG (seed, offset) pair
  return {nullptr, rt.client().small_buffer_from_host(bytes, runtime::to_pjrt_type(st), dims, device)};
}

at::Tensor new_tpu_tensor(const std::vector<int64_t>& shape, c10::ScalarType dtype, int device,
                          const std::vector<int64_t>* strides) {
  c10::DeviceGuard guard(c10::Device(c10::DeviceType::PrivateUse1, device));
  auto* alloc = c10::GetAllocator(c10::DeviceType::PrivateUse1);
  c10::DispatchKeySet keys(c10::DispatchKey::PrivateUse1);
  if (strides) return at::detail::empty_strided_generic(shape, *strides, alloc, keys, dtype);
  return at::detail::empty_generic(shape, alloc, keys, dtype, std::nullopt);
}

at::Tensor new_tpu_tensor_of_spec(py::handle h, int device) {
  auto spec = h.cast<py::tuple>();
  auto shape = spec[0].cast<std::vector<int64_t>>();
  if (spec.size() > 2 && !spec[2].is_none()) {
    auto strides = spec[2].cast<std::vector<int64_t>>();
    return new_tpu_tensor(shape, dtype_of(spec[1]), device, &strides);
  }
  return new_tpu_tensor(shape, dtype_of(spec[1]), device);
}

}  // namespace torch_tpu::python
