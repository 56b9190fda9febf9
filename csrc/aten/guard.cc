// Device guard for tpu (c10::impl::DeviceGuardImplInterface), so that DeviceGuard, tensor
// factories with device="tpu:N" and torch.tpu.device(...) switch the current device, and so that
// torch.Stream / torch.Event (and torch.tpu.Stream / Event over them) work on tpu.
//
// Streams: PJRT has no user-visible streams. Every device runs the executions the runtime issues
// to it in one order (the launch queue), so all streams of a device share that one order: work is
// never reordered across streams, and a stream's wait on an event or another stream is already
// satisfied (block() does nothing). Streams still have distinct ids, a thread-local current one per
// device, and real query/synchronize (they mean "all work issued to the device"), so CUDA-style
// stream code runs unchanged and correctly, with no concurrency between streams.
//
// Events: an event records a runtime::Marker (the executions in flight when the marker is reached
// in the launch queue): query() never blocks, synchronize() waits for them and raises their error,
// and elapsed_time() is the difference between two markers' completion times, in milliseconds
// (events made with enable_timing=True, as on CUDA).
#include <c10/core/impl/DeviceGuardImplInterface.h>

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <chrono>
#include <map>
#include <memory>

#include "aten/device.h"
#include "runtime/runtime.h"

namespace torch_tpu::aten {
namespace {

thread_local c10::DeviceIndex tls_device = 0;
thread_local std::map<c10::DeviceIndex, c10::StreamId> tls_stream;  // absent: the default stream
std::atomic<c10::StreamId> next_stream_id{1};

struct TpuEvent {
  std::shared_ptr<runtime::Marker> marker;  // null until recorded
  bool timing = false;
};

// "tpu" without an index means the current device, as for tensors (and tpu:LOCAL_RANK, own_device).
c10::Device resolved(c10::Device d) {
  return c10::Device(c10::DeviceType::PrivateUse1, d.has_index() ? own_device(d.index()) : tls_device);
}

struct TpuGuardImpl final : c10::impl::DeviceGuardImplInterface {
  c10::DeviceType type() const override { return c10::DeviceType::PrivateUse1; }
  c10::Device exchangeDevice(c10::Device d) const override {
    auto old = getDevice();
    if (d.index() != old.index()) setDevice(d);
    return old;
  }
  c10::Device getDevice() const override { return c10::Device(c10::DeviceType::PrivateUse1, tls_device); }
  void setDevice(c10::Device d) const override { set_device(d.index()); }
  void uncheckedSetDevice(c10::Device d) const noexcept override { tls_device = own_device(d.index()); }
  c10::Stream getStream(c10::Device d) const override {
    d = resolved(d);
    auto it = tls_stream.find(d.index());
    return c10::Stream(c10::Stream::UNSAFE, d, it == tls_stream.end() ? 0 : it->second);
  }
  c10::Stream getDefaultStream(c10::Device d) const override {
    return c10::Stream(c10::Stream::DEFAULT, resolved(d));
  }
  c10::Stream getNewStream(c10::Device d, int priority) const override {
    return c10::Stream(c10::Stream::UNSAFE, resolved(d), next_stream_id++);
  }
  c10::Stream getStreamFromGlobalPool(c10::Device d, bool high_priority) const override {
    return getNewStream(d, high_priority ? -1 : 0);
  }
  c10::Stream exchangeStream(c10::Stream s) const override {
    c10::Stream old = getStream(s.device());
    tls_stream[resolved(s.device()).index()] = s.id();
    return old;
  }
  bool queryStream(const c10::Stream& s) const override {
    return !runtime::Runtime::get().started() || runtime::Runtime::get().idle(s.device_index());
  }
  void synchronizeStream(const c10::Stream& s) const override { synchronizeDevice(s.device_index()); }

