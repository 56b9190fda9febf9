#include "eager/plan.h"

#include <c10/util/Exception.h>

#include "aten/device.h"
#include "eager/fused.h"
#include "runtime/trace.h"

namespace torch_tpu::eager {

using runtime::Cell;
using runtime::LaunchArg;
using runtime::Runtime;

size_t KeyHash::operator()(const std::vector<int64_t>& k) const noexcept {
  uint64_t h = 1469598103934665603ull;  // FNV-1a over the words
  for (int64_t w : k) {
    h ^= static_cast<uint64_t>(w);
    h *= 1099511628211ull;
    h ^= h >> 29;
  }
  return static_cast<size_t>(h);
}

PlanCache& plan_cache() {
  // never destroyed: plans hold Python objects
  static auto* cache = new PlanCache("plans", kPlanCacheEntries, runtime::kProgramCacheBytes);
  return *cache;
}

int64_t plan_bytes(const Plan& plan) {
  // A plan without its executable yet (fused eager builds it later) holds its entry's program text.
  return plan.exe ? runtime::program_bytes(*plan.exe) : 4096;
}

std::atomic<int64_t>& plan_fast_runs() {
  static std::atomic<int64_t> n{0};
  return n;
}


namespace {

// A profiled execution's device row is named by its program, as CUDA's device rows name the kernel
// and not the op: the op and the operands the program was compiled for, in its argument order
// ("aten::mm<Float[128,64],Float[64,10]>"; a storage appears once, by the first view the op passed).
std::string program_name(const Plan& plan, const OpFacts& op, const Call& call) {
  std::string s = op.name + "<";
  for (size_t k = 0; k < plan.order.size(); ++k) {
    const Operand& o = call.operands[plan.order[k]];
    if (k) s += ",";
    switch (o.kind) {
      case Operand::kCell:
      case Operand::kHostTensor:
        if (o.kind == Operand::kHostTensor) s += "cpu ";
        s += c10::toString(o.tensor.scalar_type());
        s += "[";
        for (int64_t d = 0; d < o.tensor.dim(); ++d) s += (d ? "," : "") + std::to_string(o.tensor.size(d));
        s += "]";
        break;
      case Operand::kScalar: s += c10::toString(o.dtype); break;
      case Operand::kGenerator: s += "Generator"; break;
    }
  }
  return s + ">";
}

}  // namespace

void run_plan(const std::shared_ptr<Plan>& plan_ptr, const OpFacts& op, Call& call, torch::jit::Stack* stack,
              bool fused) {
  const Plan& plan = *plan_ptr;
  std::vector<LaunchArg> args;
  std::vector<at::Tensor> cell_tensors;
  args.reserve(plan.order.size());
  for (int pos : plan.order) {
    Operand& o = call.operands[pos];
    switch (o.kind) {
      case Operand::kCell:
        args.push_back({o.cell, nullptr});
        if (fused) cell_tensors.push_back(o.tensor);
        break;
      case Operand::kHostTensor: args.push_back(host_tensor_arg(o.tensor, call.device)); break;
      case Operand::kScalar: args.push_back(scalar_arg(o.value, o.dtype, call.device)); break;
      case Operand::kGenerator:
        args.push_back(rng_arg(aten::generator_next(o.generator, plan.rng_draws, call.device)));
        break;
    }
  }
  std::vector<at::Tensor> fresh;
  fresh.reserve(plan.fresh.size());
  for (const auto& s : plan.fresh)
    fresh.push_back(new_tensor_of(s, call.device));
  if (fused) {
    std::vector<at::Tensor> sinks;
    sinks.reserve(plan.sinks.size());
    for (auto [is_new, i] : plan.sinks) sinks.push_back(is_new ? fresh[i] : call.operands[i].tensor);
    eager::fused().record(plan_ptr, std::move(args), std::move(cell_tensors), std::move(sinks), call.device);
  } else {
    std::vector<Cell*> sinks;
    sinks.reserve(plan.sinks.size());
    for (auto [is_new, i] : plan.sinks) sinks.push_back(is_new ? aten::cell_of(fresh[i]) : call.operands[i].cell);
    std::string trace_name = runtime::trace::recording() ? program_name(plan, op, call) : std::string();
    Runtime::get().execute(plan.exe, std::move(args), std::move(sinks), call.device, op.name, std::move(trace_name));
  }
  if (plan.structure == Plan::kWritten) {
    std::vector<c10::IValue> outs;
    for (size_t k = 0; k < op.num_returns && k < op.written.size(); ++k)
      outs.push_back((*stack)[stack->size() - call.arg_count + op.written[k]]);
    torch::jit::drop(*stack, call.arg_count);
    for (auto& v : outs) stack->push_back(std::move(v));
    return;
  }
  torch::jit::drop(*stack, call.arg_count);
  if (plan.structure == Plan::kList) {  // a Tensor[] result: every element computed
    stack->push_back(c10::IValue(c10::List<at::Tensor>(std::move(fresh))));
    return;
  }
  size_t next = 0;
  for (size_t i = 0; i < fresh.size() + plan.fixed.size(); ++i) {
    const c10::IValue* value = nullptr;
    for (const auto& f : plan.fixed)
      if (f.first == static_cast<int>(i)) value = &f.second;
    stack->push_back(value != nullptr ? *value : c10::IValue(std::move(fresh[next++])));
  }
}

}  // namespace torch_tpu::eager
