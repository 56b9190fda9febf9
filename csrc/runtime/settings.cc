#include "runtime/settings.h"

#include <c10/util/Exception.h>

#include <cstdlib>
#include <cstring>

namespace torch_tpu::settings {

std::optional<std::string> get(const char* name) {
  for (const auto& s : kCppSettings) {
    if (std::strcmp(s.name, name) != 0) continue;
    if (const char* v = std::getenv(name)) return std::string(v);
    if (s.default_value) return std::string(s.default_value);
    return std::nullopt;
  }
  TORCH_CHECK(false, "torch_tpu internal error: ", name, " is not declared in csrc/runtime/settings.h");
}

bool enabled(const char* name) { return get(name).value_or("1") != "0"; }

int64_t integer(const char* name) {
  std::string v = get(name).value_or("");
  if (v.empty()) {  // set but empty: as unset
    for (const auto& s : kCppSettings)
      if (std::strcmp(s.name, name) == 0 && s.default_value) v = s.default_value;
  }
  char* end = nullptr;
  long long n = v.empty() ? -1 : std::strtoll(v.c_str(), &end, 10);
  TORCH_CHECK(n >= 0 && end && *end == '\0', name, "=", v, ": expected a non-negative integer");
  return static_cast<int64_t>(n);
}

}  // namespace torch_tpu::settings
