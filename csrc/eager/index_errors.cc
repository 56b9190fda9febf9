#include "eager/index_errors.h"

#include <c10/util/Exception.h>

#include <map>
#include <mutex>
#include <tuple>
#include <vector>

#include "aten/device.h"
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
std::vector<ErrorKind> g_kinds;
std::map<std::tuple<std::string, bool, std::string>, int64_t> g_ids;
std::map<int, Status> g_status;

}  // namespace

int64_t register_index_error(const std::string& op, bool index_error, const std::string& message) {
  std::lock_guard<std::mutex> g(g_mu);
  auto key = std::make_tuple(op, index_error, message);
  auto it = g_ids.find(key);
  if (it != g_ids.end()) return it->second;
  g_kinds.push_back({op, message, index_error});
  int64_t id = static_cast<int64_t>(g_kinds.size());
  g_ids.emplace(key, id);
  return id;
}

at::Tensor index_status(int device) {
  std::lock_guard<std::mutex> g(g_mu);
  auto& s = g_status[device];
  if (!s.tensor.defined()) s.tensor = aten::new_tpu_tensor({2}, c10::ScalarType::Long, device);  // reads as zeros
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
      int64_t v[2] = {0, 0};
      rt.download(*c, v, sizeof v);
      s.checked = c->buffer.get();
      if (v[0] <= 0 || v[0] > static_cast<int64_t>(g_kinds.size()) || !message.empty()) continue;
      const auto& k = g_kinds[v[0] - 1];
      message = k.message;
      auto at = message.find("{value}");
      if (at != std::string::npos) message.replace(at, 7, std::to_string(v[1]));
      message += "\n(found on the device by the tpu op " + k.op +
                 ", launched before this synchronisation; run with TORCH_TPU_EAGER_MODE=debug to raise it at "
                 "the op; the op wrote nothing)";
      index_error = k.index_error;
      int64_t zeros[2] = {0, 0};
      rt.upload(*c, zeros, c10::ScalarType::Long, 2);
      s.checked = c->buffer.get();
    }
  }
  if (message.empty()) return;
  if (index_error) TORCH_CHECK_INDEX(false, message);
  TORCH_CHECK(false, message);
}

}  // namespace torch_tpu::eager
