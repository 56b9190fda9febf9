// scaled_dot_product_attention's backend choice for tpu tensors (ATen's _fused_sdp_choice_stub,
// the hook PyTorch gives PrivateUse1 backends; OpenReg registers one the same way).
//
// tpu answers SDPBackend::overrideable wherever its fused lowering applies
// (torch_tpu/lowering/attention.py: _scaled_dot_product_fused_attention_overrideable and its
// backward): the attention probabilities are never saved for backward, only the output and the
// row log-sum-exp (B, H, L) float32, and the backward recomputes them. The math composite saves
// the (B, H, L, S) scores, probabilities and dropout mask of every layer: for GPT-2 small at
// 8 x 1024 tokens that is 10 GB of a 16 GB v5e. Everything else takes PyTorch's math composite,
// whose errors are CPU's: inputs other than 3-D or 4-D, batch or head counts that differ (unless
// enable_gqa and the query heads are a multiple of the key heads), empty inputs, non-float dtypes,
// masks of other dtypes.
// torch.nn.attention.sdpa_kernel chooses as on CUDA: OVERRIDEABLE off means math; both off is
// PyTorch's "no available kernel" error.
#include <ATen/Context.h>
#include <ATen/SDPBackend.h>
#include <ATen/core/Tensor.h>
#include <ATen/native/DispatchStub.h>
#include <ATen/native/transformers/attention.h>
#include <torch/library.h>

namespace torch_tpu::aten {
namespace {

// Reads sizes as SymInts: under torch.compile with dynamic shapes (PyTorch's default dynamic=None
// makes a length symbolic at its first recompile) the inputs are fake tensors with symbolic sizes,
// whose numel() and size() throw; comparing SymInts guards on the answer, as Dynamo expects.
bool fused_applies(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                   const std::optional<at::Tensor>& mask, bool enable_gqa) {
  const int64_t d = q.dim();
  if ((d != 3 && d != 4) || k.dim() != d || v.dim() != d) return false;
  if (q.is_nested() || k.is_nested() || v.is_nested()) return false;
  if (!q.is_floating_point() || q.scalar_type() != k.scalar_type() || q.scalar_type() != v.scalar_type())
    return false;
  if (q.sym_numel() == 0 || k.sym_numel() == 0 || v.sym_numel() == 0) return false;
  if (d == 4 && (k.sym_size(0) != q.sym_size(0) || v.sym_size(0) != q.sym_size(0))) return false;
  const c10::SymInt hq = q.sym_size(-3), hk = k.sym_size(-3);
  if (v.sym_size(-3) != hk || k.sym_size(-2) != v.sym_size(-2) || q.sym_size(-1) != k.sym_size(-1)) return false;
  if (hq != hk && !(enable_gqa && hq % hk == 0)) return false;
  if (mask.has_value() && mask->defined()) {
    // an additive bias or a bool mask (which scaled_dot_product_attention converts to a bias before
    // it calls the fused op) that broadcasts to (B, H, L, S)
    if (mask->dim() > 4 || !(mask->is_floating_point() || mask->scalar_type() == at::kBool)) return false;
    const std::vector<c10::SymInt> full = d == 4
        ? std::vector<c10::SymInt>{q.sym_size(0), hq, q.sym_size(-2), k.sym_size(-2)}
        : std::vector<c10::SymInt>{hq, q.sym_size(-2), k.sym_size(-2)};
    const int64_t off = static_cast<int64_t>(full.size()) - mask->dim();
    if (off < 0) return false;
    for (int64_t i = 0; i < mask->dim(); ++i)
      if (mask->sym_size(i) != 1 && mask->sym_size(i) != full[off + i]) return false;
  }
  return true;
}

int64_t tpu_fused_sdp_choice(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                             const std::optional<at::Tensor>& mask, double /*dropout_p*/,
                             bool /*is_causal*/, std::optional<double> /*scale*/, bool enable_gqa) {
  auto& ctx = at::globalContext();
  if (ctx.userEnabledOverrideableSDP() && fused_applies(q, k, v, mask, enable_gqa))
    return static_cast<int64_t>(at::SDPBackend::overrideable);
  if (ctx.userEnabledMathSDP()) return static_cast<int64_t>(at::SDPBackend::math);
  TORCH_CHECK(false, "No available kernel for scaled_dot_product_attention on tpu: the fused (OVERRIDEABLE) "
              "kernel ", ctx.userEnabledOverrideableSDP() ? "does not apply to these inputs" : "is disabled",
              " and the MATH kernel is disabled. Enable SDPBackend.MATH in torch.nn.attention.sdpa_kernel.");
}

}  // namespace

// The op itself (torch.ops.aten._fused_sdp_choice), which PyTorch dispatches by key, gives the
// same answer as the stub that scaled_dot_product_attention calls directly.
TORCH_LIBRARY_IMPL(aten, PrivateUse1, m) { m.impl("_fused_sdp_choice", &tpu_fused_sdp_choice); }

}  // namespace torch_tpu::aten

namespace at::native {
REGISTER_PRIVATEUSE1_DISPATCH(_fused_sdp_choice_stub, &torch_tpu::aten::tpu_fused_sdp_choice)
}  // namespace at::native
