#pragma once

// The one in-memory cache policy of the runtime: a least-recently-used map bounded by its entry
// count and by the bytes its values hold, with per-cache counters. Plans (eager), executables in memory (the compile cache's first
// tier), scalar operand buffers, fused programs and the per-shape graphs of torch.compile each hold
// one; torch_tpu.metrics.host_caches() reports them all by name.
//
// Why bounded: each cached value holds device or JIT memory (a loaded executable keeps about three
// code mappings; tens of thousands exhaust a process's map limit), and a job whose shapes keep
// changing would otherwise grow without limit. An evicted program is found again in the compile
// cache's disk tiers, so eviction costs a reload, never a recompile.

#include <cstdint>
#include <list>
#include <mutex>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

namespace torch_tpu::runtime {

// One cache's counters. entries / capacity: current and maximum entry counts; bytes / max_bytes:
// the bytes its values hold, as their put() said (a program's generated code, a buffer's size), and
// the bound on them (0: none); hits, misses (lookups that found nothing) and evictions (entries
// dropped to stay within either bound) since the last reset_stats().
struct HostCacheStats {
  std::string name;
  int64_t entries = 0, capacity = 0, bytes = 0, max_bytes = 0, hits = 0, misses = 0, evictions = 0;
};

// What every cache answers, whatever its key and value types; caches register themselves for the
// lifetime of the object (host_caches() lists them).
class HostCache {
 public:
  explicit HostCache(std::string name);
  virtual ~HostCache();
  HostCache(const HostCache&) = delete;
  HostCache& operator=(const HostCache&) = delete;
  const std::string& name() const { return name_; }
  virtual HostCacheStats stats() = 0;
  virtual void reset_stats() = 0;
  virtual void clear() = 0;

 private:
  std::string name_;
};

// The counters of every live cache, those of one name (e.g. each compiled graph's shapes) summed.
std::vector<HostCacheStats> host_caches();
// reset_stats() on every live cache.
void reset_host_cache_stats();

// A thread-safe LRU map of at most `capacity` entries (>= 1) whose values hold at most `max_bytes`
// bytes (0: no byte bound; the entry just put always stays, however big). find() marks an entry
// most recently used; put() past either bound drops the least recently used ones. Values that
// leave the cache are destroyed after its lock is released: a value may hold a Python object whose
// release takes the GIL, which a thread waiting on this lock may hold.
template <class K, class V, class Hash = std::hash<K>, class Eq = std::equal_to<K>>
class LruCache final : public HostCache {
 public:
  LruCache(std::string name, size_t capacity, int64_t max_bytes = 0)
      : HostCache(std::move(name)), capacity_(capacity ? capacity : 1), max_bytes_(max_bytes > 0 ? max_bytes : 0) {}

  // The value cached for `key`, or a default V (counted as a miss).
  V find(const K& key) {
    std::lock_guard<std::mutex> g(mu_);
    auto it = index_.find(key);
    if (it == index_.end()) {
      ++misses_;
      return V{};
    }
    ++hits_;
    lru_.splice(lru_.begin(), lru_, it->second);
    return it->second->value;
  }

  // Caches `value`, which holds `bytes` bytes, for `key` (replacing any value it had) as the most
  // recently used entry.
  void put(K key, V value, int64_t bytes = 0) {
    Entries gone;
    {
      std::lock_guard<std::mutex> g(mu_);
      bytes = bytes > 0 ? bytes : 0;
      auto it = index_.find(key);
      if (it != index_.end()) {
        std::swap(it->second->value, value);  // the old value goes with `value`, after the lock
        bytes_ += bytes - it->second->bytes;
        it->second->bytes = bytes;
        lru_.splice(lru_.begin(), lru_, it->second);
      } else {
        lru_.push_front(Entry{key, std::move(value), bytes});
        index_.emplace(std::move(key), lru_.begin());
        bytes_ += bytes;
      }
      while (index_.size() > capacity_ || (max_bytes_ && bytes_ > max_bytes_ && index_.size() > 1)) {
        index_.erase(lru_.back().key);
        bytes_ -= lru_.back().bytes;
        gone.splice(gone.end(), lru_, std::prev(lru_.end()));
        ++evictions_;
      }
    }
  }

  size_t size() {
    std::lock_guard<std::mutex> g(mu_);
    return index_.size();
  }

  void clear() override {
    Entries gone;
    std::lock_guard<std::mutex> g(mu_);
    index_.clear();
    gone.swap(lru_);
    bytes_ = 0;
  }

  HostCacheStats stats() override {
    std::lock_guard<std::mutex> g(mu_);
    return {name(), static_cast<int64_t>(index_.size()), static_cast<int64_t>(capacity_), bytes_, max_bytes_,
            hits_, misses_, evictions_};
  }

  void reset_stats() override {
    std::lock_guard<std::mutex> g(mu_);
    hits_ = misses_ = evictions_ = 0;
  }

 private:
  struct Entry {
    K key;
    V value;
    int64_t bytes;
  };
  using Entries = std::list<Entry>;  // most recently used first
  std::mutex mu_;
  size_t capacity_;
  int64_t max_bytes_;
  Entries lru_;
  std::unordered_map<K, typename Entries::iterator, Hash, Eq> index_;
  int64_t bytes_ = 0, hits_ = 0, misses_ = 0, evictions_ = 0;
};

}  // namespace torch_tpu::runtime
