// Launch values of ATen arguments and results, shared by eager op programs and compiled graphs:
// host values as launch arguments (runtime::LaunchArg) and fresh result tensors of a program's specs.
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/core/Scalar.h>
#include <c10/core/ScalarType.h>

#include <cstdint>
#include <utility>
#include <vector>

#include "runtime/runtime.h"

namespace torch_tpu::aten {

// A fresh result tensor: row-major, or with `strides` (a dense permutation, e.g. channels_last).
struct FreshSpec {
  std::vector<int64_t> sizes, strides;  // strides empty: row-major
  c10::ScalarType dtype = c10::ScalarType::Float;
};

// Launch arguments of host values: a CPU tensor (contiguous), a scalar of `dtype` (0-dim), an RNG
// (seed, offset) state (1-D of 2 uint64, uploaded by the launcher). Raises for a scalar dtype programs
// never take.
runtime::LaunchArg host_tensor_arg(const at::Tensor& t, int device);
// A new tpu tensor on `device` of a fresh result's spec (its buffer made by the program that writes it).
at::Tensor new_tensor_of(const FreshSpec& spec, int device);
runtime::LaunchArg scalar_arg(const c10::Scalar& v, c10::ScalarType dtype, int device);
runtime::LaunchArg rng_arg(std::pair<uint64_t, uint64_t> state);

}  // namespace torch_tpu::aten
