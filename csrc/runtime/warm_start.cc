#include "runtime/warm_start.h"

#include <unistd.h>

#include <cctype>
#include <cstdio>
#include <fstream>
#include <mutex>
#include <vector>

#include "runtime/compile_cache.h"
#include "runtime/compile_pool.h"

namespace torch_tpu::runtime::warm_start {
namespace {

constexpr const char* kHeader = "torch_tpu warm start v1";

std::mutex mu;
std::string manifest;  // guarded by mu

// A cache key: 64 lower-case hex digits (runtime.program_key), also the entry's file name.
bool is_key(const std::string& s) {
  if (s.size() != 64) return false;
  for (char c : s)
    if (!std::isxdigit(static_cast<unsigned char>(c)) || std::isupper(static_cast<unsigned char>(c))) return false;
  return true;
}

}  // namespace

void set_manifest(const std::string& path) {
  std::lock_guard<std::mutex> g(mu);
  manifest = path;
}

void on_client_start(pjrt::Client& client) {
  std::string path;
  {
    std::lock_guard<std::mutex> g(mu);
    path = manifest;
  }
  if (path.empty()) return;
  std::ifstream f(path);
  std::string line;
  if (!f || !std::getline(f, line) || line != kHeader) return;
  std::vector<std::string> keys;
  while (keys.size() < CompileCache::kRememberedKeys && std::getline(f, line)) {
    if (!is_key(line)) return;  // not a manifest we wrote whole: prefetch nothing
    keys.push_back(line);
  }
  prefetch_async(client, keys);
}

void finish() {
  cancel_prefetch();
  std::string path;
  {
    std::lock_guard<std::mutex> g(mu);
    path = manifest;
  }
  auto keys = compile_cache().used_keys();
  if (path.empty() || keys.empty()) return;
  std::string tmp = path + ".tmp." + std::to_string(::getpid());
  {
    std::ofstream f(tmp, std::ios::trunc);
    if (!f) return;  // no directory (the disk tier never written) or not writable
    f << kHeader << '\n';
    for (const auto& k : keys) f << k << '\n';
    f.close();
    if (!f) {
      std::remove(tmp.c_str());
      return;
    }
  }
  if (std::rename(tmp.c_str(), path.c_str()) != 0) std::remove(tmp.c_str());
}

}  // namespace torch_tpu::runtime::warm_start
