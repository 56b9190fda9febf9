// tpu random number generators. A generator is a (seed, offset) pair, as CUDA's Philox generator:
// each random op takes the pair as runtime operands of its program (stablehlo.rng_bit_generator
// keyed by them) and advances the offset, so numbers are generated on the device, reproducible
// under torch.manual_seed, and a new seed never recompiles anything.
#include <ATen/core/GeneratorForPrivateuseone.h>
#include <ATen/Utils.h>
#include <ATen/core/DistributionsHelper.h>
#include <c10/core/GeneratorImpl.h>
#include <c10/core/TensorImpl.h>
#include <ATen/Tensor.h>
#include <ATen/ops/empty.h>

#include <mutex>
#include <random>
#include <vector>

#include "aten/device.h"
#include "runtime/runtime.h"

namespace torch_tpu::aten {
namespace {

// Same default as PyTorch's CPU and CUDA generators (c10::detail::default_rng_seed_val).
constexpr uint64_t kDefaultSeed = 67280421310721ULL;

struct TpuGeneratorImpl final : c10::GeneratorImpl {
  explicit TpuGeneratorImpl(c10::DeviceIndex index)
      : c10::GeneratorImpl(c10::Device(c10::DeviceType::PrivateUse1, index),
                           c10::DispatchKeySet(c10::DispatchKey::PrivateUse1)) {}
  void set_current_seed(uint64_t seed) override { seed_ = seed, offset_ = 0; }
  void set_offset(uint64_t offset) override { offset_ = offset; }
  uint64_t get_offset() const override { return offset_; }
  uint64_t current_seed() const override { return seed_; }
  uint64_t seed() override {
    std::random_device rd;
    uint64_t s = (uint64_t(rd()) << 32) ^ rd();
    set_current_seed(s);
    return s;
  }
  // State: 16 bytes (uint8 CPU tensor): seed then offset, little-endian, as CUDA's generator.
  void set_state(const c10::TensorImpl& state) override {
    TORCH_CHECK(state.dtype() == caffe2::TypeMeta::Make<uint8_t>() && state.numel() == 16,
                "a tpu generator state is a uint8 tensor of 16 bytes, got ", state.numel(), " elements of ",
                state.dtype());
    const auto* p = static_cast<const uint8_t*>(state.data());
    std::memcpy(&seed_, p, 8);
    std::memcpy(&offset_, p + 8, 8);
  }
  c10::intrusive_ptr<c10::TensorImpl> get_state() const override {
    at::Tensor t = at::empty({16}, at::TensorOptions().dtype(at::kByte));
    auto* p = t.data_ptr<uint8_t>();
    std::memcpy(p, &seed_, 8);
    std::memcpy(p + 8, &offset_, 8);
    return t.getIntrusivePtr();
  }
  TpuGeneratorImpl* clone_impl() const override {
    auto* g = new TpuGeneratorImpl(device().index());
    g->seed_ = seed_, g->offset_ = offset_;
    return g;
  }
  static c10::DeviceType device_type() { return c10::DeviceType::PrivateUse1; }

  uint64_t seed_ = kDefaultSeed;
  uint64_t offset_ = 0;
};

std::mutex g_mu;
std::vector<at::Generator>& defaults() {
  static std::vector<at::Generator> g;
  return g;
}

}  // namespace

const at::Generator& default_generator(c10::DeviceIndex index) {
  index = index < 0 ? current_device() : own_device(index);
  std::lock_guard<std::mutex> lock(g_mu);
  auto& gens = defaults();
  if (gens.size() <= static_cast<size_t>(index)) {
    // Seeding must work before the runtime starts (torch.manual_seed at the top of a script),
    // so generators exist for any index; a bad index fails when a tensor is made there.
    gens.resize(index + 1);
  }
  if (!gens[index].defined()) gens[index] = at::make_generator<TpuGeneratorImpl>(index);
  return gens[index];
}

at::Generator new_generator(c10::DeviceIndex index) {
  return at::make_generator<TpuGeneratorImpl>(index < 0 ? current_device() : own_device(index));
}

std::pair<uint64_t, uint64_t> generator_next(const std::optional<at::Generator>& gen, uint64_t increment,
                                             c10::DeviceIndex device) {
  at::Generator g = gen.has_value() && gen->defined() ? *gen : default_generator(device);
  TORCH_CHECK(g.device().type() == c10::DeviceType::PrivateUse1,
              "expected a tpu generator for a tpu random op, got a generator of device ", g.device());
  std::lock_guard<std::mutex> lock(g.mutex());
  auto* impl = static_cast<TpuGeneratorImpl*>(g.unsafeGetGeneratorImpl());
  auto r = std::make_pair(impl->seed_, impl->offset_);
  impl->offset_ += increment;
  return r;
}

}  // namespace torch_tpu::aten
