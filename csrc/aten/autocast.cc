// Autocast on tpu tensors (torch.autocast("tpu", dtype=...)): the AutocastPrivateUse1 kernels of
// the ops CUDA's autocast handles, with CUDA's policies. PyTorch publishes those op lists in
// ATen/autocast_mode.h (AT_FORALL_LOWER_PRECISION_FP, AT_FORALL_FP32, ...) for other backends to
// reuse, and its WrapFunction templates do the casting; the lower precision dtype is the autocast
// region's (bfloat16 by default on tpu, float16 allowed). Every other op falls through: without
// that fallback no op at all could run inside torch.autocast("tpu").
//
// One op leaves CUDA's policy: cross_entropy_loss runs in float32, as CPU's autocast and PyTorch/XLA's
// TPU autocast run it. Under CUDA's lists it calls log_softmax with an explicit dtype (the logits'),
// which fp32_set_opt_dtype leaves alone, so a bfloat16 model's loss came out float32 with bfloat16's
// rounding (4.8125 where CPU gives 4.8127): the loss a training loop logs and clips on.
#include <ATen/Operators.h>
#include <ATen/autocast_mode.h>
#include <torch/library.h>

namespace torch_tpu::aten {
namespace {

// The op lists spell ATen's types unqualified, as autocast_mode.cpp sees them.
using at::IntArrayRef;
using at::Scalar;
using at::ScalarType;
using at::Tensor;

#define ADD_NS(RAW_OP) at::RAW_OP
#define TPU_LOWER_PRECISION_FP(...) KERNEL_PRIVATEUSEONE(__VA_ARGS__, lower_precision_fp)
#define TPU_FP32(...) KERNEL_PRIVATEUSEONE(__VA_ARGS__, fp32)
#define TPU_FP32_SET_OPT_DTYPE(...) KERNEL_PRIVATEUSEONE(__VA_ARGS__, fp32_set_opt_dtype)
#define TPU_PROMOTE(...) KERNEL_PRIVATEUSEONE(__VA_ARGS__, promote)

TORCH_LIBRARY_IMPL(aten, AutocastPrivateUse1, m) {
  AT_FORALL_LOWER_PRECISION_FP(TPU_LOWER_PRECISION_FP)
  AT_FORALL_FP32(TPU_FP32)
  AT_FORALL_FP32_SET_OPT_DTYPE(TPU_FP32_SET_OPT_DTYPE)
  AT_FORALL_DIFFERENT_REDISPATCH_SIGNATURE(KERNEL_DIFFERENT_REDISPATCH_SIGNATURE_PRIVATEUSEONE)
  AT_FORALL_PROMOTE(TPU_PROMOTE)
  TPU_FP32(cross_entropy_loss)
}

TORCH_LIBRARY_IMPL(_, AutocastPrivateUse1, m) { m.fallback(torch::CppFunction::makeFallthrough()); }

}  // namespace
}  // namespace torch_tpu::aten
