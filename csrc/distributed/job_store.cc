#include "distributed/job_store.h"

#include <torch/csrc/distributed/c10d/PrefixStore.hpp>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>

#include <chrono>
#include <cstdlib>
#include <string>

namespace torch_tpu::distributed {
namespace {

class C10dKeyValueStore : public pjrt::KeyValueStore {
 public:
  explicit C10dKeyValueStore(c10::intrusive_ptr<c10d::Store> store) : store_(std::move(store)) {}

  std::string get(const std::string& key, int timeout_ms) override {
    store_->wait({key}, std::chrono::milliseconds(timeout_ms));
    auto v = store_->get(key);
    return std::string(v.begin(), v.end());
  }

  std::optional<std::string> try_get(const std::string& key) override {
    if (!store_->check({key})) return std::nullopt;
    auto v = store_->get(key);
    return std::string(v.begin(), v.end());
  }

  void put(const std::string& key, const std::string& value) override {
    store_->set(key, std::vector<uint8_t>(value.begin(), value.end()));
  }

 private:
  c10::intrusive_ptr<c10d::Store> store_;
};

std::string env(const char* name) {
  const char* v = std::getenv(name);
  return v ? v : "";
}

}  // namespace

std::shared_ptr<pjrt::KeyValueStore> key_value_store(c10::intrusive_ptr<c10d::Store> store) {
  return std::make_shared<C10dKeyValueStore>(std::move(store));
}

std::shared_ptr<pjrt::KeyValueStore> torchrun_key_value_store() {
  std::string host = env("MASTER_ADDR"), port = env("MASTER_PORT");
  TORCH_CHECK(!host.empty() && !port.empty(),
              "tpu: a multi-process PJRT client needs torchrun's store: MASTER_ADDR and MASTER_PORT are not set");
  c10d::TCPStoreOptions opts;
  opts.port = static_cast<uint16_t>(std::stoi(port));
  opts.isServer = false;      // the elastic agent serves it
  opts.waitWorkers = false;
  opts.timeout = std::chrono::minutes(5);
  auto tcp = c10::make_intrusive<c10d::TCPStore>(host, opts);
  std::string restart = env("TORCHELASTIC_RESTART_COUNT");
  return key_value_store(
      c10::make_intrusive<c10d::PrefixStore>("torch_tpu/pjrt/" + (restart.empty() ? "0" : restart) + "/", tcp));
}

}  // namespace torch_tpu::distributed
