#include "runtime/compile_cache.h"

#include "runtime/runtime.h"
#include "runtime/trace.h"

#include <c10/util/Exception.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <csignal>
#include <cstdlib>
#include <chrono>
#include <climits>
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

std::string encode(const std::string& key, double seconds, const std::string& payload) {
  std::string data(kMagic, sizeof(kMagic));
  put<uint32_t>(data, static_cast<uint32_t>(key.size()));
  data += key;
  put<double>(data, seconds);
  put<uint64_t>(data, payload.size());
  data += payload;
  put<uint64_t>(data, fnv1a(payload));
  return data;
}

// The payload of a file's bytes, or "" with *why set when they are not a sound entry for `key`.
std::string decode(const std::string& data, const std::string& key, double* seconds, std::string* why) {
  size_t at = sizeof(kMagic);
  uint32_t klen = 0;
  uint64_t plen = 0, sum = 0;
  if (data.size() < sizeof(kMagic) || std::memcmp(data.data(), kMagic, sizeof(kMagic)) != 0) {
    *why = "not a torch_tpu cache entry";
  } else if (!get(data, at, &klen) || at + klen > data.size() || data.compare(at, klen, key) != 0) {
    *why = "its key does not match its name";
  } else if (at += klen; !get(data, at, seconds) || !get(data, at, &plen) || plen > data.size() - at ||
                         data.size() - at - plen != sizeof(sum)) {
    *why = "its size does not match its header (truncated?)";
  } else {
    std::string payload = data.substr(at, plen);
    at += plen;
    get(data, at, &sum);
    if (sum == fnv1a(payload)) return payload;
    *why = "checksum mismatch";
  }
  return std::string();
}

// Why a tier's directory cannot be used ("" when it can), creating it if needed.
std::string unusable(const CacheTierConfig& c) {
  std::error_code ec;
  if (c.private_dir) {
    // mkdir, not create_directories: its parent (/dev/shm) must already exist; 0700 whatever the umask.
    if (::mkdir(c.dir.c_str(), 0700) != 0 && errno != EEXIST) return std::strerror(errno);
    struct stat st;
    if (::lstat(c.dir.c_str(), &st) != 0) return std::strerror(errno);
    if (!S_ISDIR(st.st_mode)) return "it is not a directory (a link or a file is not used)";
    if (st.st_uid != ::geteuid()) return "it belongs to another user";
    if (st.st_mode & (S_IWGRP | S_IWOTH)) return "other users can write to it";
  } else {
    bool made = !fs::exists(c.dir, ec);
    fs::create_directories(c.dir, ec);
    if (ec) return ec.message();
    if (!fs::is_directory(c.dir, ec)) return "it is not a directory";
    // One we made ourselves is ours alone whatever the umask (a umask of 002 would refuse it below).
    if (made && c.owner_writes_only) ::chmod(c.dir.c_str(), 0755);
    struct stat st;
    if (c.owner_writes_only && ::stat(c.dir.c_str(), &st) == 0 && (st.st_mode & (S_IWGRP | S_IWOTH))) {
      return "users other than its owner can write to it, so its entries could be anyone's programs "
             "(TORCH_TPU_TIER3_TRUSTED=1 uses it anyway)";
    }
  }
  if (::access(c.dir.c_str(), W_OK | X_OK) != 0) return "it is not writable";
  return std::string();
}

// Unique among processes on every host that shares a directory (tier 3): host, pid and a random word.
std::string temp_suffix() {
  char host[HOST_NAME_MAX + 1] = {0};
  if (::gethostname(host, sizeof(host) - 1) != 0) host[0] = 0;
  static thread_local std::mt19937_64 rng{std::random_device{}()};
  return ".tmp." + std::string(host) + "." + std::to_string(::getpid()) + "." + std::to_string(rng());
}

