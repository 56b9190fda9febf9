// Device guard for tpu (c10::impl::DeviceGuardImplInterface), so that DeviceGuard, tensor
// factories with device="tpu:N" and torch.tpu.device(...) switch the current device.
// PJRT has no user-visible streams: every device has a single default stream (id 0).
#include <c10/core/impl/DeviceGuardImplInterface.h>

#include "aten/device.h"
#include "runtime/runtime.h"

namespace torch_tpu::aten {
namespace {

thread_local c10::DeviceIndex tls_device = 0;

struct TpuGuardImpl final : c10::impl::DeviceGuardImplInterface {
  c10::DeviceType type() const override { return c10::DeviceType::PrivateUse1; }
  c10::Device exchangeDevice(c10::Device d) const override {
    auto old = getDevice();
    if (d.index() != old.index()) setDevice(d);
    return old;
  }
  c10::Device getDevice() const override { return c10::Device(c10::DeviceType::PrivateUse1, tls_device); }
  void setDevice(c10::Device d) const override { set_device(d.index()); }
  void uncheckedSetDevice(c10::Device d) const noexcept override { tls_device = d.index(); }
  c10::Stream getStream(c10::Device d) const override {
    return c10::Stream(c10::Stream::DEFAULT, d);
  }
  c10::Stream exchangeStream(c10::Stream s) const override {
    return c10::Stream(c10::Stream::DEFAULT, s.device());
  }
  c10::DeviceIndex deviceCount() const noexcept override {
    return static_cast<c10::DeviceIndex>(runtime::Runtime::get().device_count_noexcept());
  }
  void synchronizeDevice(c10::DeviceIndex index) const override {
    runtime::Runtime::get().synchronize(index);
  }
};

C10_REGISTER_GUARD_IMPL(PrivateUse1, TpuGuardImpl);

}  // namespace

c10::DeviceIndex current_device() { return tls_device; }

void check_device_index(c10::DeviceIndex index) {
  int n = runtime::Runtime::get().device_count_noexcept();
  if (index < 0 || index >= n) {
    // Starting the client raises the plugin's own error when that is why there is no device.
    runtime::Runtime::get().client();
    TORCH_CHECK_INDEX(false, "invalid tpu device index ", static_cast<int>(index), ": there are ", n,
                      " tpu device(s) (valid indices 0..", n - 1, ")");
  }
}

void set_device(c10::DeviceIndex index) {
  if (index < 0) return;  // "tpu" without an index keeps the current device
  check_device_index(index);
  tls_device = index;
}

}  // namespace torch_tpu::aten
