// tpu_dist: the c10d Backend for tpu tensors (torch.distributed.init_process_group("tpu_dist")).
//
// One process per device. A collective takes tpu tensors and leaves its results in them, with the
// semantics of c10d's Backend API (the same as Gloo's on CPU tensors and NCCL's on CUDA ones).
// Where it runs:
//   - Host-staged (built here, `host_`): the PJRT plugin has no cross-process collectives (the
//     CPU plugin), so each collective copies its inputs device -> host once (into pooled staging
//     buffers), runs on a CPU c10d Backend (PyTorch's ProcessGroupGloo, created on the same store),
//     and hands the results to the device (no copy where device memory is host memory).
//   - On the device (`device_`, device_collectives.h; where the plugin has cross-process collectives:
//     libtpu over ICI, NCCL inside the CUDA plugin): all_reduce, broadcast, reduce,
//     all_gather_into_tensor, reduce_scatter_tensor, all_to_all_single with even splits, send and
//     recv (from a given rank) run as one StableHLO collective program over the group's devices
//     (send/recv: the two peers'), with no host copy; the other calls
//     stage through the host as above. Compiled graphs are still cut at their functional
//     collectives (torch_tpu/dynamo/collectives.py); torch_tpu.aot lowers them into the module.
//
// Ordering: inputs are read when the collective is called (the copy to the host waits for their
// pending writes, fused eager runs included); results are written back, in call order, by the
// backend's completion thread before the Work completes, so after wait() every later op sees
// them. A failed collective writes nothing: the tensors it would have written keep their values.
#pragma once

#include <torch/csrc/distributed/c10d/Backend.hpp>
#include <torch/csrc/distributed/c10d/Work.hpp>

#include "distributed/device_collectives.h"

#include <chrono>
#include <condition_variable>
#include <deque>
#include <functional>
#include <mutex>
#include <set>
#include <string>
#include <thread>
#include <vector>

namespace torch_tpu::distributed {

// The completion of one tpu_dist call. Its future's value is the list of tpu tensors the call
// wrote (what DDP's communication hooks read); wait() raises the call's error.
class TpuWork : public c10d::Work {
 public:
  TpuWork(int rank, c10d::OpType op, std::vector<at::Tensor> outputs, c10::intrusive_ptr<c10::ivalue::Future> future,
          c10::intrusive_ptr<c10d::Work> host);
  bool isCompleted() override;
  bool isSuccess() const override;
  std::exception_ptr exception() const override;
  std::vector<at::Tensor> result() override;
  // Blocks until the results are in the tpu tensors; raises the collective's error (a
  // DistBackendError naming the collective and the group). `timeout` 0: the group's timeout.
  bool wait(std::chrono::milliseconds timeout) override;
  void synchronize() override {}
  int sourceRank() const override { return host_ ? host_->sourceRank() : -1; }  // recv from any source
  c10::intrusive_ptr<c10::ivalue::Future> getFuture() override { return future_; }

 private:
  std::vector<at::Tensor> outputs_;
  c10::intrusive_ptr<c10::ivalue::Future> future_;
  c10::intrusive_ptr<c10d::Work> host_;
};

class TpuBackend : public c10d::Backend {
 public:
  // `host`: the CPU backend collectives are staged through (ProcessGroupGloo on the same store,
  // same rank and size). `timeout`: the group's; a collective that has not finished by then raises.
  // `device`: the group's device path (null: every collective stages through `host`).
  TpuBackend(c10::intrusive_ptr<c10d::Backend> host, int rank, int size, std::chrono::milliseconds timeout,
             std::shared_ptr<DeviceCollectives> device = nullptr);
  ~TpuBackend() override;

  const std::string getBackendName() const override { return "tpu_dist"; }
  void setTimeout(std::chrono::milliseconds timeout) override { timeout_ = timeout; }
  // split_group / DeviceMesh: the sub-group splits the host backend and stages through that.
  bool supportsSplitting() const override { return host_->supportsSplitting(); }
  c10::intrusive_ptr<Options> getBackendOptions() override { return host_->getBackendOptions(); }
  // The group's collective sequence number (desync debugging) is the host backend's.
  void setSequenceNumberForGroup() override { host_->setSequenceNumberForGroup(); }
  uint64_t getSequenceNumberForGroup() override { return host_->getSequenceNumberForGroup(); }
  c10::intrusive_ptr<c10d::Backend> split(const c10::intrusive_ptr<c10d::Store>& store, const std::vector<int>& ranks,
                                          const c10::intrusive_ptr<Options>& opts) override;

