// What the runtime tells PyTorch's profiler: each program execution on a device, and each compile or
// disk-cache load of a program.
//
// Executions are recorded only while a profiler session that asked for the device
// (ProfilerActivity.PrivateUse1) runs: csrc/aten/profiler.cc, a Kineto child profiler, starts and
// stops recording and turns the records into device events. The launch path checks recording(), one
// relaxed atomic load, before anything else, so launches cost nothing extra without a profiler.
// Compiles and loads are host work, so they are RecordFunction spans (HostSpan) on the calling
// thread (or a compile pool thread, which carries its profiler state): shown by a CPU-only profile too.
#pragma once

#include <ATen/record_function.h>

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace torch_tpu::runtime::trace {

// One execution of a program on a device. Times are c10::getTime() nanoseconds, the clock of
// PyTorch's profiler events; they are written by the thread that issues the launch and by the
// plugin's completion callback, so they are atomics.
struct Execution {
  std::string name;    // the eager op's overload, "fused run (N ops)" or the compiled graph
  std::string detail;  // what else the profiler shows about it (a fused run's ops), or empty
  int device = 0;
  uint64_t correlation = 0;            // the profiler's id of the op that launched it; 0: none
  std::atomic<int64_t> issued_ns{0};   // handed to PJRT's Execute
  std::atomic<int64_t> returned_ns{0}; // Execute returned; stays 0 when the launch failed
  std::atomic<int64_t> done_ns{0};     // the device finished it; 0 until the plugin says so
};

namespace detail {
extern std::atomic<bool> recording;
}

// True while executions are recorded.
inline bool recording() { return detail::recording.load(std::memory_order_relaxed); }

// Starts recording executions (dropping records left from an earlier session) / stops it. Called by
// the profiler session; one session at a time.
void start();
void stop();

// The executions recorded since start(), in launch order; the records are handed over (a second
// call returns only newer ones).
std::vector<std::shared_ptr<Execution>> take();

// A new record of an execution about to be queued, stamped with the calling thread's current
// correlation id; null when not recording. Call on the thread that runs the op, not the launcher.
std::shared_ptr<Execution> begin(std::string name, std::string detail, int device);

// The profiler's correlation ids of the ops running on the calling thread (innermost last), pushed
// and popped by the profiler session around every op while it records.
void push_correlation(uint64_t id);
void pop_correlation();

// A compile or a disk-cache load, as a span in the profiler's CPU timeline (an at::RecordFunction of
// user scope). `make_name` is called only when a profiler is active on this thread.
class HostSpan {
 public:
  template <typename MakeName>
  explicit HostSpan(MakeName make_name) : rf_(at::RecordScope::USER_SCOPE) {
    if (rf_.isActive()) rf_.before(make_name());  // RecordFunction keeps its own copy of the name
  }

 private:
  at::RecordFunction rf_;
};

}  // namespace torch_tpu::runtime::trace
