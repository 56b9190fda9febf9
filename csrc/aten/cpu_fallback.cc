// Step 3 of the fallback chain: an op with no lowering and no decomposition runs on PyTorch's CPU
// kernel (at::native::cpu_fallback copies the tpu inputs to host and the results back). Each use
// is counted per op overload (torch_tpu.metrics), warned once per op, and refused with a
// NotImplementedError naming the op when TORCH_TPU_CPU_FALLBACK=0.
#include <ATen/CPUGeneratorImpl.h>
#include <ATen/native/CPUFallback.h>
#include <c10/util/Exception.h>
#include <torch/library.h>

#include <cstdlib>
#include <map>
#include <mutex>
#include <string>

#include "aten/device.h"
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

namespace {
// A random op on the CPU fallback (poisson, binomial, _standard_gamma, _sample_dirichlet: Gamma,
// Beta, Dirichlet, StudentT sampling) draws from a CPU generator seeded from the tpu generator it
// was given, or from its device's default one: torch.tpu's seed and RNG state then govern it, as
// they govern the lowered random ops, and a tpu generator passed in is accepted (CPU's kernel
// refused it: "Expected a 'cpu' device type for generator but found 'tpu'").
void tpu_generators_to_cpu(const c10::OperatorHandle& op, torch::jit::Stack* stack) {
  const auto& args = op.schema().arguments();
  const size_t first = stack->size() - args.size();
  c10::DeviceIndex device = -1;
  for (size_t i = 0; i < args.size() && device < 0; ++i) {
    const c10::IValue& v = (*stack)[first + i];
    if (v.isTensor() && v.toTensor().defined() && v.toTensor().device().type() == c10::DeviceType::PrivateUse1)
      device = v.toTensor().device().index();
  }
  for (size_t i = 0; i < args.size(); ++i) {
    const auto& type = args[i].real_type();
    auto opt = type->cast<c10::OptionalType>();
    if (type->kind() != c10::TypeKind::GeneratorType &&
        !(opt && opt->getElementType()->kind() == c10::TypeKind::GeneratorType))
      continue;
    c10::IValue& v = (*stack)[first + i];
    std::optional<at::Generator> gen;
    if (!v.isNone()) {
      gen = v.toGenerator();
      if (gen->device().type() != c10::DeviceType::PrivateUse1) continue;  // a CPU generator: CPU's own
      device = gen->device().index();
    }
    auto [seed, offset] = generator_next(gen, 1, device);
    uint64_t mixed = seed * 0x9E3779B97F4A7C15ull ^ (offset + 0x632BE59BD9B4E019ull);
    mixed ^= mixed >> 29;
    v = c10::IValue(at::make_generator<at::CPUGeneratorImpl>(mixed));
  }
}
}  // namespace

void run_on_cpu(const c10::OperatorHandle& op, torch::jit::Stack* stack) {
  const auto& name = op.schema().operator_name();
  note_fallback(name.name + (name.overload_name.empty() ? "" : "." + name.overload_name));
  tpu_generators_to_cpu(op, stack);
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
