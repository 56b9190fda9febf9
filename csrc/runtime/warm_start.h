// A warm process starts warm. Loading an executable from the disk cache costs about 2 ms on the CPU
// plugin (the plugin links its code), so a process whose programs are all on disk still paid that
// for each of them on its first step, one after another as its ops asked (the README's digits CNN:
// 82 programs, 90 ms of a 160 ms first epoch against 70 ms for a later one).
//
// So each process writes, at exit, the keys of the programs it used, in the order it first used
// them (CompileCache::used_keys), into a manifest beside the executables, named by its command line
// (torch_tpu.runtime.configure_cache); a later process with the same command line queues loads of
// those executables on the compile pool's threads as soon as its client starts, while it is still
// building its model and reading its data. A program it asks for before its load ran is loaded by
// its own request as before (compile_pool.h: requests go first); loads still queued at exit are
// dropped. A manifest that does not parse is ignored; one for other programs costs loads only.
#pragma once

#include <string>

#include "pjrt/pjrt.h"

namespace torch_tpu::runtime::warm_start {

// The manifest's path ("" : off: no prefetch, nothing written). Set before the client starts to
// prefetch in this process.
void set_manifest(const std::string& path);
// The client has started: queues loads of the manifest's programs (compile_pool.h's prefetch_async).
void on_client_start(pjrt::Client& client);
// At exit: drops the loads not yet started and writes this process's manifest (atomically: a
// temporary file renamed over it) when it used any program. File errors are ignored (a cold start
// next time is all they cost).
void finish();

}  // namespace torch_tpu::runtime::warm_start
