// PrivateUse1 hooks: what torch.accelerator, torch.Generator(device="tpu") and storage resizing
// ask of a backend. isAvailable() and deviceCount() never throw.
#include <ATen/detail/PrivateUse1HooksInterface.h>
#include <c10/core/CPUAllocator.h>
#include <c10/core/DeviceGuard.h>
#include <c10/core/Storage.h>

#include "aten/device.h"
#include "runtime/runtime.h"

namespace torch_tpu::aten {
namespace {

using runtime::Cell;
using runtime::Runtime;

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
  // pin_memory() and DataLoader(pin_memory=True) work with tpu as the current accelerator.
  at::Allocator* getPinnedMemoryAllocator() const override { return c10::GetCPUAllocator(); }
  bool isPinnedPtr(const void*) const override { return false; }
  c10::DeviceIndex deviceCount() const override {
    return static_cast<c10::DeviceIndex>(Runtime::get().device_count_noexcept());
  }
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
