// The executable cache shared by every front-end (eager, fused eager, torch.compile): in memory,
// and on disk across processes and restarts.
//
// The caller gives a key that already covers everything the executable depends on (the program
// text, the plugin's platform and version, the compile options, the torch_tpu version); it is a hex
// digest, used as the file name. Disk entries are written to a temporary file and renamed into
// place (atomic, so concurrent writers of one key are safe); an entry that is truncated, corrupt,
// or not ours is ignored with one warning, removed and rebuilt. The directory is capped in bytes,
// evicting the least recently used entries (a hit refreshes an entry's modification time).
#pragma once

#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>

#include "pjrt/pjrt.h"

namespace torch_tpu::runtime {

struct CacheStats {
  int64_t memory_hits = 0, disk_hits = 0, misses = 0, disk_writes = 0, disk_rejected = 0, evictions = 0;
  double compile_seconds = 0;  // spent compiling misses
  double saved_seconds = 0;    // compile time that disk hits did not spend (as recorded when written)
};

class CompileCache {
 public:
  // dir: cache directory (created on first write); empty or !disk: memory only.
  void configure(const std::string& dir, bool disk, int64_t max_bytes);
  std::shared_ptr<pjrt::Executable> get_or_compile(pjrt::Client& client, const std::string& key,
                                                   const std::string& mlir);
  CacheStats stats();
  void reset_stats();
  void clear_memory();  // drops the in-memory tier (tests, and to measure the disk tier)
  std::string dir();
  bool disk_enabled();

 private:
  std::shared_ptr<pjrt::Executable> load(pjrt::Client& client, const std::string& key, double* seconds);
  void store(pjrt::Client& client, const std::string& key, const pjrt::Executable& exe, double seconds);
  void evict_locked();
  void remember_locked(const std::string& key, std::shared_ptr<pjrt::Executable> exe);
  static constexpr size_t kMaxMemoryEntries = 4096;

  std::mutex mu_;
  std::unordered_map<std::string, std::shared_ptr<pjrt::Executable>> memory_;
  std::string dir_;
  bool disk_ = false;
  int64_t max_bytes_ = int64_t(2) << 30;
  CacheStats stats_;
};

CompileCache& compile_cache();

}  // namespace torch_tpu::runtime
