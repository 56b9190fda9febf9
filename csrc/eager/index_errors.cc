#include "eager/index_errors.h"

#include <c10/util/Exception.h>

#include <map>
#include <mutex>

#include "aten/device.h"
#include "eager/mode.h"
#include "runtime/runtime.h"

namespace torch_tpu::eager {
namespace {

struct ErrorKind {
  std::string op, message;
  bool index_error;
};

struct Status {
  at::Tensor tensor;
  const void* checked = nullptr;  // the buffer last read (a new one means a program wrote it since)
};

std::mutex g_mu;
std::map<int64_t, ErrorKind> g_kinds;  // by id
std::map<int, Status> g_status;

// A program bakes its error ids in, so an id depends on the error alone (FNV-1a of the triple):
// the same program text, and its disk-cached executable, in every process.
int64_t id_of(const std::string& op, bool index_error, const std::string& message) {
  uint64_t h = 1469598103934665603ull;
  auto mix = [&h](const std::string& s) {
    for (unsigned char c : s) h = (h ^ c) * 1099511628211ull;
    h = (h ^ 0xff) * 1099511628211ull;  // separator
  };
  mix(op);
  mix(index_error ? "IndexError" : "RuntimeError");
  mix(message);
  return static_cast<int64_t>(h >> 2) + 1;  // positive: 0 means "no error"
}

}  // namespace

int64_t register_index_error(const std::string& op, bool index_error, const std::string& message) {
  int64_t id = id_of(op, index_error, message);
  std::lock_guard<std::mutex> g(g_mu);
  g_kinds.emplace(id, ErrorKind{op, message, index_error});
  return id;
}

at::Tensor index_status(int device) {
  std::lock_guard<std::mutex> g(g_mu);
  auto& s = g_status[device];
  if (!s.tensor.defined()) {
    s.tensor = aten::new_tpu_tensor({3}, c10::ScalarType::Long, device);
    // Zeros now, not "never written": a launch that fails marks the never-written cells it was to
    // write as having no value, and every later op that checks indices would then fail with it.
    // (No launch can hold this new cell yet, so no wait.)
    auto& rt = runtime::Runtime::get();
    runtime::Cell* c = aten::cell_of(s.tensor);
    rt.ensure_typed(*c, c10::ScalarType::Long);
    rt.materialize(*c);
    s.checked = c->buffer.get();  // nothing to read until a program writes it
  }
  return s.tensor;
}

void raise_index_errors(int device) {
  std::string message;
  bool index_error = false;
  {
    std::lock_guard<std::mutex> g(g_mu);
    auto& rt = runtime::Runtime::get();
    for (auto& [dev, s] : g_status) {
      if (device >= 0 && dev != device) continue;
      runtime::Cell* c = aten::cell_of(s.tensor);
      if (!c->buffer || c->buffer.get() == s.checked) continue;
      int64_t v[3] = {0, 0, 0};
      rt.download(*c, v, sizeof v);
      s.checked = c->buffer.get();
      auto kind = g_kinds.find(v[0]);
      if (v[0] == 0 || kind == g_kinds.end() || !message.empty()) continue;
      const auto& k = kind->second;
      message = k.message;
      auto at = message.find("{value}");
      if (at != std::string::npos) message.replace(at, 7, std::to_string(v[1]));
      at = message.find("{size}");
      if (at != std::string::npos) message.replace(at, 6, std::to_string(v[2]));
      // Debug eager waits after every op, so the op that found it is the one that just ran.
      message += "\n(found on the device by the tpu op " + k.op +
                 (mode() == Mode::kDebug ? std::string()
                                         : ", launched before this synchronisation; run with TORCH_TPU_EAGER_MODE=debug "
                                           "to raise it at the op") +
                 "; the op wrote nothing)";
      index_error = k.index_error;
      int64_t zeros[3] = {0, 0, 0};
      rt.upload(*c, zeros, c10::ScalarType::Long, 3);
      s.checked = c->buffer.get();
    }
  }
  if (message.empty()) return;
  if (index_error) TORCH_CHECK_INDEX(false, message);
  TORCH_CHECK(false, message);
}

}  // namespace torch_tpu::eager
