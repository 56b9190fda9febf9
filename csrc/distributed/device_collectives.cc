// tpu_dist's device path (see device_collectives.h).
#include "distributed/device_collectives.h"

#include "aten/device.h"
#include "runtime/replica_meeting.h"
#include "runtime/runtime.h"

#include <c10/util/Exception.h>


namespace torch_tpu::distributed {

std::string CollectiveSignature::key() const {
  std::string k = kind + "|" + std::to_string(static_cast<int>(dtype)) + "|" + op + "|" + std::to_string(root) + "|";
  for (int64_t d : shape) k += std::to_string(d) + ",";
  k += "|";
  for (int64_t d : dims) k += std::to_string(d) + ",";
  k += "|";
  for (int64_t r : ranks) k += std::to_string(r) + ",";
  return k;
}

DeviceCollectives::DeviceCollectives(std::string group_key, std::vector<int> local_devices, int rank,
                                     ProgramBuilder build)
    : group_key_(std::move(group_key)), local_devices_(std::move(local_devices)), rank_(rank), build_(std::move(build)) {
  TORCH_CHECK(rank_ >= 0 && rank_ < static_cast<int>(local_devices_.size()) && local_devices_[rank_] >= 0,
              "tpu_dist device collectives: rank ", rank_, " is not driven by this process");
}

std::shared_ptr<pjrt::Executable> DeviceCollectives::executable(const CollectiveSignature& sig) {
  std::string key = sig.key();
  {
    std::lock_guard<std::mutex> g(mu_);
    auto it = programs_.find(key);
    if (it != programs_.end()) return it->second;
  }
  auto exe = build_(sig);  // outside the lock: it takes the GIL and may compile for seconds
  std::lock_guard<std::mutex> g(mu_);
  programs_.emplace(key, exe);
  return exe;
}

void DeviceCollectives::run(const CollectiveSignature& sig, const at::Tensor& input, const at::Tensor& output,
                            std::chrono::milliseconds timeout, const std::string& name) {
  auto exe = executable(sig);
  auto& rt = runtime::Runtime::get();
  rt.flush_recorded();  // fused eager's recorded writes to the inputs are issued first
  runtime::Runtime::ReplicaPart part;
  part.device = device();
  part.args.push_back(runtime::LaunchArg{aten::cell_of(input), nullptr});
  part.sinks.push_back(aten::cell_of(output));
  // The span's ranks this process drives, and this rank's place among them (its part of the launch).
  std::vector<int64_t> span = sig.ranks;
  if (span.empty()) {
    for (int64_t r = 0; r < static_cast<int64_t>(local_devices_.size()); ++r) span.push_back(r);
  }
  int locals = 0, mine = -1;
  for (int64_t r : span) {
    if (local_devices_.at(r) < 0) continue;
    if (r == rank_) mine = locals;
    locals++;
  }
  TORCH_CHECK(mine >= 0, name, ": rank ", rank_, " is not among the ranks the program spans");
  std::string place = group_key_;
  for (int64_t r : sig.ranks) place += "/" + std::to_string(r);
  runtime::launch_together(place, locals, mine, std::move(exe), std::move(part), timeout, name);
}

}  // namespace torch_tpu::distributed
