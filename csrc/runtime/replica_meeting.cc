// Launches of one replicated program whose parts several threads bring (see replica_meeting.h).
#include "runtime/replica_meeting.h"

#include <c10/util/Exception.h>

#include <condition_variable>
#include <map>
#include <mutex>
#include <vector>

namespace torch_tpu::runtime {
namespace {

struct Meeting {
  std::vector<Runtime::ReplicaPart> parts;
  std::shared_ptr<pjrt::Executable> exe;
  int arrived = 0, left = 0;
  bool launched = false;
  std::exception_ptr error;
};

struct Place {
  std::mutex mu;
  std::condition_variable cv;
  std::vector<uint64_t> calls;           // per participant: the launches it has joined here
  std::map<uint64_t, Meeting> meetings;  // by launch number
};

Place& place_named(const std::string& name) {
  static std::mutex mu;
  static std::map<std::string, std::unique_ptr<Place>> all;  // never freed: one per group and program
  std::lock_guard<std::mutex> g(mu);
  auto& p = all[name];
  if (!p) p = std::make_unique<Place>();
  return *p;
}

}  // namespace

void launch_together(const std::string& place, int locals, int mine, std::shared_ptr<pjrt::Executable> exe,
                     Runtime::ReplicaPart part, std::chrono::milliseconds timeout, const std::string& name) {
  TORCH_CHECK(locals >= 1 && mine >= 0 && mine < locals, name, ": replica part ", mine, " of ", locals);
  auto& rt = Runtime::get();
  if (locals == 1) {  // one replica here (a process per device): nothing to wait for
    rt.execute_replicas(std::move(exe), {std::move(part)}, name);
    return;
  }
  Place& p = place_named(place);
  std::unique_lock<std::mutex> lk(p.mu);
  if (p.calls.size() < static_cast<size_t>(locals)) p.calls.resize(locals, 0);
  uint64_t seq = p.calls[mine]++;
  Meeting& m = p.meetings[seq];
  if (m.parts.empty()) m.parts.resize(locals);
  m.parts[mine] = std::move(part);
  m.exe = std::move(exe);
  if (++m.arrived == locals) {
    try {
      rt.execute_replicas(m.exe, std::move(m.parts), name);
    } catch (...) {
      m.error = std::current_exception();
    }
    m.launched = true;
    p.cv.notify_all();
  } else if (!p.cv.wait_for(lk, timeout, [&] { return m.launched; })) {
    // Nothing launched: this call's part is withdrawn, so a later retry starts a new launch.
    p.calls[mine]--;
    m.arrived--;
    m.parts[mine] = Runtime::ReplicaPart{};
    if (m.arrived == 0) p.meetings.erase(seq);
    TORCH_CHECK(false, name, ": the other ranks of this process did not launch their part within the timeout (",
                timeout.count(), " ms)");
  }
  std::exception_ptr error = m.error;
  if (++m.left == locals) p.meetings.erase(seq);
  lk.unlock();
  if (error) std::rethrow_exception(error);
}

}  // namespace torch_tpu::runtime
