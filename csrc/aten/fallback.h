// Counters of the CPU fallback (cpu_fallback.cc), per op overload ("aten::name.overload").
#pragma once
#include <cstdint>
#include <map>
#include <string>

namespace torch_tpu::aten {
// One use of the CPU fallback by op `full` ("aten::name.overload"): counted, warned the first time;
// throws NotImplementedError naming the op when TORCH_TPU_CPU_FALLBACK=0.
void note_fallback(const std::string& full);
std::map<std::string, int64_t> fallback_counts();
void reset_fallback_counts();
}  // namespace torch_tpu::aten
