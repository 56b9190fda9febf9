// tpu_dist's device path: each collective of a group as one StableHLO program over the group's
// devices (torch_tpu/lowering/collectives.py builds it, once per signature), launched on the
// devices this process drives (Runtime::execute_replicas), with no host copy. Where the plugin has
// cross-process collectives (libtpu over ICI, NCCL inside the CUDA plugin) every process drives one
// device of the group and launches its part alone; where a process drives several of the group's
// devices (the CPU plugin, ranks as threads of one process) their parts meet
// (runtime/replica_meeting.h) and the last one to arrive launches them together.
//
// Ordering is a device stream's: the program is queued after every launch before it on the device,
// and every later op on the outputs runs after it; the Work completes when the launch is queued.
// A launch error surfaces at the next host read of an output, naming the collective.
#pragma once

#include <ATen/ATen.h>

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

#include "pjrt/pjrt.h"

namespace torch_tpu::distributed {

// What one collective's program depends on (with the group's devices, fixed per group).
struct CollectiveSignature {
  std::string kind;             // lowering/collectives.py's KINDS: "all_reduce", "broadcast", ...
  c10::ScalarType dtype = c10::kFloat;
  std::vector<int64_t> shape;   // the tensor's
  std::vector<int64_t> dims;    // its storage buffer's: the program's parameter, reshaped to `shape`
  std::string op;               // reduce op, lower case ("sum", "avg", ...); "" where none
  int64_t root = 0;             // broadcast / reduce: the group rank
  // The group ranks the program spans, in replica order; empty: all of them. send/recv span the
  // sender and the receiver: ("permute", ranks {src, dst}), replica 0's tensor arriving at replica 1.
  std::vector<int64_t> ranks;
  std::string key() const;
};

// Builds the executable of a signature for the group's devices (Python, with the GIL taken).
using ProgramBuilder = std::function<std::shared_ptr<pjrt::Executable>(const CollectiveSignature&)>;

class DeviceCollectives {
 public:
  // `group_key` names the group in this process (the group's ranks that this process drives share
  // it); `local_devices[r]`: the local device index of group rank r where this process drives it,
  // else -1; `rank`: this backend's group rank (one this process drives).
  DeviceCollectives(std::string group_key, std::vector<int> local_devices, int rank, ProgramBuilder build);

  // Runs `sig` for this rank: the program reads `input`'s storage and its result replaces
  // `output`'s (both dense tensors that are their whole storage, on this rank's device). Blocks
  // until the launch is queued; throws (nothing written) when the program cannot be built, or when
  // another local rank does not arrive within `timeout`.
  void run(const CollectiveSignature& sig, const at::Tensor& input, const at::Tensor& output,
           std::chrono::milliseconds timeout, const std::string& name);

  int device() const { return local_devices_[rank_]; }

 private:
  std::shared_ptr<pjrt::Executable> executable(const CollectiveSignature& sig);
  std::string group_key_;
  std::vector<int> local_devices_;
  int rank_;
  ProgramBuilder build_;
  std::mutex mu_;
  std::unordered_map<std::string, std::shared_ptr<pjrt::Executable>> programs_;
};

}  // namespace torch_tpu::distributed
