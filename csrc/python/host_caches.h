// Binds the runtime's one cache policy (runtime/lru_cache.h) on torch_tpu._C: every cache's
// counters, and the LRU map itself for Python's caches (torch.compile's per-shape programs).
#pragma once

#include <torch/csrc/utils/pybind.h>

namespace torch_tpu::python {
void bind_host_caches(pybind11::module& m);
}
