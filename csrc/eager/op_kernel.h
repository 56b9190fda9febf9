// The dispatcher's PrivateUse1 entry of every lowered overload: strict eager's hot path (key, plan
// cache hit, launch) and fused eager's recording run here with no front end; everything else (a
// cache miss: meta, lowering, compile; per-call checks; the CPU fallback; debug eager's wait) asks
// the overload's front end (csrc/python/eager.cc: torch_tpu/eager/kernel.py), which builds the plan
// that this entry then caches and runs. Python-free, so GoogleTests drive it with a C++ front end.
#pragma once

#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/core/stack.h>
#include <c10/util/FunctionRef.h>

#include <cstdint>
#include <memory>
#include <string>

#include "eager/call.h"
#include "eager/plan.h"
#include "eager/range_out.h"

namespace torch_tpu::eager {

class OpKernel;

// What an overload's front end decides on a call the plan cache could not run alone.
struct Built {
  bool returned = false;         // the front end computed the result and left it on the stack
  std::shared_ptr<Plan> store;   // the plan to cache under the call's key (null: none)
  std::shared_ptr<Plan> run;     // the plan to run now (when not `returned`); may be `store`
};

// An overload's front end (the Python kernel in torch_tpu; a test's own in the GoogleTests).
class FrontEnd {
 public:
  virtual ~FrontEnd() = default;
  // Runs the whole call itself: the arguments are on `stack` (schema order); leaves the results.
  virtual void call_whole(const OpKernel& k, torch::jit::Stack* stack) = 0;
  // A call that missed the plan cache, or whose cached plan cannot run alone (`cached`, or null).
  // `call` is described (key parts filled); the arguments stay on `stack` unless `returned`.
  virtual Built build(const OpKernel& k, torch::jit::Stack* stack, const Call& call,
                      const std::shared_ptr<Plan>& cached) = 0;
  // `cached` again from its entry (a plan fused eager recorded without a program may have one now).
  virtual std::shared_ptr<Plan> reread(const OpKernel& k, const Plan& cached) = 0;
  // Debug eager, after a run: waits for the device and raises what the run failed with, naming the op.
  virtual void debug_synchronize(const OpKernel& k, const Call& call) = 0;
  // Runs fn without the front end's interpreter lock where the caller holds it (fused recording may
  // flush, and a flush may build its program through the front end from the recorder's thread).
  // A function_ref: fused eager's hot path calls it per op, and std::function would allocate.
  virtual void unlocked(c10::function_ref<void()> fn) { fn(); }
};

// How an overload's calls are keyed and run (_C.eager.register_op_kernel's flags).
struct KernelOptions {
  Signature signature;
  bool has_check = false;               // a per-call check must run in the front end first
  bool whole_first = false;             // the front end runs the whole call first (`prepare`)
  bool whole_only_for_masks = false;    // ... only when a tensor list holds a mask or a CPU tensor
};

class OpKernel final : public c10::OperatorKernel {
 public:
  OpKernel(int64_t id, c10::OperatorHandle op, KernelOptions options, OpFacts facts,
           std::unique_ptr<FrontEnd> front_end);
  // The dispatcher's boxed call.
  void operator()(const c10::OperatorHandle&, c10::DispatchKeySet, torch::jit::Stack* stack) { run(stack, false); }
  // entered: called by the front end itself (after its `prepare`), not by the dispatcher.
  void run(torch::jit::Stack* stack, bool entered);

  int64_t id() const { return id_; }
  const c10::OperatorHandle& op() const { return op_; }
  const OpFacts& facts() const { return facts_; }
  const KernelOptions& options() const { return options_; }
  FrontEnd& front_end() const { return *front_end_; }

 private:
  void slow(torch::jit::Stack* stack, Call call, std::shared_ptr<Plan> plan);
  bool has_mask(c10::ArrayRef<c10::IValue> args) const;

  int64_t id_;
  c10::OperatorHandle op_;
  KernelOptions options_;
  OpFacts facts_;
  RangeOut range_out_;  // arange / linspace out=: sized before keying
  std::unique_ptr<FrontEnd> front_end_;
};

// Registers the tpu kernel of ns::name.overload (qualified "ns::name"; overload "" or "default" for
// the default one). options.signature.kinds: one ArgKind per schema argument. dispatch=false registers nothing
// with the dispatcher (the kernel is run by run_op_kernel only). Returns the kernel's id (its
// registration order in this process). Raises c10::Error for an unknown operator or a kinds count
// that is not the schema's.
int64_t register_op_kernel(const std::string& qualified, const std::string& overload, KernelOptions options,
                           bool dispatch, std::unique_ptr<FrontEnd> front_end);
// The kernel registered as `id`; raises std::out_of_range for an unknown id.
OpKernel& op_kernel(int64_t id);
// Runs kernel `id` on `stack` (its arguments, schema order), as the front end's own entry does.
void run_op_kernel(int64_t id, torch::jit::Stack* stack);

}  // namespace torch_tpu::eager
