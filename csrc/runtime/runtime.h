// The TorchTPU runtime: the process-wide PJRT client (started lazily), device storage cells and
// the transfers and executions that move data in and out of them.
//
// A tpu storage's DataPtr points at a unique *fake* device address (so data_ptr(), offsets and
// `is_set_to` behave as on CPU) and carries a `Cell` as its context. The cell holds the storage's
// current PJRT buffer: `numel` elements of `dtype` in row-major order, as an array of `dims` (the
// shape of the tensor the storage was made for, so that programs pass arrays between each other
// in the shape they compute them: a TPU lays out a 1-D array differently from a 2-D one, and every
// change between them is a copy on the device). Programs never write a buffer
// in place; they return a new one, which replaces the cell's (the old one is donated when the
// program takes it as an argument, so in-place updates do not double memory).
#pragma once

#include <c10/core/ScalarType.h>

#include <array>
#include <atomic>
#include <condition_variable>
#include <deque>
#include <exception>
#include <functional>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "pjrt/pjrt.h"
#include "runtime/trace.h"

namespace torch_tpu::runtime {

// PJRT element type of a torch dtype; throws c10::Error for dtypes PJRT has no type for.
PJRT_Buffer_Type to_pjrt_type(c10::ScalarType t);
c10::ScalarType from_pjrt_type(PJRT_Buffer_Type t);

// The bytes of one tpu storage.
struct Cell {
  int device = 0;
  size_t nbytes = 0;
  uintptr_t addr = 0;
  // Element type, count and dims of `buffer`; fixed by the first typed use of the storage (the
  // allocation's `hint` where its dtype is that use's, else 1-D). A program's output sets dims to
  // its own, and every program that writes the cell again keeps them (donation needs equal types).
  std::optional<c10::ScalarType> dtype;
  int64_t numel = 0;
  std::vector<int64_t> dims;
  // What the storage was allocated for (empty, empty_strided): a dense tensor's sizes in memory order.
  std::optional<c10::ScalarType> hint_dtype;
  std::vector<int64_t> hint;
  std::shared_ptr<pjrt::Buffer> buffer;  // null: never written (reads as zeros)
  std::string producer;                  // the op whose program wrote `buffer` (error messages)
  // Set when the launch that was to give this never-written cell its first value failed: the cell
  // has no value, so reading it (a later launch, a download) raises this message instead of
  // reading zeros. Cells that already held a value keep it (a failed op changes nothing).
  std::shared_ptr<const std::string> error;
  // The host bytes of `buffer` when it was uploaded whole from a small host tensor (upload_ordered),
  // so that a program needing the value at another layout (a bucketed graph's padded input) can
  // upload it again instead of compiling a copy for each shape (issue 49). Every write of the cell
  // clears it (a launch with the cell among its sinks, an upload, a host adoption); set and read on
  // the threads that queue work, never by the launcher.
  std::shared_ptr<const std::vector<char>> host_copy;
};

// One argument of a launch: a storage's cell, whose buffer is taken when the launch is issued (after
// every launch queued before it); a buffer made for this launch (a host operand the caller
// uploaded); or (neither set, `words` true) two uint64 words (an rng op's (seed, offset)) that the
// launcher uploads just before the launch, so the thread that queues the op does no transfer of its own.
struct LaunchArg {
  Cell* cell = nullptr;
  std::shared_ptr<pjrt::Buffer> buffer;
  bool words = false;
  std::array<uint64_t, 2> value{};
};

// Counters reported by torch_tpu.metrics.
struct Counters {
  std::atomic<int64_t> compiles{0}, executions{0}, h2d_transfers{0}, d2h_transfers{0},
      h2d_bytes{0}, d2h_bytes{0}, host_syncs{0},
      busy_inputs_kept{0},  // inputs not donated because an earlier execution still used them
      graph_input_copies{0};  // compiled-graph inputs passed as copies (not their storage's buffer)
};
Counters& counters();

// A point in one device's work (what torch.Event records): every execution issued on the device
// before it. PJRT has no user streams; each device runs what the runtime issues to it, so a marker
// is the completion of the executions that were in flight when it was reached in the launch queue.
class Marker : public std::enable_shared_from_this<Marker> {
 public:
  // True once the marker was reached and every execution before it finished. Never blocks.
  bool query();
  // Blocks until query() is true; raises the error of a failed execution before it.
  void synchronize();
  // Steady-clock nanoseconds at which the last execution before it finished (or at which it was
  // reached, when nothing was in flight); nullopt while not complete.
  std::optional<int64_t> completed_ns();

