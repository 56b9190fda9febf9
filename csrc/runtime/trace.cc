#include "runtime/trace.h"

#include <mutex>

namespace torch_tpu::runtime::trace {

namespace detail {
std::atomic<bool> recording{false};
}

namespace {
std::mutex mu;
std::vector<std::shared_ptr<Execution>> records;  // under mu
thread_local std::vector<uint64_t> correlations;
}  // namespace

void start() {
  std::lock_guard<std::mutex> g(mu);
  records.clear();
  detail::recording.store(true, std::memory_order_relaxed);
}

void stop() {
  detail::recording.store(false, std::memory_order_relaxed);
}

std::vector<std::shared_ptr<Execution>> take() {
  std::vector<std::shared_ptr<Execution>> out;
  std::lock_guard<std::mutex> g(mu);
  out.swap(records);
  return out;
}

std::shared_ptr<Execution> begin(std::string name, std::string detail, int device) {
  if (!recording()) return nullptr;
  auto e = std::make_shared<Execution>();
  e->name = std::move(name);
  e->detail = std::move(detail);
  e->device = device;
  e->correlation = correlations.empty() ? 0 : correlations.back();
  std::lock_guard<std::mutex> g(mu);
  records.push_back(e);
  return e;
}

void push_correlation(uint64_t id) { correlations.push_back(id); }

void pop_correlation() {
  if (!correlations.empty()) correlations.pop_back();
}

}  // namespace torch_tpu::runtime::trace
