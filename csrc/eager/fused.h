// Fused eager: ops are recorded as they come, and each run of them becomes ONE program.
//
// A record is an op's plan (its program, kept by the front-end as a private function) and where
// its arguments come from: a storage of the run (a "local") or a host operand uploaded when it was
// recorded (scalars, CPU tensors, RNG states: their values as of that moment). A flush runs the run
// as one fused executable, found by the run's signature (each record's plan id and wiring, and the
// locals still in use that it must output), so a steady loop runs its fused programs with no Python.
// On a signature's first flush the program is built by the front-end (torch_tpu/eager/fused.py).
//
// A run is flushed when the host reads device data (the runtime's host-read hook), when the mode
// changes, and at cut points. Cut points are content-defined over the op stream and nothing else:
// each op has the hash of (previous op, this op), and the stream is cut after op q when q's hash is
// smaller than those of the kCutRadius ops before it and no larger than those of the kCutRadius ops
// after it (decided kCutRadius ops later: the ops recorded after q carry over to the next run). The
// window starts afresh at each host read. No run length or position enters the rule, so a loop that
// repeats the same ops is cut at the same places in every iteration, whether it syncs at the same
// place every step or never, and its fused programs hit the cache from the first repeated iterations
// on. A loop shorter than kCutRadius has no such point
// (its minimum recurs on the left) and is cut by the length cap alone. A run reaching kMaxOps
// (a bound on the memory pending values hold) is cut after the last occurrence of its smallest hash
// (content-defined too), and the rest carries over.
//
// One more cut keeps results right: an op that writes part of a storage (a copy into a view) with a
// value the run computed from that same storage (y[1:3] = y[0:2].clone()) runs at the start of a new
// run, its value then an argument. XLA:CPU fuses such an update into an in-place
// dynamic_update_slice loop that reads the rows it has already written (rows shifted down came out
// as the first row repeated); a strict one-op program reads it from a buffer of its own.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <unordered_map>
#include <vector>

#include "eager/plan.h"
#include "runtime/runtime.h"

namespace torch_tpu::eager {

constexpr size_t kMaxOps = 512;
constexpr size_t kFusedPrograms = 1024;
constexpr size_t kCutRadius = 24;

// Where a program argument comes from: local storage `index` of the run, or host operand `index`.
struct Wire {
  bool local;
  int index;
};

struct Record {
  std::shared_ptr<const Plan> plan;
  std::vector<Wire> wiring;  // per program argument of the op
  std::vector<int> outs;     // per program output: the local it writes
  uint64_t pair = 0;         // hash of (previous op, this op) in the stream
};

// A fused executable and, per argument of its @main, where it comes from.
struct FusedProgram {
  std::shared_ptr<const pjrt::Executable> exe;
  std::vector<Wire> args;
};

// Builds (and compiles) the program of `records` returning `outputs` (locals). May throw.
using FusedBuilder = std::function<FusedProgram(const std::vector<Record>& records, const std::vector<int>& outputs)>;

// The executable of one op's plan that has none yet (built for fused eager, compiled on demand).
using OpExecutable = std::function<std::shared_ptr<const pjrt::Executable>(const Plan& plan)>;

struct FusedStats {
  int64_t ops = 0, flushes = 0, compiles = 0;
};

class FusedRecorder {
 public:
  // Records one op of `plan`: inputs[k] feeds program argument k (a cell, or a host buffer), and
  // program output k goes to `sinks[k]` (a tensor of the storage it writes). Flushes first when the
  // run is on another device; flushes at a cut point after it.
  void record(std::shared_ptr<const Plan> plan, std::vector<runtime::LaunchArg> inputs,
              std::vector<at::Tensor> input_tensors, std::vector<at::Tensor> sinks, int device);
  // Runs what was recorded (if anything) as one program.
  void flush();
  size_t pending();
  FusedStats stats();
  void reset_stats();
  void set_builder(FusedBuilder b, OpExecutable op_executable);

 private:
  struct Run {
    int device = -1;
    std::vector<Record> records;
    std::unordered_map<runtime::Cell*, int> local_of;
    // Per local storage: its cell as recorded, and the storage (kept alive until the flush; a
    // storage whose bytes are replaced, resize_, flushes the run first: csrc/aten/hooks.cc).
    std::vector<runtime::Cell*> cells;
    std::vector<c10::Storage> locals;
    std::vector<runtime::LaunchArg> host;
    std::vector<bool> written;
    // Per local: a bit set of the locals its value in this run was computed from (read by the ops
    // that wrote it, and what those read, transitively); empty for a value from before the run.
    std::vector<std::vector<uint64_t>> deps;
    int local(const at::Tensor& t);
    int local(runtime::Cell* c, const c10::Storage& storage);
  };
  void flush_locked(Run& run);
  void replay(Run& run);  // runs each record alone (a fused program failed to build)
  void split_locked(size_t k);  // flushes records [0, k], carries the rest over
  static void note_deps(Run& run, const Record& r);  // r's outputs now depend on what it read
  // Whether an op reading `input_tensors` and writing `sinks` writes part of a storage it also reads
  // while another of its inputs was computed in this run from that storage (the cut above).
  bool writes_what_it_derives(const std::vector<at::Tensor>& input_tensors, const std::vector<at::Tensor>& sinks) const;
  std::recursive_mutex mu_;
  Run run_;
  uint64_t prev_uid_ = 0;
  std::deque<uint64_t> window_;  // the stream's last 2 * kCutRadius + 1 pair hashes
  int64_t position_ = 0;         // stream position of the next record
  int64_t run_start_ = 0;        // stream position of the run's first record
  // Fused programs by run key; each holds its executable, so the least recently used go past
  // kFusedPrograms or runtime::kProgramCacheBytes (a run that recurs rebuilds from the compilation
  // cache's tiers).
  runtime::LruCache<std::vector<int64_t>, std::shared_ptr<const FusedProgram>, KeyHash> programs_{
      "fused programs", kFusedPrograms, runtime::kProgramCacheBytes};
  FusedBuilder builder_;
  OpExecutable op_executable_;
  FusedStats stats_;
};
FusedRecorder& fused();

}  // namespace torch_tpu::eager
