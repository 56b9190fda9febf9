// The tpu allocator: a storage is a runtime::Cell (its PJRT buffer is created lazily) at a unique
// fake device address. Registered as the PrivateUse1 allocator, so every tpu storage PyTorch
// creates (empty, empty_strided, resize_) is a cell.
#include <c10/core/Allocator.h>
#include <c10/core/CachingDeviceAllocator.h>
#include <ATen/core/Tensor.h>
#include <ATen/EmptyTensor.h>
#include <c10/core/DeviceGuard.h>

#include <unistd.h>

#include <algorithm>

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
  // Memory statistics are the runtime's own count of live storages (Runtime::memory), so they work
  // on every plugin; there is no cache to empty (storages are PJRT buffers, freed when their last
  // queued reader is done).
  bool initialized() override { return Runtime::get().started(); }
  void emptyCache(c10::MempoolId_t) override {}
  void recordStream(const c10::DataPtr&, c10::Stream) override {}
  c10::CachingDeviceAllocator::DeviceStats getDeviceStats(c10::DeviceIndex device) override {
    auto m = Runtime::get().memory(device);
    c10::CachingDeviceAllocator::DeviceStats s;
    auto set = [](c10::CachingDeviceAllocator::StatArray& a, int64_t cur, int64_t peak, int64_t alloc, int64_t freed) {
      for (auto& st : a) st = {};
      auto& agg = a[static_cast<size_t>(c10::CachingDeviceAllocator::StatType::AGGREGATE)];
      agg.current = cur;
      agg.peak = peak;
      agg.allocated = alloc;
      agg.freed = freed;
    };
    set(s.allocation, m.count, m.peak_count, m.allocations, m.frees);
    set(s.active, m.count, m.peak_count, m.allocations, m.frees);
    set(s.segment, m.count, m.peak_count, m.allocations, m.frees);
    for (auto* a : {&s.allocated_bytes, &s.reserved_bytes, &s.active_bytes, &s.requested_bytes})
      set(*a, m.bytes, m.peak_bytes, m.allocated_bytes, m.freed_bytes);
    return s;
  }
  void resetAccumulatedStats(c10::DeviceIndex device) override { Runtime::get().reset_accumulated_memory(device); }
  void resetPeakStats(c10::DeviceIndex device) override { Runtime::get().reset_peak_memory(device); }
  // (free, total) bytes: the plugin's limit and use where it reports them; otherwise (the CPU
  // plugin, whose device memory is host memory) the host's available and physical memory.
  std::pair<size_t, size_t> getMemoryInfo(c10::DeviceIndex device) override {
    auto st = Runtime::get().client().memory_stats(device);
    if (st.bytes_limit > 0 && st.bytes_in_use >= 0)
      return {static_cast<size_t>(std::max<int64_t>(st.bytes_limit - st.bytes_in_use, 0)),
              static_cast<size_t>(st.bytes_limit)};
    long page = sysconf(_SC_PAGESIZE);
    return {static_cast<size_t>(sysconf(_SC_AVPHYS_PAGES)) * page, static_cast<size_t>(sysconf(_SC_PHYS_PAGES)) * page};
  }
};

TpuAllocator g_allocator;
REGISTER_ALLOCATOR(c10::DeviceType::PrivateUse1, &g_allocator);

// A storage whose memory the tpu allocator did not make, around a tpu address. At the start of a
// live storage, of at most its size, it is that storage under another StorageImpl: an alias, as
// from_dlpack(to_dlpack(x)) (whose capsule keeps x alive) or from_blob make (CUDA's from_dlpack
// shares memory the same way). Inside one, it is a slice (`storage[a:b]`, whose DataPtr points into
// the sliced storage's): bytes at an offset no program knows of.
runtime::Cell* foreign_cell(const c10::Storage& storage) {
  const void* addr = storage.data_ptr().get();
  Cell* c = addr ? Runtime::get().cell_at(addr) : nullptr;
  if (c && c->addr == reinterpret_cast<uintptr_t>(addr) && storage.nbytes() <= c->nbytes) return c;
  TORCH_CHECK(false,
              "this tpu tensor lives in a slice of a tpu storage (storage[a:b]), which torch_tpu cannot read or "
              "write: index the storage itself (storage[i]), or slice a tensor that views it "
              "(torch.empty(0, dtype=torch.uint8, device='tpu').set_(storage)[a:b])");
  return nullptr;
}

}  // namespace

runtime::Cell* cell_of(const at::Tensor& t) {
  TORCH_CHECK(t.device().type() == c10::DeviceType::PrivateUse1, "expected a tpu tensor, got one on ",
              t.device());
  const c10::DataPtr& data = t.storage().data_ptr();
  if (data.get_deleter() != &delete_cell) return foreign_cell(t.storage());
  auto* c = static_cast<runtime::Cell*>(data.get_context());
  TORCH_CHECK(c, "tpu tensor has no storage cell");
  return c;
}

at::Tensor new_tpu_tensor(c10::IntArrayRef shape, c10::ScalarType dtype, int device,
                          const std::vector<int64_t>* strides) {
  c10::DeviceGuard guard(c10::Device(c10::DeviceType::PrivateUse1, device));  // the allocator's device
  auto* alloc = c10::GetAllocator(c10::DeviceType::PrivateUse1);
  c10::DispatchKeySet keys(c10::DispatchKey::PrivateUse1);
  at::Tensor t = strides ? at::detail::empty_strided_generic(shape, *strides, alloc, keys, dtype)
                         : at::detail::empty_generic(shape, alloc, keys, dtype, std::nullopt);
  hint_layout(t);
  return t;
}

void hint_layout(const at::Tensor& t) {
  if (t.numel() == 0 || t.storage_offset() != 0) return;
  runtime::Cell* c = cell_of(t);
  if (static_cast<size_t>(t.numel()) * t.itemsize() != c->nbytes) return;
  std::vector<int64_t> dims;
  if (t.is_contiguous()) {
    dims = t.sizes().vec();
  } else {
    // Outermost to innermost in memory, as torch_tpu/lowering/strided.py's dense_order orders them.
    std::vector<int64_t> order(t.dim());
    for (int64_t d = 0; d < t.dim(); ++d) order[d] = d;
    std::stable_sort(order.begin(), order.end(), [&](int64_t a, int64_t b) { return t.stride(a) > t.stride(b); });
    int64_t expect = 1;
    for (auto it = order.rbegin(); it != order.rend(); ++it) {
      if (t.size(*it) == 1) continue;
      if (t.stride(*it) != expect) return;  // not a dense permutation: the storage stays 1-D
      expect *= t.size(*it);
    }
    for (int64_t d : order) dims.push_back(t.size(d));
  }
  Runtime::hint_layout(*c, t.scalar_type(), std::move(dims));
}

}  // namespace torch_tpu::aten