 private:
  friend class Runtime;
  void reach(std::vector<std::shared_ptr<pjrt::Event>> inflight);  // on the launcher thread
  void finish_one(const std::string& error);
  std::mutex mu_;
  std::condition_variable cv_;
  bool reached_ = false;
  int remaining_ = 0;
  std::optional<int64_t> done_ns_;
  std::string error_;
};

class Runtime {
 public:
  static Runtime& get();

  // Chooses the plugin without starting it. `plugin_path` is the .so; when it is empty,
  // `error` is raised on first use instead (e.g. "TORCH_TPU_PJRT_PLUGIN=cuda but ...").
  // `key_value_store`, where given, is called once when the client starts, for the store its
  // processes share (a multi-process job: pjrt::Client::create's kv callbacks).
  void configure(const std::string& plugin_path, const std::string& error,
                 const std::vector<std::pair<std::string, int64_t>>& options,
                 std::function<std::shared_ptr<pjrt::KeyValueStore>()> key_value_store = nullptr);
  // The plugin configure() chose ("": none; its error is raised on first use). Starts nothing.
  const std::string& configured_plugin() const { return plugin_path_; }
  bool started() const { return started_client_.load(std::memory_order_acquire) != nullptr; }
  // Starts the client on first call; throws (with the plugin's message) when it cannot, and in a
  // child forked after the client started (see in_bad_fork).
  pjrt::Client& client();
  // True in a process forked after the client started: PJRT's client, its worker threads and the
  // launcher thread do not survive fork(), so every launch, transfer and wait there would hang.
  // Such a child gets a RuntimeError instead (as torch.cuda's "Cannot re-initialize CUDA in
  // forked subprocess"); its inherited tpu storages are leaked, not freed, at exit.
  static bool in_bad_fork();
  // Number of devices; 0 when the client cannot start. Never throws. For the CPU plugin it is the
  // configured cpu_device_count and does not start the client; other plugins start it if needed.
  int device_count_noexcept() noexcept;

  // Storage cells, found by their fake address.
  Cell* new_cell(size_t nbytes, int device);
  void free_cell(Cell* cell);
  Cell* cell_at(const void* addr);  // cell whose range holds addr, or nullptr

  // The storages alive on a device, as PyTorch's device allocators count them (torch.tpu and
  // torch.accelerator memory functions): a storage counts from its allocation to its free, whether
  // or not its PJRT buffer exists yet, on every plugin. Bytes and counts: current, peak since the
  // last reset_peak_memory, and accumulated allocations and frees since reset_accumulated_memory.
  struct MemoryCounters {
    int64_t bytes = 0, peak_bytes = 0, allocated_bytes = 0, freed_bytes = 0;
    int64_t count = 0, peak_count = 0, allocations = 0, frees = 0;
  };
  MemoryCounters memory(int device);
  void reset_peak_memory(int device);
  void reset_accumulated_memory(int device);

