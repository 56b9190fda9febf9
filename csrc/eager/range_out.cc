#include "eager/range_out.h"

#include <ATen/Dispatch.h>
#include <ATen/core/Tensor.h>
#include <ATen/native/RangeUtils.h>
#include <c10/util/Exception.h>

namespace torch_tpu::eager {

RangeOut range_out_of(const std::string& overload) {
  if (overload == "aten::arange.start_out") return RangeOut::kArange;
  if (overload == "aten::linspace.out") return RangeOut::kLinspace;
  return RangeOut::kNone;
}

void size_range_out(RangeOut kind, c10::ArrayRef<c10::IValue> args) {
  if (kind == RangeOut::kNone || args.size() != 4 || !args[3].isTensor()) return;
  const at::Tensor& out = args[3].toTensor();
  if (!out.defined()) return;
  int64_t size = 0;
  if (kind == RangeOut::kArange) {
    auto dt = out.scalar_type();
    if (!(c10::isIntegralType(dt, /*includeBool=*/false) || dt == c10::kFloat || dt == c10::kDouble ||
          dt == c10::kHalf || dt == c10::kBFloat16))
      return;
    const c10::Scalar start = args[0].toScalar(), end = args[1].toScalar(), step = args[2].toScalar();
    // PyTorch's own size rule and argument checks (ATen/native/RangeUtils.h).
    AT_DISPATCH_ALL_TYPES_AND2(c10::kHalf, c10::kBFloat16, dt, "arange_tpu",
                               [&]() { size = at::native::compute_arange_size<scalar_t>(start, end, step); });
    if (out.numel() != size && out.numel() > 0)
      TORCH_WARN("The number of elements in the out tensor of shape ", out.sizes(), " is ", out.numel(),
                 " which does not match the computed number of elements ", size,
                 ". Note that this may occur as a result of rounding error. "
                 "The out tensor will be resized to a tensor of shape (",
                 size, ",).");
  } else {
    size = args[2].toInt();
    TORCH_CHECK(size >= 0, "number of steps must be non-negative");
  }
  if (out.numel() != size) out.resize_({size});
}

}  // namespace torch_tpu::eager
