// PrivateUse1 hooks: what torch.accelerator, torch.Generator(device="tpu") and storage resizing
// ask of a backend. isAvailable() and deviceCount() never throw.
#include <ATen/detail/PrivateUse1HooksInterface.h>
#include <c10/core/CPUAllocator.h>
#include <c10/core/DeviceGuard.h>
#include <c10/core/Storage.h>

#include <algorithm>
#include <map>
#include <mutex>

#include "aten/device.h"
#include "runtime/runtime.h"

namespace torch_tpu::aten {
namespace {

using runtime::Cell;
using runtime::Runtime;

// CPU memory that remembers it was asked for as pinned: the blocks it handed out and has not freed.
class PinnedAllocator final : public c10::Allocator {
 public:
  c10::DataPtr allocate(size_t n) override {
    c10::DataPtr inner = c10::GetCPUAllocator()->allocate(n);
    void* p = inner.get();
    if (p) {
      std::lock_guard<std::mutex> g(mu_);
      live_[p] = n;
    }
    return {p, new c10::DataPtr(std::move(inner)), &PinnedAllocator::release, c10::Device(c10::DeviceType::CPU)};
  }
  void copy_data(void* dest, const void* src, std::size_t count) const override {
    default_copy_data(dest, src, count);
  }
  // True for a pointer into a live block (as for CUDA host memory, an offset into one counts).
  bool owns(const void* p) {
    std::lock_guard<std::mutex> g(mu_);
    auto it = live_.upper_bound(p);
    if (it == live_.begin()) return false;
    --it;
    return static_cast<const char*>(p) < static_cast<const char*>(it->first) + std::max<size_t>(it->second, 1);
  }

 private:
  static void release(void* ctx);
  std::mutex mu_;
  std::map<const void*, size_t> live_;  // block start -> bytes
};

PinnedAllocator& pinned_allocator() {
  static PinnedAllocator* a = new PinnedAllocator();  // leaked: blocks may be freed at exit
  return *a;
}

void PinnedAllocator::release(void* ctx) {
  auto* inner = static_cast<c10::DataPtr*>(ctx);
  {
    std::lock_guard<std::mutex> g(pinned_allocator().mu_);
    pinned_allocator().live_.erase(inner->get());
  }
  delete inner;  // frees the CPU block
}

struct TpuHooks final : at::PrivateUse1HooksInterface {
  bool isBuilt() const override { return true; }
  bool isAvailable() const override { return Runtime::get().device_count_noexcept() > 0; }
  const at::Generator& getDefaultGenerator(c10::DeviceIndex index) const override {
    return default_generator(index);
  }
  at::Generator getNewGenerator(c10::DeviceIndex index) const override { return new_generator(index); }
  at::Device getDeviceFromPtr(void* data) const override {
    Cell* c = Runtime::get().cell_at(data);
    TORCH_CHECK(c, "pointer ", data, " is not in any tpu storage");
    return at::Device(c10::DeviceType::PrivateUse1, c->device);
  }
  bool hasPrimaryContext(c10::DeviceIndex) const override { return Runtime::get().started(); }
  // PJRT copies host data itself: "pinned" host memory is ordinary CPU memory here, so that
  // pin_memory() and DataLoader(pin_memory=True) work with tpu as the current accelerator. Memory
  // from this allocator reads as pinned (is_pinned() is true), as DDP's reducer asserts of it.
  at::Allocator* getPinnedMemoryAllocator() const override { return &pinned_allocator(); }
  bool isPinnedPtr(const void* p) const override { return pinned_allocator().owns(p); }
  c10::DeviceIndex deviceCount() const override { return visible_device_count(); }
  void setCurrentDevice(c10::DeviceIndex d) const override { set_device(d); }
  c10::DeviceIndex getCurrentDevice() const override { return current_device(); }
  c10::DeviceIndex exchangeDevice(c10::DeviceIndex d) const override {
    auto old = current_device();
    set_device(d);
    return old;
  }
  c10::DeviceIndex maybeExchangeDevice(c10::DeviceIndex d) const override { return exchangeDevice(d); }
  // storage.resize_(n): a new cell holding the old bytes (zero-extended or truncated).
  void resizePrivateUse1Bytes(const c10::Storage& storage, size_t newsize) const override {
    auto* impl = storage.unsafeGetStorageImpl();
    TORCH_CHECK(impl->resizable(), "Trying to resize storage that is not resizable");
    c10::Allocator* alloc = impl->allocator();
    TORCH_CHECK(alloc, "tpu storage has no allocator; it cannot be resized");
    // Recorded (fused) ops still to read this storage read its old cell: run them first.
    Runtime::get().flush_recorded();
    // The new cell lives on the storage's device, whatever the current device is.
    c10::DeviceGuard guard(impl->device());
    c10::DataPtr fresh = alloc->allocate(newsize);
    Cell* dst = static_cast<Cell*>(fresh.get_context());
    Cell* src = static_cast<Cell*>(impl->data_ptr().get_context());
    if (src) Runtime::get().copy_bytes(*dst, *src, std::min(newsize, impl->nbytes()));
    impl->set_data_ptr_noswap(std::move(fresh));
    impl->set_nbytes(newsize);
  }
};

struct Register {
  Register() { at::RegisterPrivateUse1HooksInterface(new TpuHooks()); }
} g_register;

}  // namespace
}  // namespace torch_tpu::aten
