// The executable cache shared by every front-end (eager, fused eager, torch.compile): in memory,
// then in a list of directory tiers searched in order (torch_tpu.runtime.configure_cache sets them:
// Google TorchTPU's per-host tier 2 under /dev/shm, our local disk directory, Google's shared
// tier 3), across processes, restarts and hosts.
//
// The caller gives a key that already covers everything the executable depends on (the program
// text, the plugin's platform and version, the compile options, the torch_tpu version); it is a hex
// digest, used as the file name <key>.xla in every tier. A hit in a tier is copied into the tiers
// searched before it (and memory); a compile is written to every tier. Entries are written to a
// temporary file in the tier's directory and renamed into place (atomic on POSIX file systems, NFS
// included: concurrent writers of one key, on one host or many, are safe and a reader never sees a
// partial entry); an entry that is truncated, corrupt, or not ours is ignored with one warning,
// removed, and rebuilt. A tier with a byte cap evicts its least recently used entries (a hit
// refreshes an entry's modification time); a tier without one is never evicted by torch_tpu.
// A tier whose directory cannot be created or written is disabled with one warning, when it is
// first needed (so configuring the cache touches no file system).
#pragma once

#include <atomic>
#include <cstdint>
#include <future>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_set>
#include <vector>

#include "pjrt/pjrt.h"
#include "runtime/lru_cache.h"

namespace torch_tpu::runtime {

// What the in-memory caches that hold programs (executables in memory, plans, fused programs, a
// compiled graph's shapes) count a loaded program as: its generated code where the plugin reports
// it (pjrt::Executable::code_bytes), else kUnreportedProgramBytes. Each such cache holds at most
// kProgramCacheBytes of them (and its entry bound), whichever binds first.
constexpr int64_t kUnreportedProgramBytes = 256 << 10;
constexpr int64_t kProgramCacheBytes = int64_t(1) << 30;
inline int64_t program_bytes(const pjrt::Executable& exe) {
  return exe.code_bytes > 0 ? exe.code_bytes : kUnreportedProgramBytes;
}

// One directory tier, as configured.
struct CacheTierConfig {
  std::string name;       // names its counters ("disk", "tier2", "tier3")
  std::string dir;        // empty: the tier is off (its counters stay, at zero)
  int64_t max_bytes = 0;  // cap on its entries' bytes; <= 0: never evicted (a shared directory's owner manages it)
  // The directory must be this user's alone: created with mode 0700, and used only if it is a real
  // directory (not a link) owned by the effective user and not writable by group or others. For a
  // per-user directory in a world-writable place (/dev/shm), where another user could plant entries
  // that this process would then load and run.
  bool private_dir = false;
  // The directory is used only if no user but its owner can write to it (no group or other write
  // bit): a directory shared by hosts (tier 3), whose entries this process loads and runs, where
  // anyone who can write could plant an executable. Off when the user says they trust the others
  // (TORCH_TPU_TIER3_TRUSTED=1, torch_tpu.runtime.configure_cache).
  bool owner_writes_only = false;
};

struct CacheTierStats {
  std::string name;
  int64_t hits = 0;      // loads from this tier
  int64_t writes = 0;    // entries written (compiles and promotions from slower tiers)
  int64_t rejected = 0;  // entries found corrupt, truncated or foreign: removed, counted as not found
  int64_t evictions = 0;
};

struct CacheStats {
  int64_t memory_hits = 0, misses = 0;
  double compile_seconds = 0;  // spent compiling misses
  double saved_seconds = 0;    // compile time that tier hits did not spend (as recorded when written)
  std::vector<CacheTierStats> tiers;  // in search order, one per configured tier (off ones included)
};

class CompileCache {
 public:
  // The directory tiers, in search order; replaces the previous list and zeroes its counters.
  // Touches no file system (each tier is checked when first needed). An empty list: memory only.
  void configure(const std::vector<CacheTierConfig>& tiers);
  // The executable for `key`: from memory, else the first tier that holds a sound entry (copied
  // into the tiers before it), else compiled from `mlir` and written to every usable tier.
  // Throws what the plugin's compile throws; cache file errors are never thrown (a miss instead).
  // `name` says what the program is (an op overload, "fused run (N ops)", a compiled graph) in
  // profiler traces: a compile is the span "compile <name>", a tier hit "load <name> from the <tier>
  // cache" (trace::HostSpan); a memory hit shows nothing.
  // `options`: the serialized xla.CompileOptionsProto (empty: pjrt::default_compile_options()),
  // which `key` must cover too.
  std::shared_ptr<pjrt::Executable> get_or_compile(pjrt::Client& client, const std::string& key,
                                                   const std::string& mlir, const std::string& name = "program",
                                                   const std::string& options = {});
  // The executable for `key` if the in-memory tier holds it (counted as a memory hit), else null
  // (nothing counted): compile_pool.h's fast path.
  std::shared_ptr<pjrt::Executable> in_memory(const std::string& key);
  // Writes an executable compiled elsewhere (a compile-only target's serialized executable, from
  // torch_tpu.aot) under `key` into every usable directory tier, as a compile would, or, when `dirs`
  // is not empty, into those directories instead (created if needed; e.g. the tier-3 directory a TPU
  // job will read); not into memory (it is not loaded here). `seconds` is its compile time. Returns
  // the tiers (names) or directories written; file errors skip one, never throw.
  std::vector<std::string> store(const std::string& key, const std::string& payload, double seconds,
                                 const std::vector<std::string>& dirs = {});
  // Loads the executable of `key` from the first directory tier that holds a sound entry into memory
  // (a tier hit, counted as get_or_compile counts one), compiling nothing: false when memory already
  // holds it or no tier does. warm_start.h's prefetch; not a use of the program (used_keys).
  bool prefetch(pjrt::Client& client, const std::string& key);
  // The keys of the programs this process asked for through get_or_compile or in_memory, in the
  // order of their first use, the first kRememberedKeys of them: what warm_start.h writes at exit.
  std::vector<std::string> used_keys();
  // Counts `key` as used now (compile_pool.h: a request queued for the pool is a use in the order of
  // the requests, not of the pool's threads).
  void note_use(const std::string& key);
  static constexpr size_t kRememberedKeys = 1024;
  CacheStats stats();
  void reset_stats();
  void clear_memory();  // drops the in-memory tier (tests, and to measure the directory tiers)

