// The eager plan cache: what a lowered op's call needs to run once its program is built, keyed by
// the call's key (eager/call.h), and the C++ run of a plan (strict mode's hot path: no Python).
#pragma once

#include <ATen/core/stack.h>

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "aten/launch_values.h"
#include "eager/call.h"
#include "pjrt/pjrt.h"
#include "runtime/compile_cache.h"
#include "runtime/lru_cache.h"
#include "runtime/runtime.h"

namespace torch_tpu::eager {

// The launch values of ATen arguments and results (aten/launch_values.h), which graphs use too.
using aten::FreshSpec;
using aten::host_tensor_arg;
using aten::new_tensor_of;
using aten::rng_arg;
using aten::scalar_arg;

// Where one program output goes: fresh result tensor `index`, or the storage of operand `index`
// (a written argument's).
struct Sink {
  bool fresh;
  int index;
};

struct Plan {
  std::shared_ptr<const pjrt::Executable> exe;  // null: the Python path runs it (fused eager builds later)
  std::vector<int> order;                       // operand positions, in program argument order
  std::vector<FreshSpec> fresh;                 // new result tensors
  std::vector<Sink> sinks;                      // per program output
  enum Structure : uint8_t { kOne, kTuple, kList, kWritten } structure = kOne;
  // results the program does not compute, by position: undefined tensors (an output_mask's
  // left-out gradients) and ints the shapes fix (fused attention's max_q / max_k)
  std::vector<std::pair<int, c10::IValue>> fixed;
  uint64_t rng_draws = 0;
  uint64_t uid = 0;                             // the program's identity in fused runs (stable per entry)
  std::string name;                             // the op, for error messages
  bool fast = false;                            // runs (strict, with exe) or records (fused) here, no Python
  bool host = false;                            // runs on the CPU fallback (a key the lowering refused)
  std::shared_ptr<void> entry;                  // the front-end's own description (a Python object)
};

// The op facts a plan run needs (from the schema).
struct OpFacts {
  std::vector<int> written;  // indices of written (alias-annotated, mutated) arguments
  size_t num_returns = 0;
  std::string name;          // the overload, for errors naming the op
};

// Hash of a call key (words of csrc/eager/call.h; fused eager's run keys too).
struct KeyHash {
  size_t operator()(const std::vector<int64_t>& k) const noexcept;
};

// Plans by call key (runtime/lru_cache.h's policy): a plan holds its loaded executable, so the
// least recently used go past kPlanCacheEntries or runtime::kProgramCacheBytes of programs (they
// reload from the compilation cache's tiers). plan_bytes: what a plan counts as.
using PlanCache = runtime::LruCache<std::vector<int64_t>, std::shared_ptr<Plan>, KeyHash>;
constexpr size_t kPlanCacheEntries = 4096;
PlanCache& plan_cache();
int64_t plan_bytes(const Plan& plan);
// Calls the fast path ran (run_plan with no Python), since the last reset.
std::atomic<int64_t>& plan_fast_runs();

// Runs `plan` for `call` and replaces the op's arguments on `stack` by its results: strict eager
// queues it for the launcher (nothing waits; needs plan.exe), fused eager records it.
void run_plan(const std::shared_ptr<Plan>& plan, const OpFacts& op, Call& call, torch::jit::Stack* stack, bool fused);


}  // namespace torch_tpu::eager