// Removes the temporary files of writers that died before their rename (killed, or out of disk):
// this host's whose process is gone, and anyone's older than a day (another host's writer cannot be
// asked). Readers never open them; this only returns their space. Names: <key><temp_suffix()>.
void sweep_abandoned_writes(const std::string& dir) {
  char host[HOST_NAME_MAX + 1] = {0};
  if (::gethostname(host, sizeof(host) - 1) != 0) host[0] = 0;
  auto now = fs::file_time_type::clock::now();
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(dir, ec)) {
    std::string name = e.path().filename().string();
    size_t at = name.find(".tmp.");
    if (at == std::string::npos) continue;
    std::string rest = name.substr(at + 5);  // <host>.<pid>.<random>; a host name may hold dots
    size_t last = rest.rfind('.');
    size_t before = last == std::string::npos || last == 0 ? std::string::npos : rest.rfind('.', last - 1);
    if (before == std::string::npos) continue;
    std::error_code tec;
    auto written = e.last_write_time(tec);
    bool old = !tec && now - written > std::chrono::hours(24);
    bool orphan = false;
    if (rest.substr(0, before) == host) {
      long pid = std::strtol(rest.substr(before + 1, last - before - 1).c_str(), nullptr, 10);
      orphan = pid > 0 && ::kill(static_cast<pid_t>(pid), 0) != 0 && errno == ESRCH;
    }
    if (old || orphan) fs::remove(e.path(), tec);
  }
}

}  // namespace

CompileCache& compile_cache() {
  static CompileCache* c = new CompileCache();
  return *c;
}

void CompileCache::configure(const std::vector<CacheTierConfig>& tiers) {
  std::lock_guard<std::mutex> g(mu_);
  tiers_.clear();
  for (const auto& c : tiers) {
    auto t = std::make_shared<Tier>();
    t->config = c;
    t->stats.name = c.name;
    tiers_.push_back(std::move(t));
  }
}

CacheStats CompileCache::stats() {
  std::lock_guard<std::mutex> g(mu_);
  CacheStats s;
  s.memory_hits = memory_hits_;
  s.misses = misses_;
  s.compile_seconds = compile_seconds_;
  s.saved_seconds = saved_seconds_;
  for (const auto& t : tiers_) s.tiers.push_back(t->stats);
  return s;
}

void CompileCache::reset_stats() {
  std::lock_guard<std::mutex> g(mu_);
  memory_hits_ = misses_ = 0;
  compile_seconds_ = saved_seconds_ = 0;
  for (auto& t : tiers_) t->stats = CacheTierStats{t->config.name};
}

void CompileCache::clear_memory() { memory_.clear(); }

std::vector<std::shared_ptr<CompileCache::Tier>> CompileCache::usable_tiers() {
  std::vector<std::shared_ptr<Tier>> all;
  {
    std::lock_guard<std::mutex> g(mu_);
    all = tiers_;
  }
  std::vector<std::shared_ptr<Tier>> out;
  for (auto& t : all) {
    if (t->config.dir.empty()) continue;
    // Outside mu_: a slow (network) file system delays only the lookups that need this tier.
    std::call_once(t->checked, [&] {
      std::string why = unusable(t->config);
      t->usable = why.empty();
      if (t->usable) {
        sweep_abandoned_writes(t->config.dir);
      } else {
        TORCH_WARN("torch_tpu: the ", t->config.name, " compilation cache at ", t->config.dir,
                   " is off in this process: ", why, ".");
      }
    });
    if (t->usable) out.push_back(t);
  }
  return out;
}

void CompileCache::note_use(const std::string& key) {
  std::lock_guard<std::mutex> g(mu_);
  note_use_locked(key);
}

void CompileCache::note_use_locked(const std::string& key) {
  if (used_.size() < kRememberedKeys && used_set_.insert(key).second) used_.push_back(key);
}

std::vector<std::string> CompileCache::used_keys() {
  std::lock_guard<std::mutex> g(mu_);
  return used_;
}

std::shared_ptr<pjrt::Executable> CompileCache::in_memory(const std::string& key) {
  auto hit = memory_.find(key);
  if (hit) {
    std::lock_guard<std::mutex> g(mu_);
    memory_hits_++;
    note_use_locked(key);
  }
  return hit;
}

