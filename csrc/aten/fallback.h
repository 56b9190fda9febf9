// The CPU fallback (cpu_fallback.cc) and its counters, per op overload ("aten::name.overload").
#pragma once
#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/core/stack.h>

#include <cstdint>
#include <map>
#include <string>

namespace torch_tpu::aten {
// One use of the CPU fallback by op `full` ("aten::name.overload"): counted, warned the first time;
// throws NotImplementedError naming the op when TORCH_TPU_CPU_FALLBACK=0.
void note_fallback(const std::string& full);
std::map<std::string, int64_t> fallback_counts();
// Runs `op` on PyTorch's CPU kernel: the arguments on `stack` (schema order) are copied to host, the
// results come back to the device and written tpu arguments are updated (at::native::cpu_fallback),
// after note_fallback. The one CPU fallback: ops with no lowering (the PrivateUse1 boxed fallback)
// and calls a lowering refuses (eager's host plans, csrc/eager/plan.h) both run it.
void run_on_cpu(const c10::OperatorHandle& op, torch::jit::Stack* stack);
void reset_fallback_counts();
}  // namespace torch_tpu::aten