 private:
  struct Tier {
    CacheTierConfig config;
    std::once_flag checked;  // the directory is checked once, by the first lookup that needs it
    bool usable = false;     // written inside `checked`, read after it
    CacheTierStats stats;    // guarded by mu_
    // A write failed (a full disk, a quota, a file size limit): this process stops writing here,
    // with one warning, and keeps reading the entries that are there.
    std::atomic<bool> unwritable{false};
    // A capped tier's bytes as this process knows them (-1: not counted yet), guarded by size_mu: the
    // directory is listed at this process's first write and again only when its own writes take the
    // count past the cap (a listing of a full tier's ~300k entries takes seconds; once per write it
    // made every compile wait). Other processes' writes are seen at those listings.
    std::mutex size_mu;
    int64_t known_bytes = -1;
  };

  std::vector<std::shared_ptr<Tier>> usable_tiers();
  std::shared_ptr<pjrt::Executable> load(pjrt::Client& client, Tier& tier, const std::string& key,
                                         const std::string& name, std::string* entry, double* seconds);
  bool write(Tier& tier, const std::string& key, const std::string& entry);  // false: not written
  // The first tier's sound entry for `key`, loaded, kept in memory and promoted into the tiers
  // before it; null when no tier holds one.
  std::shared_ptr<pjrt::Executable> from_tiers(pjrt::Client& client, const std::vector<std::shared_ptr<Tier>>& tiers,
                                               const std::string& key, const std::string& name);
  // from_tiers, one thread per key at a time: a thread asking for a key another is loading (the warm
  // start's prefetch and the program's own first use) waits for that load and takes the executable
  // from memory (wait) or leaves it to that load (!wait: returns null), instead of reading and
  // loading the same entry twice.
  std::shared_ptr<pjrt::Executable> from_tiers_once(pjrt::Client& client,
                                                    const std::vector<std::shared_ptr<Tier>>& tiers,
                                                    const std::string& key, const std::string& name, bool wait);
  void note_use_locked(const std::string& key);  // under mu_
  void account(Tier& tier, int64_t written);  // a capped tier grew by `written` bytes: evicts past the cap
  int64_t evict(Tier& tier);  // lists the tier, evicts the least recently used past the cap; its bytes after
  // Each loaded executable holds a few JIT code mappings; a process with tens of thousands of them
  // hits the kernel's map limit (LLVM: "Unable to allocate section memory"). Past the cap the least
  // recently used go: they stay in the directory tiers, and live plans keep their own references.
  static constexpr size_t kMaxMemoryEntries = 4096;
  LruCache<std::string, std::shared_ptr<pjrt::Executable>> memory_{"executables in memory", kMaxMemoryEntries,
                                                                   kProgramCacheBytes};

  std::mutex mu_;
  // Shared so that a lookup in flight keeps the tiers it started with across a configure().
  std::vector<std::shared_ptr<Tier>> tiers_;
  int64_t memory_hits_ = 0, misses_ = 0;
  double compile_seconds_ = 0, saved_seconds_ = 0;
  std::vector<std::string> used_;                  // first uses, in order (at most kRememberedKeys)
  std::map<std::string, std::shared_future<void>> loading_;  // keys a thread is loading from the tiers
  std::unordered_set<std::string> used_set_;
};

CompileCache& compile_cache();

}  // namespace torch_tpu::runtime