std::shared_ptr<pjrt::Executable> CompileCache::from_tiers(pjrt::Client& client,
                                                           const std::vector<std::shared_ptr<Tier>>& tiers,
                                                           const std::string& key, const std::string& name) {
  std::string entry;
  double seconds = 0;
  for (size_t i = 0; i < tiers.size(); ++i) {
    auto exe = load(client, *tiers[i], key, name, &entry, &seconds);
    if (!exe) continue;
    {
      std::lock_guard<std::mutex> g(mu_);
      tiers[i]->stats.hits++;
      saved_seconds_ += seconds;
    }
    // A plugin that does not report its code size (the CPU plugin): the serialized program's size.
    if (exe->code_bytes <= 0) exe->code_bytes = static_cast<int64_t>(entry.size());
    memory_.put(key, exe, program_bytes(*exe));
    for (size_t j = 0; j < i; ++j) write(*tiers[j], key, entry);  // promote into the faster tiers
    return exe;
  }
  return nullptr;
}

bool CompileCache::prefetch(pjrt::Client& client, const std::string& key) {
  if (memory_.find(key)) return false;
  return from_tiers_once(client, usable_tiers(), key, "a program of the last run", false) != nullptr;
}

std::shared_ptr<pjrt::Executable> CompileCache::from_tiers_once(pjrt::Client& client,
                                                              const std::vector<std::shared_ptr<Tier>>& tiers,
                                                              const std::string& key, const std::string& name,
                                                              bool wait) {
  std::shared_future<void> other;
  std::promise<void> done;
  {
    std::lock_guard<std::mutex> g(mu_);
    auto it = loading_.find(key);
    if (it != loading_.end())
      other = it->second;
    else
      loading_.emplace(key, done.get_future().share());
  }
  if (other.valid()) {
    if (!wait) return nullptr;
    other.wait();
    return in_memory(key);  // null when that load found nothing: the caller compiles
  }
  struct Release {  // whatever from_tiers does (it may throw), the key is no longer being loaded
    CompileCache* cache;
    const std::string& key;
    std::promise<void>& done;
    ~Release() {
      {
        std::lock_guard<std::mutex> g(cache->mu_);
        cache->loading_.erase(key);
      }
      done.set_value();
    }
  } release{this, key, done};
  return from_tiers(client, tiers, key, name);
}

std::shared_ptr<pjrt::Executable> CompileCache::get_or_compile(pjrt::Client& client, const std::string& key,
                                                               const std::string& mlir, const std::string& name,
                                                               const std::string& options) {
  if (auto hit = in_memory(key)) return hit;
  note_use(key);
  auto tiers = usable_tiers();
  if (auto exe = from_tiers_once(client, tiers, key, name, true)) return exe;
  std::string entry;
  double seconds = 0;
  auto t0 = std::chrono::steady_clock::now();
  std::shared_ptr<pjrt::Executable> exe;
  {
    trace::HostSpan span([&] { return "compile " + name; });
    exe = client.compile(mlir, options);
  }
  counters().compiles++;
  seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  {
    std::lock_guard<std::mutex> g(mu_);
    misses_++;
    compile_seconds_ += seconds;
  }
  if (tiers.empty()) {
    memory_.put(key, exe, program_bytes(*exe));
    return exe;
  }
  std::string payload;
  try {
    payload = client.serialize(*exe);
  } catch (const std::exception&) {
    memory_.put(key, exe, program_bytes(*exe));
    return exe;  // a plugin that cannot serialize just has no directory tiers
  }
  if (exe->code_bytes <= 0) exe->code_bytes = static_cast<int64_t>(payload.size());  // (as above)
  memory_.put(key, exe, program_bytes(*exe));
  entry = encode(key, seconds, payload);
  for (auto& t : tiers) write(*t, key, entry);
  return exe;
}

std::vector<std::string> CompileCache::store(const std::string& key, const std::string& payload, double seconds,
                                             const std::vector<std::string>& dirs) {
  std::string entry = encode(key, seconds, payload);
  std::vector<std::string> written;
  if (dirs.empty()) {
    for (auto& t : usable_tiers())
      if (write(*t, key, entry)) written.push_back(t->config.name);
    return written;
  }
  for (const auto& dir : dirs) {
    Tier t;  // an uncapped tier of its own, as tier 3 is: never evicted here
    t.config.name = t.stats.name = dir;
    t.config.dir = dir;
    std::string why = unusable(t.config);
    if (!why.empty()) {
      TORCH_WARN("torch_tpu: cannot write executables into ", dir, ": ", why, ".");
      continue;
    }
    if (write(t, key, entry)) written.push_back(dir);
  }
  return written;
}

