// The environment variables the C++ core reads, with their defaults: the C++ half of the one settings
// table (torch_tpu/settings.py declares every variable, these with read_by="C++"; tests/test_settings.py
// checks that the two agree, name for name and default for default). Read through get() only.
// Variables of other tools (torchrun's RANK, LOCAL_RANK, MASTER_ADDR...) keep getenv.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace torch_tpu::settings {

struct CppSetting {
  const char* name;
  const char* default_value;  // nullptr: no value when unset (the reader decides)
};

inline constexpr CppSetting kCppSettings[] = {
    {"TORCH_TPU_PLUGIN_LOGS", nullptr},
    {"TORCH_TPU_CPU_FALLBACK", "1"},
    {"TORCH_TPU_ASYNC_LAUNCH", "1"},
    // 256 KiB, measured on the CPU plugin (2 cores): an in-place add on a busy 256 KiB buffer took
    // 73 us kept and 194 us donated, on a busy 4 MiB one 1700 us kept (a fresh buffer's first touch)
    // and 440 us donated; a compiled AdamW step of a 400k-parameter MLP was 1.4x faster donating.
    {"TORCH_TPU_KEEP_BUSY_BYTES", "262144"},
    {"TORCH_TPU_DIST_VERIFY", "1"},
};

// The variable's value now: the environment's, else its default (nullopt: unset with no default).
// Throws for a name not in kCppSettings (each must be declared in both tables).
std::optional<std::string> get(const char* name);
// A switch that is on unless set to "0" (all of the table's switches default to on).
bool enabled(const char* name);
// A byte count or other non-negative integer (set but empty: the default); throws naming the variable
// for a value that is not one.
int64_t integer(const char* name);

}  // namespace torch_tpu::settings
