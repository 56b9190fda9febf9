// The out= size of ATen's range factories, as CPU's kernels give it (aten/src/ATen/native/
// RangeFactories.cpp): arange_out and linspace_out resize `out` to the element count they compute
// unless it already holds that many elements (then its shape stays: arange(4, out=empty(2, 2)) is
// [[0, 1], [2, 3]]); arange warns first when a non-empty `out` is resized. Done in C++ before the
// call is keyed, so a plan serves every start/end/step of one size without Python (a decode loop's
// cache_position = arange(past, past + 1) every token).
#pragma once

#include <ATen/core/ivalue.h>
#include <c10/util/ArrayRef.h>

#include <string>

namespace torch_tpu::eager {

// The range factories sized here (their lowerings write `out` as a flat sequence in its shape).
enum class RangeOut : char { kNone, kArange, kLinspace };

// kArange for "aten::arange.start_out", kLinspace for "aten::linspace.out", else kNone.
RangeOut range_out_of(const std::string& overload);

// Resizes the out= tensor of a call's arguments `args` (schema order) as CPU would; raises CPU's
// errors for bad arguments ("step must be nonzero", "number of steps must be non-negative", ...).
// Leaves dtypes CPU's kernel does not support to the op's own error.
void size_range_out(RangeOut kind, c10::ArrayRef<c10::IValue> args);

}  // namespace torch_tpu::eager