std::shared_ptr<pjrt::Executable> CompileCache::load(pjrt::Client& client, Tier& tier, const std::string& key,
                                                     const std::string& name, std::string* entry, double* seconds) {
  fs::path path = fs::path(tier.config.dir) / (key + ".xla");
  std::ifstream f(path, std::ios::binary);
  if (!f) return nullptr;  // not there (or unreadable): a plain miss
  // The rest is a load (or a rejected entry), in profiler traces.
  trace::HostSpan span([&] { return "load " + name + " from the " + tier.config.name + " cache"; });
  entry->assign(std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>());
  f.close();
  std::error_code ec;
  std::string why;
  std::string payload = decode(*entry, key, seconds, &why);
  if (why.empty()) {
    try {
      auto exe = client.deserialize(payload);
      // LRU: mark as used. Only where it is evicted: on a shared tier each hit would be a metadata write.
      if (tier.config.max_bytes > 0) fs::last_write_time(path, fs::file_time_type::clock::now(), ec);
      return exe;
    } catch (const std::exception& e) {
      why = std::string("the plugin cannot load it (") + e.what() + ")";
    }
  }
  TORCH_WARN_ONCE("torch_tpu: ignoring compilation cache entry ", path.string(), ": ", why,
                  ". It is removed and the program recompiled.");
  fs::remove(path, ec);
  std::lock_guard<std::mutex> g(mu_);
  tier.stats.rejected++;
  return nullptr;
}

bool CompileCache::write(Tier& tier, const std::string& key, const std::string& entry) {
  if (tier.unwritable) return false;
  fs::path dir(tier.config.dir);
  fs::path tmp = dir / (key + temp_suffix());
  std::error_code ec;
  std::string why;
  {
    errno = 0;
    std::ofstream f(tmp, std::ios::binary);
    if (f) {
      f.write(entry.data(), static_cast<std::streamsize>(entry.size()));
      f.close();  // on NFS, close flushes to the server: the rename below then publishes whole bytes
    }
    if (!f) why = errno ? std::strerror(errno) : "the write failed";
  }
  if (why.empty()) {
    fs::rename(tmp, dir / (key + ".xla"), ec);  // atomic: readers see the old file or the whole new one
    if (ec) why = ec.message();
  }
  if (!why.empty()) {
    fs::remove(tmp, ec);
    if (!tier.unwritable.exchange(true))
      TORCH_WARN("torch_tpu: cannot write into the ", tier.config.name, " compilation cache at ", dir.string(),
                 " (", why, "): this process stops writing there and keeps reading the entries it holds; "
                 "programs it compiles from now on are compiled again by the next process.");
    return false;
  }
  {
    std::lock_guard<std::mutex> g(mu_);
    tier.stats.writes++;
  }
  if (tier.config.max_bytes > 0) account(tier, static_cast<int64_t>(entry.size()));
  return true;
}

void CompileCache::account(Tier& tier, int64_t written) {
  std::lock_guard<std::mutex> g(tier.size_mu);
  if (tier.known_bytes >= 0) {
    tier.known_bytes += written;
    if (tier.known_bytes <= tier.config.max_bytes) return;
  }
  tier.known_bytes = evict(tier);
}

int64_t CompileCache::evict(Tier& tier) {
  std::error_code ec;
  std::vector<std::pair<fs::file_time_type, fs::path>> entries;
  int64_t total = 0;
  for (const auto& e : fs::directory_iterator(tier.config.dir, ec)) {
    if (e.path().extension() != ".xla") continue;
    total += static_cast<int64_t>(e.file_size(ec));
    entries.emplace_back(e.last_write_time(ec), e.path());
  }
  if (total <= tier.config.max_bytes) return total;
  std::sort(entries.begin(), entries.end());
  int64_t evicted = 0;
  for (const auto& [when, path] : entries) {
    if (total <= tier.config.max_bytes) break;
    auto size = static_cast<int64_t>(fs::file_size(path, ec));
    if (ec) continue;  // another process evicted it first
    if (fs::remove(path, ec)) {
      total -= size;
      evicted++;
    }
  }
  std::lock_guard<std::mutex> g(mu_);
  tier.stats.evictions += evicted;
  return total;
}

}  // namespace torch_tpu::runtime
