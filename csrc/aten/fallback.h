// Counters of the CPU fallback (cpu_fallback.cc), per op overload ("aten::name.overload").
#pragma once
#include <cstdint>
#include <map>
#include <string>

namespace torch_tpu::aten {
std::map<std::string, int64_t> fallback_counts();
void reset_fallback_counts();
}  // namespace torch_tpu::aten