  void record(void** event, const c10::Stream& stream, const c10::DeviceIndex device_index,
              const c10::EventFlag flag) const override {
    TORCH_CHECK(device_index == -1 || device_index == stream.device_index(), "event recorded on tpu:",
                static_cast<int>(device_index), " cannot be recorded again on a stream of tpu:",
                static_cast<int>(stream.device_index()), " (create a new event)");
    if (!*event) {
      // torch.Event(enable_timing=True) asks for BACKEND_DEFAULT, and False for PYTORCH_DEFAULT.
      *event = new TpuEvent{nullptr, flag == c10::EventFlag::BACKEND_DEFAULT};
    }
    static_cast<TpuEvent*>(*event)->marker = runtime::Runtime::get().mark(stream.device_index());
  }
  void block(void* event, const c10::Stream& stream) const override {}  // one order per device
  bool queryEvent(void* event) const override {
    auto* e = static_cast<TpuEvent*>(event);
    return !e || !e->marker || e->marker->query();
  }
  void synchronizeEvent(void* event) const override {
    auto* e = static_cast<TpuEvent*>(event);
    if (!e || !e->marker) return;
    e->marker->synchronize();
    runtime::Runtime::get().raise_launch_error();  // a launch before it failed when issued
  }
  void destroyEvent(void* event, const c10::DeviceIndex) const noexcept override {
    delete static_cast<TpuEvent*>(event);
  }
  double elapsedTime(void* start, void* end, const c10::DeviceIndex) const override {
    auto* a = static_cast<TpuEvent*>(start);
    auto* b = static_cast<TpuEvent*>(end);
    TORCH_CHECK(a && b && a->timing && b->timing,
                "elapsed_time: both events must be created with enable_timing=True (as on CUDA)");
    TORCH_CHECK(a->marker && b->marker, "elapsed_time: both events must be recorded first (event.record())");
    auto ta = a->marker->completed_ns(), tb = b->marker->completed_ns();
    TORCH_CHECK(ta && tb, "elapsed_time: the work before an event has not finished; call "
                "end_event.synchronize() first");
    // Each time is when the last PJRT completion callback of its marker ran, on whichever thread
    // delivers it: a later marker whose work was already done when it was recorded can be stamped a
    // few microseconds before an earlier one whose callback is still on its way (-0.021 ms in a CI
    // run). The work after the start event ended no earlier than the start's: never negative.
    return static_cast<double>(std::max<int64_t>(*tb - *ta, 0)) / 1e6;
  }
  c10::DeviceIndex deviceCount() const noexcept override { return visible_device_count(); }
  void synchronizeDevice(c10::DeviceIndex index) const override {
    runtime::Runtime::get().synchronize(index);
  }
};

C10_REGISTER_GUARD_IMPL(PrivateUse1, TpuGuardImpl);

}  // namespace

c10::DeviceIndex current_device() { return tls_device; }

namespace {
// (LOCAL_RANK, LOCAL_WORLD_SIZE) of a torchrun job running several processes on this host, else
// (-1, 0). Read once: torchrun sets them before the process starts.
std::pair<int, int> local_world() {
  static const std::pair<int, int> w = [] {
    const char* size = std::getenv("LOCAL_WORLD_SIZE");
    const char* rank = std::getenv("LOCAL_RANK");
    if (!size || !rank) return std::make_pair(-1, 0);
    int n = std::atoi(size), r = std::atoi(rank);
    return n > 1 && r >= 0 && r < n ? std::make_pair(r, n) : std::make_pair(-1, 0);
  }();
  return w;
}

// True in a process of such a job that drives one device (the plugin shows it one).
bool drives_one_of_local_world() noexcept {
  return local_world().second > 1 && runtime::Runtime::get().device_count_noexcept() == 1;
}
}  // namespace

c10::DeviceIndex visible_device_count() noexcept {
  if (drives_one_of_local_world()) return static_cast<c10::DeviceIndex>(local_world().second);
  return static_cast<c10::DeviceIndex>(runtime::Runtime::get().device_count_noexcept());
}

c10::DeviceIndex own_device(c10::DeviceIndex index) {
  int local_rank = local_world().first;
  if (index != local_rank || local_rank <= 0) return index;
  return drives_one_of_local_world() ? 0 : index;
}

void check_device_index(c10::DeviceIndex index) {
  int n = runtime::Runtime::get().device_count_noexcept();
  c10::DeviceIndex own = own_device(index);
  if (own < 0 || own >= n) {
    // Starting the client raises the plugin's own error when that is why there is no device.
    runtime::Runtime::get().client();
    auto [local_rank, local_size] = local_world();
    if (drives_one_of_local_world() && index > 0 && index < local_size) {
      TORCH_CHECK_INDEX(false, "tpu:", static_cast<int>(index), " is the device of local rank ",
                        static_cast<int>(index), ", which its own process drives: in a multi-process job "
                        "(torchrun) each process drives one device. This process (LOCAL_RANK=", local_rank,
                        ") drives tpu:", local_rank, ", also named tpu:0; write torch.device('tpu').");
    }
    bool per_process = local_size > 1;
    TORCH_CHECK_INDEX(false, "invalid tpu device index ", static_cast<int>(index), ": there are ", n,
                      " tpu device(s) (valid indices 0..", n - 1, ")",
                      per_process ? ". In a multi-process job (torchrun) each process drives its own device, "
                                    "tpu:0, also named tpu:LOCAL_RANK; write torch.device('tpu')."
                                  : "");
  }
}

void set_device(c10::DeviceIndex index) {
  if (index < 0) return;  // "tpu" without an index keeps the current device
  check_device_index(index);
  tls_device = own_device(index);
}

}  // namespace torch_tpu::aten
