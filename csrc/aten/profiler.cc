// tpu executions in torch.profiler: a Kineto child profiler, registered through PyTorch's
// PrivateUse1ProfilerRegistry. A profile with ProfilerActivity.PrivateUse1 configures it; while it
// runs, the runtime records every program execution (csrc/runtime/trace.h), and at the end each one
// becomes a Kineto "kernel" activity on the device's row: name (the eager op's program, named by the
// op and its operands as CUDA's rows name kernels; "fused run (N ops)"; the compiled graph), device
// start and end, and a link to the op that launched it. PyTorch gives kernel activities the PrivateUse1 device type, so they appear in key_averages() as device time
// (of the event, and of the op that launched it) and in export_chrome_trace().
//
// Compiles and disk-cache loads are not here: they are host spans (trace::HostSpan), part of the
// CPU timeline.
//
// PyTorch built without Kineto has no such registry; tpu executions are then not traced.
#ifdef USE_KINETO

#include <torch/csrc/profiler/standalone/privateuse1_profiler.h>

#include <libkineto.h>

#include <algorithm>
#include <map>
#include <set>

#include "runtime/trace.h"

namespace torch_tpu::aten {
namespace {

namespace trace = runtime::trace;
using libkineto::ActivityType;

constexpr int32_t kQueue = 1;  // the one row (Kineto "resource") of a device: its execution queue

class TpuSession final : public libkineto::IActivityProfilerSession {
 public:
  explicit TpuSession(bool executions) : executions_(executions), buffer_(std::make_unique<libkineto::CpuTraceBuffer>()) {}

  void start() override {
    if (executions_) trace::start();
  }
  void stop() override {
    if (executions_) trace::stop();
  }
  std::vector<std::string> errors() override { return {}; }

  // Kineto brackets every op it records with these, on the op's thread: an execution is linked to
  // the innermost op running when it was queued.
  void pushCorrelationId(uint64_t id) override {
    if (executions_) trace::push_correlation(id);
  }
  void popCorrelationId() override {
    if (executions_) trace::pop_correlation();
  }

  void processTrace(libkineto::ActivityLogger& logger) override { processTrace(logger, nullptr, 0, 0); }

  void processTrace(libkineto::ActivityLogger& logger, libkineto::getLinkedActivityCallback linked,
                    int64_t start_ns, int64_t end_ns) override {
    buffer_->span = libkineto::TraceSpan(start_ns, end_ns, "tpu");
    // A device runs its executions in launch order: one starts when it was issued or when the one
    // before it finished, whichever is later.
    std::map<int, int64_t> last_end;
    for (const auto& rec : trace::take()) {
      int64_t returned = rec->returned_ns.load(std::memory_order_acquire);
      if (returned == 0) continue;  // the launch failed: nothing ran
      int64_t done = rec->done_ns.load(std::memory_order_acquire);
      int64_t end = done ? done : returned;  // completion not reported yet: the launch's return
      int64_t& prev = last_end[rec->device];
      int64_t begin = std::min(std::max(rec->issued_ns.load(std::memory_order_relaxed), prev), end);
      prev = std::max(prev, end);
      buffer_->emplace_activity(buffer_->span, ActivityType::CONCURRENT_KERNEL, rec->name);
      auto& a = *buffer_->activities.back();
      a.startTime = begin;
      a.endTime = end;
      a.device = rec->device;
      a.resource = kQueue;
      a.id = static_cast<int32_t>(rec->correlation);
      if (linked && rec->correlation) a.linked = linked(a.id);
      // (addMetadata would format with fmt, which libtorch does not export; the row says the device.)
      if (!rec->detail.empty()) a.addMetadataQuoted("ops", rec->detail);
      a.log(logger);
    }
    for (const auto& [device, unused] : last_end) devices_.insert(device);
  }

  std::unique_ptr<libkineto::DeviceInfo> getDeviceInfo() override {
    if (devices_.empty()) return nullptr;
    // Kineto names one device per session: the first one used (one per process in distributed jobs).
    int d = *devices_.begin();
    return std::make_unique<libkineto::DeviceInfo>(
        libkineto::DeviceInfo{d, d, "tpu:" + std::to_string(d), "TPU " + std::to_string(d)});
  }

  std::vector<libkineto::ResourceInfo> getResourceInfos() override {
    std::vector<libkineto::ResourceInfo> out;
    for (int d : devices_) out.push_back(libkineto::ResourceInfo{kQueue, kQueue, d, "executions"});
    return out;
  }

  // Kineto keeps the activities alive with the trace it returns (export_chrome_trace reads them).
  std::unique_ptr<libkineto::CpuTraceBuffer> getTraceBuffer() override { return std::move(buffer_); }

 private:
  bool executions_;
  std::unique_ptr<libkineto::CpuTraceBuffer> buffer_;
  std::set<int> devices_;
};

class TpuProfiler final : public libkineto::IActivityProfiler {
 public:
  const std::string& name() const override { return name_; }
  const std::set<ActivityType>& availableActivities() const override { return activities_; }

  std::unique_ptr<libkineto::IActivityProfilerSession> configure(const std::set<ActivityType>& types,
                                                                 const libkineto::Config&) override {
    // PyTorch asks for kernel activities when the profile includes ProfilerActivity.PrivateUse1.
    return std::make_unique<TpuSession>(types.count(ActivityType::CONCURRENT_KERNEL) > 0);
  }
  std::unique_ptr<libkineto::IActivityProfilerSession> configure(int64_t, int64_t, const std::set<ActivityType>& types,
                                                                 const libkineto::Config& config) override {
    return configure(types, config);
  }

 private:
  std::string name_ = "torch_tpu";
  std::set<ActivityType> activities_ = {ActivityType::CONCURRENT_KERNEL};
};

struct Register {
  Register() {
    torch::profiler::impl::PrivateUse1ProfilerRegistry::instance().registerFactory(
        [] { return std::make_unique<TpuProfiler>(); });
  }
} g_register;

}  // namespace
}  // namespace torch_tpu::aten

#endif  // USE_KINETO