  // Gives `cell` a typed layout if it has none yet (numel = nbytes / itemsize; dims = the
  // allocation's hint when it is for `dtype` and covers the storage, else {numel}).
  void ensure_typed(Cell& cell, c10::ScalarType dtype);
  // Records what the cell was allocated for (a dense tensor of `dims` in memory order), before its
  // first typed use; ignored after it.
  static void hint_layout(Cell& cell, c10::ScalarType dtype, std::vector<int64_t> dims);
  // The cell's buffer, creating a zero-filled one if it has never been written. Called where no
  // queued launch can write the cell (after drain(), or by the launcher itself). Throws
  // PjrtError when the launch that was to write the cell failed (Cell::error).
  pjrt::Buffer& materialize(Cell& cell);
  // The buffer launch argument `a` passes on `device`: its cell's (materialized), its own, or its
  // words uploaded now (kept alive in `uploads` for the launch). On the launcher thread.
  pjrt::Buffer* arg_buffer(const LaunchArg& a, int device, std::vector<std::shared_ptr<pjrt::Buffer>>& uploads);
  // Replaces the cell's contents with `numel` host elements of `dtype` (dense), as an array of the
  // cell's dims where they hold `numel` elements of `dtype`, else 1-D. Raises only its own errors
  // (an earlier launch's stays for the next sync).
  void upload(Cell& cell, const void* data, c10::ScalarType dtype, int64_t numel);
  // Replaces the whole cell's contents with `numel` dense host elements of `dtype`, in order after
  // the launches queued before it but without waiting for them (upload() waits): the buffer is made
  // now, so `data` may change once this returns, and becomes the cell's when the launch queue reaches
  // it. No program runs, so no shape compiles one. Keeps the bytes as Cell::host_copy when they are
  // at most `keep_host_bytes`. The caller checks that the cell is untyped or of `dtype` and holds
  // exactly `numel` elements.
  void upload_ordered(Cell& cell, const void* data, c10::ScalarType dtype, int64_t numel, size_t keep_host_bytes);
  // Replaces the cell's contents with host memory the device may read in place (no copy where
  // device memory is host memory, as on the CPU plugin). `data` must stay valid and unchanged until
  // `release` is called.
  void adopt_host(Cell& cell, const void* data, c10::ScalarType dtype, int64_t numel, std::function<void()> release);
  // Copies the whole cell (its `numel` elements) into `dst` and waits.
  void download(Cell& cell, void* dst, size_t size);
  // Host-side byte copy between cells (resize_ growth, Allocator::copy_data).
  void copy_bytes(Cell& dst, const Cell& src, size_t count);

  // Runs `exe` on `device`; output i replaces sinks[i]'s buffer. `producer` names the op(s), so that
  // an error of this asynchronous execution, surfacing later, can say where it came from.
  // Launches are queued, in order, for one launcher thread that issues them (PJRT Execute runs a
  // small program to completion before it returns, so issuing on the caller would serialize host
  // and device work); the sinks' element type and count are set at once. Every host access to a
  // cell's buffer (upload, download, byte copies, synchronize) waits for the queue first.
  // TORCH_TPU_ASYNC_LAUNCH=0 issues on the caller instead.
  // While a profiler records tpu executions (trace.h), the execution is recorded under `trace_name`
  // with `producer` as its detail, or under `producer` when `trace_name` is empty.
  void execute(std::shared_ptr<const pjrt::Executable> exe, std::vector<LaunchArg> args,
               std::vector<Cell*> sinks, int device, std::string producer, std::string trace_name = {});
  // One device's part of a replicated launch: its arguments, the cells its outputs replace, the device.
  struct ReplicaPart {
    std::vector<LaunchArg> args;
    std::vector<Cell*> sinks;
    int device = 0;
  };
  // Runs `exe`, compiled for one replica on each of the parts' devices (pjrt::replica_compile_options
  // with their ids, in this order: a collective program across local devices), as one queued launch:
  // every part's outputs replace its sinks' buffers. A failed launch writes no sink on any device.
  void execute_replicas(std::shared_ptr<const pjrt::Executable> exe, std::vector<ReplicaPart> parts,
                        std::string producer);
  // Waits until every queued launch has been issued; raises the first error one of them met.
  void drain();
  // Waits until every queued launch has been issued, leaving a launch's error for the next drain():
  // a host write into a cell (upload, adopt_host) must follow the launches queued before it, but an
  // earlier op's failure is not the write's (a collective's write-back would take it as its own).
  void wait_issued();
  // Raises (once) the first error a launch met when it was issued, without waiting for the queue.
  void raise_launch_error();
  // Called before the host reads device data (downloads, synchronize): fused eager flushes its
  // recorded ops there.
  void set_host_read_hook(std::function<void()> hook) { hook_ = std::move(hook); }
  // Runs that hook: issues what fused eager has recorded, so that what comes next (a host write
  // into a cell, a collective) is ordered after it.
  void flush_recorded() { run_hook(); }
  // Waits for every execution issued so far on `device` (-1: all); raises their errors.
  void synchronize(int device);
  // A marker after every launch queued so far on `device` (fused eager's recorded ops flushed
  // first); see Marker. Does not block.
  std::shared_ptr<Marker> mark(int device);
  // True when nothing is queued and no execution issued on `device` is still running.
  bool idle(int device);

