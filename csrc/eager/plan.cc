#include "eager/plan.h"

#include <c10/util/Exception.h>

#include <complex>
#include <cstring>
#include <mutex>
#include <unordered_map>

#include "aten/device.h"
#include "eager/fused.h"
#include "runtime/trace.h"

namespace torch_tpu::eager {

using runtime::Cell;
using runtime::LaunchArg;
using runtime::Runtime;

// Host operands up to this size (step counts, scalars, small index tensors) are copied during the
// transfer call: no completion event to wait for.
constexpr size_t kSmallOperandBytes = 64 << 10;

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

// Scalar operands by value: a program's constants (learning rates, epsilons, the 0.5 of x + 0.5)
// recur every step, and a buffer made once for a value serves every launch (programs never write
// operand buffers), so the host-to-device transfer is paid once per value, not per op.
class ScalarBuffers {
 public:
  std::shared_ptr<pjrt::Buffer> get(PJRT_Buffer_Type type, const unsigned char* bytes, size_t n,
                                    const std::vector<int64_t>& dims, int device) {
    Key k{};
    k.type = static_cast<int>(type);
    k.device = device;
    k.ndims = static_cast<int>(dims.size());
    std::memcpy(k.bytes, bytes, n);
    if (auto hit = cache_.find(k)) return hit;
    auto buf = Runtime::get().client().small_buffer_from_host(bytes, type, dims, device);
    runtime::counters().h2d_transfers++;
    cache_.put(k, buf, static_cast<int64_t>(n));
    return buf;
  }

 private:
  struct Key {
    int type, device, ndims;
    unsigned char bytes[16];
    bool operator==(const Key& o) const {
      return type == o.type && device == o.device && ndims == o.ndims && std::memcmp(bytes, o.bytes, 16) == 0;
    }
  };
  struct Hash {
    size_t operator()(const Key& k) const noexcept {
      uint64_t a, b;
      std::memcpy(&a, k.bytes, 8);
      std::memcpy(&b, k.bytes + 8, 8);
      return std::hash<uint64_t>()(a * 31 + b) ^ (static_cast<size_t>(k.type) << 8) ^ k.device ^ (k.ndims << 16);
    }
  };
  // Bounded by entries (4096 buffers of at most 16 bytes: the bytes never bind).
  runtime::LruCache<Key, std::shared_ptr<pjrt::Buffer>, Hash> cache_{"scalar operand buffers", 4096};
};

ScalarBuffers& scalar_buffers() {
  static auto* b = new ScalarBuffers();  // never destroyed: buffers must not outlive the client's teardown order
  return *b;
}

}  // namespace

at::Tensor new_tensor_of(const FreshSpec& spec, int device) {
  return aten::new_tpu_tensor(spec.sizes, spec.dtype, device, spec.strides.empty() ? nullptr : &spec.strides);
}

LaunchArg host_tensor_arg(const at::Tensor& t, int device) {
  if (t.dim() == 0 && t.is_cpu() && t.element_size() <= 16) {  // a wrapped number or 0-dim operand
    alignas(16) unsigned char bytes[16] = {0};
    std::memcpy(bytes, t.const_data_ptr(), t.element_size());
    return {nullptr, scalar_buffers().get(runtime::to_pjrt_type(t.scalar_type()), bytes, 16, {}, device)};
  }
  at::Tensor c = t.contiguous();
  std::vector<int64_t> dims(c.sizes().begin(), c.sizes().end());
  runtime::counters().h2d_transfers++;
  auto type = runtime::to_pjrt_type(c.scalar_type());
  auto& client = Runtime::get().client();
  if (c.nbytes() <= kSmallOperandBytes) return {nullptr, client.small_buffer_from_host(c.data_ptr(), type, dims, device)};
  return {nullptr, client.buffer_from_host(c.data_ptr(), type, dims, device)};
}

LaunchArg scalar_arg(const c10::Scalar& v, c10::ScalarType dtype, int device) {
  alignas(16) unsigned char bytes[16] = {0};
  switch (dtype) {
    case c10::ScalarType::Bool: { bool x = v.toBool(); std::memcpy(bytes, &x, 1); break; }
    case c10::ScalarType::Long: { int64_t x = v.toLong(); std::memcpy(bytes, &x, 8); break; }
    case c10::ScalarType::Float: { float x = static_cast<float>(v.toDouble()); std::memcpy(bytes, &x, 4); break; }
    case c10::ScalarType::Double: { double x = v.toDouble(); std::memcpy(bytes, &x, 8); break; }
    case c10::ScalarType::ComplexFloat: {
      auto c = v.toComplexDouble();
      float x[2] = {static_cast<float>(c.real()), static_cast<float>(c.imag())};
      std::memcpy(bytes, x, 8);
      break;
    }
    case c10::ScalarType::ComplexDouble: { auto c = v.toComplexDouble(); std::memcpy(bytes, &c, 16); break; }
    default: TORCH_CHECK(false, "unsupported scalar operand dtype ", dtype);
  }
  return {nullptr, scalar_buffers().get(runtime::to_pjrt_type(dtype), bytes, 16, {}, device)};
}

LaunchArg rng_arg(std::pair<uint64_t, uint64_t> state) {
  LaunchArg a;
  a.words = true;  // uploaded by the launcher (Runtime::arg_buffer): no transfer on the caller's thread
  a.value = {state.first, state.second};
  return a;
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
        args.push_back(rng_arg(aten::generator_next(o.generator, plan.rng_draws)));
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
