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

// What an op's front end builds for a call key on a miss (torch_tpu/eager/kernel.py's _Entry derives
// from it as _C.eager.PlanSpec, the one typed value crossing the seam): the program and how the call's
// operands and results bind to it.
struct PlanSpec {
  std::shared_ptr<pjrt::Executable> exe;        // null: not built yet (fused eager builds runs later)
  std::vector<int> order;                       // operand positions, in program argument order
  std::vector<FreshSpec> fresh;                 // new result tensors
  std::vector<Sink> sinks;                      // per program output
  enum Structure : uint8_t { kOne, kTuple, kList, kWritten } structure = kOne;
  // results the program does not compute, by position: undefined tensors (an output_mask's
  // left-out gradients) and ints the shapes fix (fused attention's max_q / max_k)
  std::vector<std::pair<int, c10::IValue>> fixed;
  uint64_t rng_draws = 0;
  uint64_t uid = 0;                             // the program's identity in fused runs (0: not given yet)
  std::string name;                             // the op, for error messages
  bool host = false;                            // runs on the CPU fallback (a key the lowering refused)
};

// A cached plan: the spec, how the op runs it, and the front end's entry it came from.
struct Plan : PlanSpec {
  bool fast = false;                            // runs (strict, with exe) or records (fused) here, no Python
  std::shared_ptr<void> entry;                  // the front end's own object (kernel.py's _Entry)
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
