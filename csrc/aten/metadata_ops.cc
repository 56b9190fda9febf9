// Kernels for the tpu ops that only touch tensor metadata or storage: allocation, views (complex
// <-> real ones included), set_, resize_. They run no program. Every computing op is lowered to
// StableHLO (torch_tpu/lowering).
#include <ATen/EmptyTensor.h>
#include <ATen/Context.h>
#include <ATen/native/Resize.h>
#include <ATen/native/ResizeCommon.h>
#include <ATen/native/TensorFactories.h>
#include <ATen/ops/as_strided_native.h>
#include <ATen/ops/view_native.h>
#include <ATen/ops/_reshape_alias_native.h>
#include <ATen/ops/unfold_native.h>
#include <ATen/ops/set_native.h>
#include <ATen/ops/alias_native.h>
#include <ATen/ops/is_set_to_native.h>
#include <ATen/ops/view_as_real_native.h>
#include <ATen/ops/view_as_complex_native.h>
#include <ATen/ops/zeros.h>
#include <ATen/detail/PrivateUse1HooksInterface.h>
#include <c10/core/DeviceGuard.h>
#include <torch/library.h>

#include "aten/device.h"

namespace torch_tpu::aten {
namespace {

constexpr c10::DispatchKeySet kTpuKeys(c10::DispatchKey::PrivateUse1);

c10::Device target_device(std::optional<c10::Device> device) {
  c10::DeviceIndex idx = device && device->has_index() ? device->index() : current_device();
  check_device_index(idx);
  return c10::Device(c10::DeviceType::PrivateUse1, own_device(idx));
}

// torch.use_deterministic_algorithms(True) with torch.utils.deterministic.fill_uninitialized_memory
// (its default): new memory holds NaN (or the integer maximum) instead of whatever was there, as
// on CPU and CUDA (PyTorch's own fill helpers, which run tpu's fill_).
bool fill_uninitialized() {
  const auto& ctx = at::globalContext();
  return ctx.deterministicAlgorithms() && ctx.deterministicFillUninitializedMemory();
}

at::Tensor empty_memory_format(c10::IntArrayRef size, std::optional<c10::ScalarType> dtype,
                               std::optional<c10::Layout> layout, std::optional<c10::Device> device,
                               std::optional<bool> pin_memory,
                               std::optional<c10::MemoryFormat> memory_format) {
  c10::DeviceGuard guard(target_device(device));
  at::Tensor t = at::detail::empty_generic(size, c10::GetAllocator(c10::DeviceType::PrivateUse1), kTpuKeys,
                                           c10::dtype_or_default(dtype), memory_format);
  hint_layout(t);
  if (fill_uninitialized()) at::native::fill_empty_deterministic_(t);
  return t;
}

at::Tensor empty_strided(c10::IntArrayRef size, c10::IntArrayRef stride,
                         std::optional<c10::ScalarType> dtype, std::optional<c10::Layout> layout,
                         std::optional<c10::Device> device, std::optional<bool> pin_memory) {
  c10::DeviceGuard guard(target_device(device));
  at::Tensor t = at::detail::empty_strided_generic(size, stride, c10::GetAllocator(c10::DeviceType::PrivateUse1),
                                                   kTpuKeys, c10::dtype_or_default(dtype));
  hint_layout(t);
  if (fill_uninitialized()) at::native::fill_empty_deterministic_(t);
  return t;
}

// Grows the storage through the hooks (a new cell holding the old bytes) when the new shape needs
// more bytes; never shrinks it, as on CPU.
const at::Tensor& resize_(const at::Tensor& self, c10::IntArrayRef size,
                          std::optional<c10::MemoryFormat> memory_format) {
  auto* impl = self.unsafeGetTensorImpl();
  if (impl->sizes() != size) impl->set_sizes_contiguous(size);
  if (memory_format && *memory_format != c10::MemoryFormat::Preserve) {
    impl->empty_tensor_restride(*memory_format);
  }
  int64_t numel = impl->numel();
  if (numel > 0) {
    size_t needed = at::detail::computeStorageNbytes(impl->sizes(), impl->strides(), impl->itemsize(),
                                                     impl->storage_offset());
    const c10::Storage& st = impl->unsafe_storage();
    const size_t old_nbytes = st.nbytes();
    if (needed > old_nbytes) {
      at::detail::getPrivateUse1Hooks().resizePrivateUse1Bytes(st, needed);
      if (fill_uninitialized()) at::native::fill_resize_deterministic_(self, static_cast<int64_t>(old_nbytes));
    }
  }
  return self;
}

at::Tensor& set_empty(at::Tensor& self) {
  c10::Storage st(c10::Storage::use_byte_size_t(), 0, c10::GetAllocator(c10::DeviceType::PrivateUse1),
                  /*resizable=*/true);
  return at::native::set_storage_cpu_(self, st, 0, {0}, {});
}

// The zero gradient that autograd formulas ask for (e.g. sgn's of a real input). PyTorch's own kernel
// is CPU/CUDA-only; here it is an ordinary tensor of zeros on the tpu device (one fill program),
// which every op accepts, instead of a ZeroTensor without storage.
at::Tensor efficientzerotensor(c10::IntArrayRef size, std::optional<c10::ScalarType> dtype,
                               std::optional<c10::Layout> layout, std::optional<c10::Device> device,
                               std::optional<bool> pin_memory) {
  return at::zeros(size, at::TensorOptions().dtype(c10::dtype_or_default(dtype)).device(target_device(device)));
}

// Whether `self`'s TensorImpl may take `from`'s storage and metadata in place (Module.to() keeps a
// Parameter object, and `param.data = t` works, only when this is true). c10 answers true for two
// dense tensors of its built-in backends and false for PrivateUse1, leaving it to the backend
// (c10/core/TensorImpl.h): a dense tpu tensor is interchangeable with any dense tensor of those
// backends, exactly as a CUDA tensor is with a CPU one.
bool has_compatible_shallow_copy_type(const at::Tensor& self, const at::Tensor& from) {
  auto dense = [](c10::DispatchKeySet ks) {
    constexpr auto backends = c10::DispatchKeySet(
        {c10::BackendComponent::CPUBit, c10::BackendComponent::CUDABit, c10::BackendComponent::MPSBit,
         c10::BackendComponent::HIPBit, c10::BackendComponent::XPUBit, c10::BackendComponent::HPUBit,
         c10::BackendComponent::MTIABit, c10::BackendComponent::PrivateUse1Bit});
    return ks.has_any(c10::DispatchKeySet(c10::DispatchKey::Dense)) && ks.has_any(backends);
  };
  return (dense(self.key_set()) && dense(from.key_set())) ||
         self.unsafeGetTensorImpl()->has_compatible_shallow_copy_type(from.key_set());
}

// Copy-on-write (c10::impl::cow) needs a DataPtr that is its own context; a tpu storage's context
// is its cell, so PyTorch's _lazy_clone failed with an internal "Expected storage != nullptr". A lazy
// clone is a clone: the same values, copied now instead of at the first write.
at::Tensor lazy_clone(const at::Tensor& self) { return self.clone(); }

TORCH_LIBRARY_IMPL(aten, PrivateUse1, m) {
  m.impl("_lazy_clone", lazy_clone);
  m.impl("_has_compatible_shallow_copy_type", has_compatible_shallow_copy_type);
  m.impl("empty.memory_format", empty_memory_format);
  m.impl("empty_strided", empty_strided);
  m.impl("as_strided", at::native::as_strided_tensorimpl);
  m.impl("view", at::native::view);
  m.impl("_reshape_alias", at::native::_reshape_alias);
  m.impl("unfold", at::native::unfold);
  m.impl("alias", at::native::alias);
  // Complex <-> real views share the storage (strides and offset doubled or halved), as on CPU;
  // the kernels read a storage as any dtype, so no copy is needed.
  m.impl("view_as_real", at::native::view_as_real);
  m.impl("view_as_complex", at::native::view_as_complex);
  m.impl("_efficientzerotensor", efficientzerotensor);
  m.impl("resize_", resize_);
  m.impl("is_set_to", at::native::is_set_to);
  m.impl("set_", set_empty);
  m.impl("set_.source_Storage", at::native::set_);
  m.impl("set_.source_Storage_storage_offset", at::native::set_storage_cpu_);
  m.impl("set_.source_Tensor", at::native::set_tensor_);
}

}  // namespace
}  // namespace torch_tpu::aten
