// The tpu allocator: a storage is a runtime::Cell (its PJRT buffer is created lazily) at a unique
// fake device address. Registered as the PrivateUse1 allocator, so every tpu storage PyTorch
// creates (empty, empty_strided, resize_) is a cell.
#include <c10/core/Allocator.h>
#include <c10/core/CachingDeviceAllocator.h>
#include <ATen/core/Tensor.h>
#include <ATen/EmptyTensor.h>
#include <c10/core/DeviceGuard.h>

#include "aten/device.h"
#include "runtime/runtime.h"

namespace torch_tpu::aten {
namespace {

using runtime::Cell;
using runtime::Runtime;

void delete_cell(void* ctx) { Runtime::get().free_cell(static_cast<Cell*>(ctx)); }

struct TpuAllocator final : c10::DeviceAllocator {
  c10::DataPtr allocate(size_t nbytes) override {
    c10::DeviceIndex dev = current_device();
    Cell* c = Runtime::get().new_cell(nbytes, dev);
    return {reinterpret_cast<void*>(c->addr), c, &delete_cell,
            c10::Device(c10::DeviceType::PrivateUse1, dev)};
  }
  c10::DeleterFnPtr raw_deleter() const override { return nullptr; }
  void copy_data(void* dest, const void* src, std::size_t count) const override {
    Cell* d = Runtime::get().cell_at(dest);
    Cell* s = Runtime::get().cell_at(src);
    TORCH_CHECK(d && s && d->addr == reinterpret_cast<uintptr_t>(dest) &&
                    s->addr == reinterpret_cast<uintptr_t>(src),
                "tpu copy_data: addresses are not the start of tpu storages");
    Runtime::get().copy_bytes(*d, *s, count);
  }
  // Memory statistics come from the PJRT plugin (torch.tpu.memory_stats), not from here.
  bool initialized() override { return Runtime::get().started(); }
  void emptyCache(c10::MempoolId_t) override {}
  void recordStream(const c10::DataPtr&, c10::Stream) override {}
  c10::CachingDeviceAllocator::DeviceStats getDeviceStats(c10::DeviceIndex) override { return {}; }
  void resetAccumulatedStats(c10::DeviceIndex) override {}
  void resetPeakStats(c10::DeviceIndex) override {}
};

TpuAllocator g_allocator;
REGISTER_ALLOCATOR(c10::DeviceType::PrivateUse1, &g_allocator);

}  // namespace

runtime::Cell* cell_of(const at::Tensor& t) {
  TORCH_CHECK(t.device().type() == c10::DeviceType::PrivateUse1, "expected a tpu tensor, got one on ",
              t.device());
  auto* c = static_cast<runtime::Cell*>(t.storage().data_ptr().get_context());
  TORCH_CHECK(c, "tpu tensor has no storage cell");
  return c;
}

at::Tensor new_tpu_tensor(c10::IntArrayRef shape, c10::ScalarType dtype, int device,
                          const std::vector<int64_t>* strides) {
  c10::DeviceGuard guard(c10::Device(c10::DeviceType::PrivateUse1, device));  // the allocator's device
  auto* alloc = c10::GetAllocator(c10::DeviceType::PrivateUse1);
  c10::DispatchKeySet keys(c10::DispatchKey::PrivateUse1);
  if (strides) return at::detail::empty_strided_generic(shape, *strides, alloc, keys, dtype);
  return at::detail::empty_generic(shape, alloc, keys, dtype, std::nullopt);
}

}  // namespace torch_tpu::aten
