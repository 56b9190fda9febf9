// DDP's timing statistics (forward, backward compute and communication times in
// DistributedDataParallel's logging data) for tpu modules: c10d's reducer asks the TimerRegistry
// for a timer of the module's device type, and warns and records nothing when there is none. As
// CUDA's timer records CUDA events, this records runtime markers (the completion of the work issued
// on the device at each point; csrc/runtime/runtime.h), and measures between their completion times.
#include <torch/csrc/distributed/c10d/reducer_timer.hpp>

#include <memory>

#include "runtime/runtime.h"

namespace torch_tpu::distributed {

class TpuTimer final : public c10d::Timer {
 public:
  explicit TpuTimer(c10::Device device) : device_(device.has_index() ? device.index() : 0) {}

  void record(Event event) override { marker(event) = runtime::Runtime::get().mark(device_); }

  // Nanoseconds between the completion of the work before `start` and before `end`; waits for both.
  std::optional<int64_t> measureDifference(Event start, Event end) override {
    auto& a = marker(start);
    auto& b = marker(end);
    if (!a || !b) return std::nullopt;
    a->synchronize();
    b->synchronize();
    auto ta = a->completed_ns(), tb = b->completed_ns();
    if (!ta || !tb || *tb < *ta) return std::nullopt;  // e.g. an event recorded in an earlier step
    return *tb - *ta;
  }

 private:
  std::shared_ptr<runtime::Marker>& marker(Event event) { return markers_[static_cast<int>(event)]; }
  int device_;
  std::shared_ptr<runtime::Marker> markers_[5];
};

}  // namespace torch_tpu::distributed

namespace c10d {
C10_REGISTER_TYPED_CLASS(TimerRegistry, c10::kPrivateUse1, torch_tpu::distributed::TpuTimer)
}  // namespace c10d