  c10::intrusive_ptr<c10d::Work> broadcast(std::vector<at::Tensor>& tensors, const c10d::BroadcastOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> allreduce(std::vector<at::Tensor>& tensors, const c10d::AllreduceOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> allreduce_coalesced(std::vector<at::Tensor>& tensors,
                                                     const c10d::AllreduceCoalescedOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> reduce(std::vector<at::Tensor>& tensors, const c10d::ReduceOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> allgather(std::vector<std::vector<at::Tensor>>& outputs,
                                           std::vector<at::Tensor>& inputs, const c10d::AllgatherOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> _allgather_base(at::Tensor& output, at::Tensor& input,
                                                 const c10d::AllgatherOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> allgather_coalesced(std::vector<std::vector<at::Tensor>>& outputs,
                                                     std::vector<at::Tensor>& inputs,
                                                     const c10d::AllgatherOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> allgather_into_tensor_coalesced(std::vector<at::Tensor>& outputs,
                                                                 std::vector<at::Tensor>& inputs,
                                                                 const c10d::AllgatherOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> gather(std::vector<std::vector<at::Tensor>>& outputs, std::vector<at::Tensor>& inputs,
                                        const c10d::GatherOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> scatter(std::vector<at::Tensor>& outputs, std::vector<std::vector<at::Tensor>>& inputs,
                                         const c10d::ScatterOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> reduce_scatter(std::vector<at::Tensor>& outputs,
                                                std::vector<std::vector<at::Tensor>>& inputs,
                                                const c10d::ReduceScatterOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> _reduce_scatter_base(at::Tensor& output, at::Tensor& input,
                                                      const c10d::ReduceScatterOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> reduce_scatter_tensor_coalesced(std::vector<at::Tensor>& outputs,
                                                                 std::vector<at::Tensor>& inputs,
                                                                 const c10d::ReduceScatterOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> alltoall_base(at::Tensor& output, at::Tensor& input, std::vector<int64_t>& output_splits,
                                               std::vector<int64_t>& input_splits,
                                               const c10d::AllToAllOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> alltoall(std::vector<at::Tensor>& outputs, std::vector<at::Tensor>& inputs,
                                          const c10d::AllToAllOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> send(std::vector<at::Tensor>& tensors, int dst, int tag) override;
  c10::intrusive_ptr<c10d::Work> recv(std::vector<at::Tensor>& tensors, int src, int tag) override;
  c10::intrusive_ptr<c10d::Work> recvAnysource(std::vector<at::Tensor>& tensors, int tag) override;
  c10::intrusive_ptr<c10d::Work> barrier(const c10d::BarrierOptions& opts) override;

  // At interpreter exit (torch_tpu's atexit hook, before finalization): waits for every live
  // tpu_dist backend's queued calls to finish (each within its group's timeout), then releases the
  // completed calls' futures. An async collective nobody waited for holds the caller's tensors; they
  // are released here, while Python can still run their finalizers, not by the completion thread
  // after the interpreter is gone. Call without the GIL.
  static void drain_all();

 private:
  // One tpu tensor the call writes, and the host tensor its result arrives in.
  struct WriteBack {
    at::Tensor device;
    at::Tensor host;
  };
  struct Call {
    c10d::OpType op = c10d::OpType::UNKNOWN;
    const char* name = "";
    std::vector<at::Tensor> outputs;       // the future's value
    std::vector<WriteBack> write_back;     // copied host -> device after the host work succeeds
    std::function<void()> after_host;      // e.g. AVG's division, on the host tensors
  };

  // Checks that `t` is a dense tpu tensor (`what` names it in the error).
  void check(const at::Tensor& t, const char* name, const char* what) const;
  void check_root(int64_t root, const char* name) const;
  void check_peer(int peer, const char* name) const;  // send/recv: another rank of the group
  // all_gather_into_tensor / reduce_scatter_tensor: `whole` has `size` x `part`'s elements, of its
  // dtype (only the element count matters, as with NCCL).
  void check_sizes(const char* name, const at::Tensor& whole, const at::Tensor& part, int64_t size) const;
  // check + stage each tensor (inputs read by the host backend).
  std::vector<at::Tensor> stage_all(const std::vector<at::Tensor>& ts, const char* name, const char* what) const;
  std::vector<std::vector<at::Tensor>> stage_lists(const std::vector<std::vector<at::Tensor>>& lists,
                                                   const char* name) const;
  // check + receive_into each tensor (outputs the call writes; they become the future's value).
  std::vector<at::Tensor> receive_all(const std::vector<at::Tensor>& ts, Call& call, const char* what,
                                      bool copy_value = false) const;
  std::vector<std::vector<at::Tensor>> receive_lists(const std::vector<std::vector<at::Tensor>>& lists,
                                                     Call& call) const;
  // The in-place reductions (all_reduce, its coalesced form, reduce's root): read and written.
  std::vector<at::Tensor> reduced(const std::vector<at::Tensor>& tensors, Call& call, const c10d::ReduceOp& op);
  // Makes every rank agree, before the collective, that all call `name` with the same dtypes (and,
  // when `shapes`, the same shapes) of `tensors`: one small all-gather on the host backend. Gloo
  // aborts the process on a size mismatch; this raises a ValueError naming each rank's call on
  // every rank instead, with nothing changed. TORCH_TPU_DIST_VERIFY=0 skips it.
  void agree(const char* name, c10d::OpType op, const std::vector<at::Tensor>& tensors, bool shapes);
  // The device -> host copy of an input (contiguous, as the host backend needs).
  at::Tensor stage(const at::Tensor& t) const;
  // The host -> device move of a result into the caller's tensor: the device takes the host
  // tensor's memory as the tensor's new value (no copy on the CPU plugin); a view writes into its
  // base through one copy program.
  static void write_back(const at::Tensor& device, const at::Tensor& host);
  // A contiguous host tensor, from a pool of staging buffers: a fresh one costs page faults on
  // every touch (measured: a 64 MiB device-to-host copy, 51 ms into a fresh tensor, 8 ms into a
  // reused one). A pooled buffer is reused once nothing else holds it (a device buffer that took
  // it over holds it until that buffer is gone).
  at::Tensor host_tensor(at::IntArrayRef sizes, at::ScalarType dtype) const;
  // A contiguous host tensor for the result of `t`, recorded to be written back into `t`.
  at::Tensor receive_into(const at::Tensor& t, Call& call, bool copy_value = false) const;
  // Runs `start` (which calls the host backend) and queues the completion: wait for the host
  // work, after_host, write back, complete the future.
  c10::intrusive_ptr<c10d::Work> run(Call call, const std::function<c10::intrusive_ptr<c10d::Work>()>& start);
  // The device path of a one-tensor collective: `sig` (kind, op, root; shape and dims filled here)
  // reads `input` and writes `output` (either may be a view: staged through a dense copy). The Work
  // is complete once the program is queued (see device_collectives.h).
  // `flat`: the program sees the tensors as 1-D (all_gather, reduce_scatter, all_to_all, which c10d
  // defines on element counts); `peer`: send/recv, over the sender and the receiver only.
  c10::intrusive_ptr<c10d::Work> on_device(Call call, CollectiveSignature sig, const at::Tensor& input,
                                           const at::Tensor& output, bool flat, bool peer = false);
  // c10d's reduce op as lowering/collectives.py names it; PREMUL_SUM refused as on the host path.
  std::string device_op(const c10d::ReduceOp& op, const char* name) const;
  std::string describe(const char* name) const;
  // AVG has no Gloo counterpart: SUM, then divide on the host (integers: truncating, as NCCL).
  c10d::ReduceOp host_op(const c10d::ReduceOp& op, const char* name) const;
  std::function<void()> averaging(const c10d::ReduceOp& op, std::vector<at::Tensor> host) const;

  c10::intrusive_ptr<c10d::Backend> host_;
  std::shared_ptr<DeviceCollectives> device_;
  std::chrono::milliseconds timeout_;
  bool verify_ = true;
  mutable std::mutex pool_mu_;
  mutable std::vector<at::Tensor> pool_;  // 1-D uint8 staging buffers
  static constexpr size_t kPoolBuffers = 16;

  // The completion thread: finishes calls in the order they were made.
  void completion_loop();
  // The completion thread never drops the last reference to a completed future (its value holds
  // the caller's tensors, whose Python objects need the GIL to be released, which a finalizing
  // interpreter no longer grants): it leaves them here, for the next call or the destructor.
  void retire(c10::intrusive_ptr<c10::ivalue::Future> future);
  std::vector<c10::intrusive_ptr<c10::ivalue::Future>> retired_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::condition_variable idle_cv_;  // signalled when the queue empties and no job runs
  std::deque<std::function<void()>> jobs_;
  bool running_ = false;  // the completion thread is inside a job
  bool stop_ = false;
  void drain();
  static std::mutex& live_mu();
  static std::set<TpuBackend*>& live();  // every constructed, not yet destroyed backend
  std::thread worker_;
};

}  // namespace torch_tpu::distributed
