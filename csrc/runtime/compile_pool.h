// Compiles off the dispatching thread (issue 49): an eager op whose program is not in the cache
// is queued at once with a *pending* executable (pjrt::Executable's second form) while a pool of
// threads compiles it, so a step's new programs (a new sequence length: tens of them) compile side
// by side while Python goes on lowering and queuing. The launcher thread, which issues launches in
// order, waits at the first launch whose program is still compiling; a compile error becomes that
// launch's error (raised at the next sync, naming the op, as any asynchronous op failure).
//
// Compiles go through the compile cache (compile_cache.h) exactly as synchronous ones do: memory,
// directory tiers, counters. A key already being compiled gets the same pending executable.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "pjrt/pjrt.h"

namespace torch_tpu::runtime {

// The executable of `mlir` under `key` (compile_cache().get_or_compile's arguments): the loaded one
// when the in-memory cache holds it, else a pending one whose outputs are `types` / `dims` (what the
// program's @main returns; checked against the compiled program, a mismatch fails its launches).
// With 0 threads configured it compiles here, synchronously.
std::shared_ptr<pjrt::Executable> compile_async(pjrt::Client& client, const std::string& key, const std::string& mlir,
                                                const std::string& name, const std::string& options,
                                                std::vector<PJRT_Buffer_Type> types,
                                                std::vector<std::vector<int64_t>> dims);

// Sets the pool's thread count (TORCH_TPU_COMPILE_THREADS, read by Python); 0: compile_async compiles
// on the caller. Threads are started on first use and live as long as the process.
void set_compile_threads(int n);
int compile_threads();

// Queues loads of `keys`' executables from the compile cache's directory tiers into memory
// (CompileCache::prefetch), taken by the pool's threads in order whenever no compile is queued: a
// warm process's start (warm_start.h). A compile_async of a key being loaded waits for that load.
// Nothing with 0 threads configured.
void prefetch_async(pjrt::Client& client, const std::vector<std::string>& keys);
// Drops the loads prefetch_async queued that have not started (at exit: a short run must not wait
// for the programs of a longer one).
void cancel_prefetch();

// Waits until no compile queued by compile_async (nor load queued by prefetch_async) is in flight (counters and cache statistics are read
// after it, so that they count every program an op has asked for; at exit, before the plugin goes).
void wait_compiles();

// Warnings the pool's compiles raised (a corrupt cache entry, a tier turned off), taken once: the
// caller re-raises them on its own thread, where Python's warning machinery sees them.
std::vector<std::string> take_compile_warnings();

}  // namespace torch_tpu::runtime
