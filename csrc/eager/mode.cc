#include "eager/mode.h"

#include <c10/util/ThreadLocalDebugInfo.h>

#include <atomic>
#include <memory>
#include <string_view>

namespace torch_tpu::eager {
namespace {

std::atomic<Mode> g_default{Mode::kStrict};

constexpr std::string_view kModeInfoName = "TORCH_TPU_EAGER_MODE";
const c10::DebugInfoKind kModeInfo(&kModeInfoName);

struct ModeInfo final : c10::DebugInfoBase {
  explicit ModeInfo(Mode m) : mode(m) {}
  Mode mode;
};

}  // namespace

std::optional<Mode> thread_mode() {
  auto* info = c10::ThreadLocalDebugInfo::get(kModeInfo);
  if (!info) return std::nullopt;
  return static_cast<ModeInfo*>(info)->mode;
}

Mode mode() {
  auto m = thread_mode();
  return m ? *m : g_default.load(std::memory_order_relaxed);
}
void set_default_mode(Mode m) { g_default.store(m); }

void push_thread_mode(Mode m) { c10::ThreadLocalDebugInfo::_push(kModeInfo, std::make_shared<ModeInfo>(m)); }
void pop_thread_mode() { c10::ThreadLocalDebugInfo::_pop(kModeInfo); }

}  // namespace torch_tpu::eager
