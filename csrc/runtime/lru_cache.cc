#include "runtime/lru_cache.h"

#include <algorithm>
#include <map>

namespace torch_tpu::runtime {
namespace {

std::mutex& registry_mu() {
  static auto* mu = new std::mutex();
  return *mu;
}

std::vector<HostCache*>& registry() {  // never destroyed: caches of static lifetime outlive it otherwise
  static auto* all = new std::vector<HostCache*>();
  return *all;
}

}  // namespace

HostCache::HostCache(std::string name) : name_(std::move(name)) {
  std::lock_guard<std::mutex> g(registry_mu());
  registry().push_back(this);
}

HostCache::~HostCache() {
  std::lock_guard<std::mutex> g(registry_mu());
  auto& all = registry();
  all.erase(std::remove(all.begin(), all.end(), this), all.end());
}

std::vector<HostCacheStats> host_caches() {
  // Under the registry lock, so that no cache is destroyed while it is asked; a cache's stats()
  // takes its own lock, which no cache holds while it registers or unregisters.
  std::lock_guard<std::mutex> g(registry_mu());
  std::map<std::string, HostCacheStats> by_name;
  for (HostCache* c : registry()) {
    HostCacheStats s = c->stats();
    auto [it, fresh] = by_name.emplace(s.name, s);
    if (fresh) continue;
    it->second.entries += s.entries;
    it->second.capacity += s.capacity;
    it->second.bytes += s.bytes;
    it->second.max_bytes += s.max_bytes;
    it->second.hits += s.hits;
    it->second.misses += s.misses;
    it->second.evictions += s.evictions;
  }
  std::vector<HostCacheStats> out;
  for (auto& [name, s] : by_name) out.push_back(std::move(s));
  return out;
}

void reset_host_cache_stats() {
  std::lock_guard<std::mutex> g(registry_mu());
  for (HostCache* c : registry()) c->reset_stats();
}

}  // namespace torch_tpu::runtime
