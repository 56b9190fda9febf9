#include "eager/op_kernel.h"

#include <torch/library.h>

#include <map>
#include <mutex>
#include <utility>
#include <vector>

#include "aten/fallback.h"
#include "eager/mode.h"

namespace torch_tpu::eager {

OpKernel::OpKernel(int64_t id, c10::OperatorHandle op, KernelOptions options, OpFacts facts,
                   std::unique_ptr<FrontEnd> front_end)
    : id_(id), op_(std::move(op)), options_(std::move(options)), facts_(std::move(facts)),
      range_out_(range_out_of(facts_.name)), front_end_(std::move(front_end)) {}

void OpKernel::run(torch::jit::Stack* stack, bool entered) {
  const Signature& sig = options_.signature;
  size_t n = sig.kinds.size();
  c10::ArrayRef<c10::IValue> args(stack->data() + stack->size() - n, n);
  size_range_out(range_out_, args);
  if (options_.whole_first && !entered && (!options_.whole_only_for_masks || has_mask(args)))
    return front_end_->call_whole(*this, stack);
  // Calls that always take the slow path (a per-call check, debug eager) are described for the front
  // end at once: their key is computed once. Others are walked without the parts the front end reads,
  // and a miss walks again with them (microseconds, before a lowering and compile of milliseconds).
  const Mode m = mode();
  Call call;
  describe_call(id_, sig, facts_.name, args, options_.has_check || m == Mode::kDebug, call);
  std::shared_ptr<Plan> plan = call.cacheable ? plan_cache().find(call.key) : nullptr;
  if (plan && plan->host) return aten::run_on_cpu(op_, stack);
  if (plan && plan->fast) {
    if (m == Mode::kStrict && plan->exe) {
      run_plan(plan, facts_, call, stack, false);
      plan_fast_runs()++;
      return;
    }
    if (m == Mode::kFused) {
      front_end_->unlocked([&] { run_plan(plan, facts_, call, stack, true); });
      plan_fast_runs()++;
      return;
    }
  }
  slow(stack, std::move(call), std::move(plan));
}

// The one run of an op's program outside the fast path (the fast path runs the same run_plan):
// strict queues it, debug queues it and waits (a failure names the op), fused records it.
void OpKernel::slow(torch::jit::Stack* stack, Call call, std::shared_ptr<Plan> plan) {
  if (!call.described) {
    size_t n = options_.signature.kinds.size();
    call = Call();
    describe_call(id_, options_.signature, facts_.name,
                  c10::ArrayRef<c10::IValue>(stack->data() + stack->size() - n, n), true, call);
  }
  Built built = front_end_->build(*this, stack, call, plan);
  if (call.cacheable && built.store) {
    plan_cache().put(call.key, built.store, plan_bytes(*built.store));
  } else if (call.cacheable && plan && plan->fast && !plan->exe) {
    auto again = front_end_->reread(*this, *plan);  // recorded by fused eager, compiled since
    if (again && again->exe) plan_cache().put(call.key, again, plan_bytes(*again));
  }
  if (built.returned) return;
  if (built.run && built.run->host) return aten::run_on_cpu(op_, stack);
  auto m = mode();
  TORCH_CHECK(built.run && (m == Mode::kFused || built.run->exe), facts_.name,
              ": the tpu kernel returned an entry with no executable to run");
  if (m == Mode::kFused) {
    front_end_->unlocked([&] { run_plan(built.run, facts_, call, stack, true); });
    return;
  }
  run_plan(built.run, facts_, call, stack, false);
  if (m == Mode::kDebug) front_end_->debug_synchronize(*this, call);
}

// A bool/uint8 mask or a CPU tensor in a tensor-list argument (what advanced indexing's `prepare`
// rewrites).
bool OpKernel::has_mask(c10::ArrayRef<c10::IValue> args) const {
  for (size_t i = 0; i < args.size(); ++i) {
    if (static_cast<ArgKind>(options_.signature.kinds[i]) != ArgKind::kTensorList) continue;
    for (const auto& e : args[i].toListRef()) {
      if (!e.isTensor() || !e.toTensor().defined()) continue;
      const auto& t = e.toTensor();
      if (t.is_cpu() || t.scalar_type() == c10::ScalarType::Bool || t.scalar_type() == c10::ScalarType::Byte)
        return true;
    }
  }
  return false;
}

namespace {

std::mutex g_mu;
std::vector<OpKernel*> g_kernels;                        // owned by the dispatcher's registrations
std::vector<std::unique_ptr<OpKernel>> g_undispatched;  // kernels run by run_op_kernel only

// The PrivateUse1 IMPL library of an operator namespace ("aten", or a custom kernel's); caller holds g_mu.
torch::Library& library(const std::string& ns) {
  static auto* libs = new std::map<std::string, std::unique_ptr<torch::Library>>();
  auto& lib = (*libs)[ns];
  if (!lib) lib = std::make_unique<torch::Library>(torch::Library::IMPL, ns, c10::DispatchKey::PrivateUse1, __FILE__, __LINE__);
  return *lib;
}

}  // namespace

int64_t register_op_kernel(const std::string& qualified, const std::string& overload, KernelOptions options,
                           bool dispatch, std::unique_ptr<FrontEnd> front_end) {
  auto sep = qualified.find("::");
  TORCH_CHECK(sep != std::string::npos, "register_op_kernel: expected a qualified name (ns::op), got ", qualified);
  const std::string ns = qualified.substr(0, sep), name = qualified.substr(sep + 2);
  const bool is_default = overload.empty() || overload == "default";
  auto op = c10::Dispatcher::singleton().findSchemaOrThrow(qualified.c_str(), is_default ? "" : overload.c_str());
  const auto& schema = op.schema();
  TORCH_CHECK(options.signature.kinds.size() == schema.arguments().size(), qualified, ": ",
              options.signature.kinds.size(), " argument kinds for ", schema.arguments().size(), " arguments");
  OpFacts facts;
  for (size_t i = 0; i < schema.arguments().size(); ++i) {
    const auto* alias = schema.arguments()[i].alias_info();
    if (alias && alias->isWrite()) facts.written.push_back(static_cast<int>(i));
  }
  facts.num_returns = schema.returns().size();
  facts.name = qualified + (is_default ? "" : "." + overload);
  std::lock_guard<std::mutex> g(g_mu);
  int64_t id = static_cast<int64_t>(g_kernels.size());
  auto kernel = std::make_unique<OpKernel>(id, op, std::move(options), std::move(facts), std::move(front_end));
  g_kernels.push_back(kernel.get());
  if (!dispatch) {
    g_undispatched.push_back(std::move(kernel));
    return id;
  }
  library(ns).impl((name + (is_default ? "" : "." + overload)).c_str(),
                   torch::CppFunction::makeFromBoxedFunctor(std::move(kernel)));
  return id;
}

OpKernel& op_kernel(int64_t id) {
  std::lock_guard<std::mutex> g(g_mu);
  return *g_kernels.at(id);
}

void run_op_kernel(int64_t id, torch::jit::Stack* stack) { op_kernel(id).run(stack, true); }

}  // namespace torch_tpu::eager
