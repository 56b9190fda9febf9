#include "runtime/compile_cache.h"

#include "runtime/runtime.h"

#include <c10/util/Exception.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <random>
#include <vector>

namespace torch_tpu::runtime {
namespace fs = std::filesystem;
namespace {

// File layout: magic | u32 key length | key | f64 compile seconds | u64 payload length | payload |
// u64 FNV-1a of the payload. Anything else is "not ours" and rebuilt.
constexpr char kMagic[8] = {'T', 'T', 'P', 'U', 'X', 'L', 'A', '1'};

uint64_t fnv1a(const std::string& s) {
  uint64_t h = 1469598103934665603ULL;
  for (unsigned char c : s) h = (h ^ c) * 1099511628211ULL;
  return h;
}

template <typename T>
void put(std::string& out, T v) {
  out.append(reinterpret_cast<const char*>(&v), sizeof(T));
}

template <typename T>
bool get(const std::string& in, size_t& at, T* v) {
  if (at + sizeof(T) > in.size()) return false;
  std::memcpy(v, in.data() + at, sizeof(T));
  at += sizeof(T);
  return true;
}

}  // namespace

CompileCache& compile_cache() {
  static CompileCache* c = new CompileCache();
  return *c;
}

void CompileCache::configure(const std::string& dir, bool disk, int64_t max_bytes) {
  std::lock_guard<std::mutex> g(mu_);
  dir_ = dir;
  disk_ = disk && !dir.empty();
  max_bytes_ = max_bytes;
}

std::string CompileCache::dir() {
  std::lock_guard<std::mutex> g(mu_);
  return dir_;
}

bool CompileCache::disk_enabled() {
  std::lock_guard<std::mutex> g(mu_);
  return disk_;
}

CacheStats CompileCache::stats() {
  std::lock_guard<std::mutex> g(mu_);
  return stats_;
}

void CompileCache::reset_stats() {
  std::lock_guard<std::mutex> g(mu_);
  stats_ = CacheStats();
}

void CompileCache::clear_memory() {
  std::lock_guard<std::mutex> g(mu_);
  memory_.clear();
}

void CompileCache::remember_locked(const std::string& key, std::shared_ptr<pjrt::Executable> exe) {
  // Each loaded executable holds a few JIT code mappings; a process with tens of thousands of them
  // hits the kernel's map limit (LLVM: "Unable to allocate section memory"). Past the cap the memory
  // tier starts over: entries stay on disk, and live front-end entries keep their own references.
  if (memory_.size() >= kMaxMemoryEntries) memory_.clear();
  memory_[key] = std::move(exe);
}

std::shared_ptr<pjrt::Executable> CompileCache::get_or_compile(pjrt::Client& client, const std::string& key,
                                                               const std::string& mlir) {
  {
    std::lock_guard<std::mutex> g(mu_);
    auto it = memory_.find(key);
    if (it != memory_.end()) {
      stats_.memory_hits++;
      return it->second;
    }
  }
  double seconds = 0;
  if (disk_enabled()) {
    if (auto exe = load(client, key, &seconds)) {
      std::lock_guard<std::mutex> g(mu_);
      stats_.disk_hits++;
      stats_.saved_seconds += seconds;
      remember_locked(key, exe);
      return exe;
    }
  }
  auto t0 = std::chrono::steady_clock::now();
  auto exe = client.compile(mlir);
  counters().compiles++;
  seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  {
    std::lock_guard<std::mutex> g(mu_);
    stats_.misses++;
    stats_.compile_seconds += seconds;
    remember_locked(key, exe);
  }
  if (disk_enabled()) store(client, key, *exe, seconds);
  return exe;
}

std::shared_ptr<pjrt::Executable> CompileCache::load(pjrt::Client& client, const std::string& key,
                                                     double* seconds) {
  fs::path path = fs::path(dir()) / (key + ".xla");
  std::error_code ec;
  if (!fs::exists(path, ec)) return nullptr;
  std::string data;
  {
    std::ifstream f(path, std::ios::binary);
    if (!f) return nullptr;
    data.assign(std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>());
  }
  std::string why;
  size_t at = 0;
  uint32_t klen = 0;
  uint64_t plen = 0, sum = 0;
  if (data.size() < sizeof(kMagic) || std::memcmp(data.data(), kMagic, sizeof(kMagic)) != 0) {
    why = "not a torch_tpu cache entry";
  } else if (at = sizeof(kMagic); !get(data, at, &klen) || at + klen > data.size() ||
                                  data.compare(at, klen, key) != 0) {
    why = "its key does not match its name";
  } else if (at += klen; !get(data, at, seconds) || !get(data, at, &plen) || at + plen + 8 > data.size()) {
    why = "truncated";
  } else {
    std::string payload = data.substr(at, plen);
    at += plen;
    get(data, at, &sum);
    if (sum != fnv1a(payload)) {
      why = "checksum mismatch";
    } else {
      try {
        auto exe = client.deserialize(payload);
        fs::last_write_time(path, fs::file_time_type::clock::now(), ec);  // LRU: mark as used
        return exe;
      } catch (const std::exception& e) {
        why = std::string("the plugin cannot load it (") + e.what() + ")";
      }
    }
  }
  TORCH_WARN_ONCE("torch_tpu: ignoring compilation cache entry ", path.string(), ": ", why,
                  ". It is removed and the program recompiled.");
  fs::remove(path, ec);
  std::lock_guard<std::mutex> g(mu_);
  stats_.disk_rejected++;
  return nullptr;
}

void CompileCache::store(pjrt::Client& client, const std::string& key, const pjrt::Executable& exe,
                         double seconds) {
  std::string payload;
  try {
    payload = client.serialize(exe);
  } catch (const std::exception&) {
    return;  // a plugin that cannot serialize just has no disk tier
  }
  std::string data(kMagic, sizeof(kMagic));
  put<uint32_t>(data, static_cast<uint32_t>(key.size()));
  data += key;
  put<double>(data, seconds);
  put<uint64_t>(data, payload.size());
  data += payload;
  put<uint64_t>(data, fnv1a(payload));
  std::error_code ec;
  fs::path d(dir());
  fs::create_directories(d, ec);
  std::random_device rd;
  fs::path tmp = d / (key + ".tmp." + std::to_string(getpid()) + "." + std::to_string(rd()));
  {
    std::ofstream f(tmp, std::ios::binary);
    if (!f) return;
    f.write(data.data(), static_cast<std::streamsize>(data.size()));
    if (!f) {
      fs::remove(tmp, ec);
      return;
    }
  }
  fs::rename(tmp, d / (key + ".xla"), ec);  // atomic: readers see the old file or the whole new one
  if (ec) {
    fs::remove(tmp, ec);
    return;
  }
  std::lock_guard<std::mutex> g(mu_);
  stats_.disk_writes++;
  evict_locked();
}

void CompileCache::evict_locked() {
  std::error_code ec;
  std::vector<std::pair<fs::file_time_type, fs::path>> entries;
  int64_t total = 0;
  for (const auto& e : fs::directory_iterator(dir_, ec)) {
    if (e.path().extension() != ".xla") continue;
    auto size = static_cast<int64_t>(e.file_size(ec));
    total += size;
    entries.emplace_back(e.last_write_time(ec), e.path());
  }
  if (total <= max_bytes_) return;
  std::sort(entries.begin(), entries.end());
  for (const auto& [when, path] : entries) {
    if (total <= max_bytes_) break;
    auto size = static_cast<int64_t>(fs::file_size(path, ec));
    if (fs::remove(path, ec)) {
      total -= size;
      stats_.evictions++;
    }
  }
}

}  // namespace torch_tpu::runtime