 private:
  std::mutex mu_;
  std::function<std::shared_ptr<pjrt::KeyValueStore>()> key_value_store_;
  std::string plugin_path_, config_error_ = "TorchTPU's runtime was not configured: import torch_tpu first";
  std::vector<std::pair<std::string, int64_t>> options_;
  std::shared_ptr<pjrt::Client> client_;  // under mu_
  // client_.get(), published once the client has fully started: read without mu_ on every call.
  std::atomic<pjrt::Client*> started_client_{nullptr};
  std::map<uintptr_t, Cell*> cells_;
  std::map<int, MemoryCounters> memory_;  // by device, under mu_
  uintptr_t next_addr_ = uintptr_t(1) << 44;
  void run_hook() {
    if (hook_) hook_();
  }
  std::function<void()> hook_;
  // Completion events of the executions issued on each device that may still be running.
  std::map<int, std::vector<std::shared_ptr<pjrt::Event>>> inflight_;
  std::vector<std::shared_ptr<pjrt::Event>> take_inflight(int device);  // the unfinished ones; mu_ held
  // Outputs not yet awaited, with the op that produces each.
  std::vector<std::pair<std::weak_ptr<pjrt::Buffer>, std::string>> pending_;
  // The indices of `args` not to donate. Donating a buffer that an execution still uses (its
  // pjrt::Buffer::last_use) makes PJRT block the launching thread until it finishes (no overlap of
  // host work with device work), so execute() does not donate small busy inputs: the output is a
  // fresh buffer and PJRT frees the old one once its users finish. Bounded per launch by
  // keep_busy_bytes() (env TORCH_TPU_KEEP_BUSY_BYTES, default 256 KiB): a large fresh buffer costs
  // more to touch the first time than the wait, so past it inputs are donated.
  std::vector<int64_t> busy_inputs(const std::vector<pjrt::Buffer*>& args, const std::vector<Cell*>& sinks);
  // The launch queue (see execute) and its thread; `deferred` queues work behind pending launches.
  // torch.OutOfMemoryError's message for a launch of `exe` that could not allocate its results
  // (the plugin's std::bad_alloc or PJRT's RESOURCE_EXHAUSTED `cause`): what it needed, what the
  // process's tensors hold, what to do.
  std::string out_of_memory_message(const pjrt::Executable& exe, int device, const std::string& producer,
                                    const std::string& cause);
  void issue(const pjrt::Executable& exe, const std::vector<LaunchArg>& args, const std::vector<Cell*>& sinks,
             int device, const std::string& producer, const std::shared_ptr<trace::Execution>& rec);
  void issue_replicas(const pjrt::Executable& exe, const std::vector<ReplicaPart>& parts, const std::string& producer);
  // The pieces of a launch both issue paths share: the type of never-written argument cells and the
  // sinks' element type and dims, set on the caller's thread when the launch is queued (the launcher
  // only reads them); the sinks without a value yet; what a failed launch leaves (called from a catch
  // block: marks `fresh` as failed and rethrows, as torch.OutOfMemoryError where the device ran out);
  // what an issued one records (mu_ held).
  void prepare_launch(const pjrt::Executable& exe, const std::vector<LaunchArg>& args, const std::vector<Cell*>& sinks,
                      const std::string& producer);
  static std::vector<Cell*> unwritten(const std::vector<Cell*>& sinks);
  [[noreturn]] void launch_failed(const pjrt::Executable& exe, int device, const std::string& producer,
                                  const std::vector<Cell*>& fresh, const std::exception& e);
  void launched(const std::shared_ptr<pjrt::Event>& done, const std::vector<pjrt::Buffer*>& bufs,
                const std::vector<std::shared_ptr<pjrt::Buffer>>& outs, const std::vector<Cell*>& sinks, int device,
                const std::string& producer);
  bool defer(std::function<void()> job);
  void enqueue(std::function<void()> job);  // onto the launch queue, starting its thread once
  void upload_now(Cell& cell, const void* data, c10::ScalarType dtype, int64_t numel);
  void set_uploaded(Cell& cell, std::shared_ptr<pjrt::Buffer> buf, c10::ScalarType dtype, std::vector<int64_t> dims);
  void launcher_loop();
  std::mutex qmu_;
  std::condition_variable qwork_, qidle_;
  std::deque<std::function<void()>> queue_;
  bool issuing_ = false;
  bool launcher_started_ = false;
  std::exception_ptr launch_error_;
};

}  // namespace torch_tpu::runtime
