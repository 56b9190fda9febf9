// Step 3 of the fallback chain: an op with no lowering and no decomposition runs on PyTorch's CPU
// kernel (at::native::cpu_fallback copies the tpu inputs to host and the results back). Each use
// is counted per op overload (torch_tpu.metrics), warned once per op, and refused with a
// NotImplementedError naming the op when TORCH_TPU_CPU_FALLBACK=0.
#include <ATen/native/CPUFallback.h>
#include <c10/util/Exception.h>
#include <torch/library.h>

#include <cstdlib>
#include <map>
#include <mutex>
#include <string>

#include "aten/fallback.h"
#include "runtime/settings.h"

namespace torch_tpu::aten {
namespace {

std::mutex g_mu;
std::map<std::string, int64_t> g_counts;

bool fallback_enabled() {
  return settings::enabled("TORCH_TPU_CPU_FALLBACK");
}

TORCH_LIBRARY_IMPL(_, PrivateUse1, m) {
  m.fallback(torch::CppFunction::makeFromBoxedFunction<&run_on_cpu>());
}

}  // namespace

void run_on_cpu(const c10::OperatorHandle& op, torch::jit::Stack* stack) {
  const auto& name = op.schema().operator_name();
  note_fallback(name.name + (name.overload_name.empty() ? "" : "." + name.overload_name));
  at::native::cpu_fallback(op, stack);
}

void note_fallback(const std::string& full) {
  TORCH_CHECK_NOT_IMPLEMENTED(fallback_enabled(), "The operator '", full,
                              "' has no tpu lowering, and the CPU fallback is disabled "
                              "(TORCH_TPU_CPU_FALLBACK=0). Unset TORCH_TPU_CPU_FALLBACK to run it on "
                              "the CPU, or file an issue asking for a lowering of this op.");
  bool first;
  {
    std::lock_guard<std::mutex> g(g_mu);
    first = g_counts[full]++ == 0;
  }
  if (first) {
    TORCH_WARN("The operator '", full, "' has no tpu lowering; it runs on the CPU (copying its "
               "inputs to host and results back), which is slow. Counted in "
               "torch_tpu.metrics.fallback_counts(); TORCH_TPU_CPU_FALLBACK=0 makes it an error.");
  }
}

std::map<std::string, int64_t> fallback_counts() {
  std::lock_guard<std::mutex> g(g_mu);
  return g_counts;
}

void reset_fallback_counts() {
  std::lock_guard<std::mutex> g(g_mu);
  g_counts.clear();
}

}  // namespace torch_tpu::aten
