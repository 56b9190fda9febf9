// The per-call work of a compiled graph (torch.compile(backend="tpu"); torch_tpu/dynamo/lower_graph.py
// plans it, _C.graph.GraphRunner binds it): in C++ because it runs on every step and the host thread
// competes with the device's. Python-free, so GoogleTests drive it directly.
#pragma once

#include <ATen/Tensor.h>

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "aten/launch_values.h"
#include "pjrt/pjrt.h"
#include "runtime/runtime.h"

namespace torch_tpu::graph {

// Where one program argument comes from, per call.
enum class ArgKind : int { kTpuInput = 0, kCpuInput = 1, kRngState = 2, kHostPack = 3, kConstant = 4 };

struct GraphArg {
  ArgKind kind = ArgKind::kTpuInput;
  int64_t index = -1;            // the graph input (kTpuInput, kCpuInput) or host pack (kHostPack)
  at::Tensor constant;           // kConstant: a CPU or tpu tensor
  std::vector<int64_t> strides;  // kTpuInput: the layout the program reads it in (empty: contiguous)
  std::vector<int64_t> dims;     // kTpuInput: the dims of the buffer the program takes
};

// A graph with collectives is one program over several devices: where its replicas meet
// (runtime/replica_meeting.h), the local device of each replica (-1: another process's), the wait.
struct Meet {
  std::string place;
  std::vector<int> local;
  int64_t timeout_ms = 0;
};

struct GraphResults {
  std::vector<at::Tensor> tensors;  // per program output: the input whose storage received it, or a new tensor
  std::vector<int64_t> copied;      // inputs passed as copies: the caller writes their results back
};

// Runs one compiled graph per call:
// - a tpu input that is its whole storage, in the storage's dtype and the layout the program reads
//   (contiguous, or the strides its plan entry gives), whose buffer has the dims the program takes,
//   is passed as that storage's buffer; any other view, and a storage passed twice where one use is
//   donated, as a copy in that layout (a fresh buffer of those dims), reported in `copied`;
// - CPU inputs, host packs and CPU constants are uploaded; the rng operand advances the default
//   generator by `rng_draws`;
// - result k that replaces input i's value (sink_plan: (k, i) pairs) is written into i's storage
//   unless i was copied; every other result gets a new tensor of its spec.
// With `meet`, the call launches the replica on its inputs' device together with the other replicas
// this process drives (runtime::launch_together).
class GraphRunner {
 public:
  // Raises c10::Error when a donated index is not an input or the specs do not match the outputs.
  GraphRunner(std::shared_ptr<pjrt::Executable> exe, std::vector<GraphArg> plan, const std::vector<int64_t>& donated,
              std::vector<std::pair<int64_t, int64_t>> sink_plan, std::vector<aten::FreshSpec> specs,
              std::string producer, uint64_t rng_draws, std::optional<Meet> meet);
  // inputs: the graph's inputs (undefined where not a tensor); packs: the host packs' CPU tensors.
  // Raises c10::Error for too few inputs or a non-tensor where the plan reads one.
  GraphResults run(const std::vector<at::Tensor>& inputs, const std::vector<at::Tensor>& packs) const;
  int64_t num_inputs() const { return num_inputs_; }

 private:
  void launch_replica(std::vector<runtime::LaunchArg> args, std::vector<runtime::Cell*> sinks, int device) const;

  std::shared_ptr<pjrt::Executable> exe_;
  std::vector<GraphArg> plan_;
  std::vector<bool> donated_;
  std::vector<std::pair<int64_t, int64_t>> sink_plan_;
  std::vector<aten::FreshSpec> specs_;  // per program output
  std::string producer_;
  uint64_t rng_draws_;
  int64_t first_tpu_input_ = -1, num_inputs_ = 0;
  int constant_device_ = -1;
  std::optional<Meet> meet_;
};

}  // namespace torch_tpu::graph
