#include "aten/launch_values.h"

#include <c10/util/Exception.h>

#include <cstring>

#include "aten/device.h"
#include "runtime/lru_cache.h"

namespace torch_tpu::aten {

using runtime::LaunchArg;
using runtime::Runtime;

// Host operands up to this size (step counts, scalars, small index tensors) are copied during the
// transfer call: no completion event to wait for.
constexpr size_t kSmallOperandBytes = 64 << 10;

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

}  // namespace torch_tpu::aten
