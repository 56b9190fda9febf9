// tpu_dist's Backend over a host transport (see backend.h).
#include "distributed/backend.h"

#include "aten/device.h"
#include "runtime/runtime.h"
#include "runtime/settings.h"

#include <ATen/ATen.h>
#include <c10/core/DeviceGuard.h>
#include <c10/util/Exception.h>

#include <algorithm>
#include <cstdlib>

namespace torch_tpu::distributed {

namespace {

c10::intrusive_ptr<c10::ivalue::Future> tensor_list_future() {
  return c10::make_intrusive<c10::ivalue::Future>(c10::ListType::ofTensors());
}

std::exception_ptr backend_error(const std::string& msg) {
  try {
    C10_THROW_ERROR(DistBackendError, msg);
  } catch (...) {
    return std::current_exception();
  }
}

// The message of an error, without the C++ backtrace c10::Error carries.
std::string message(const std::exception& e) {
  if (auto* c10e = dynamic_cast<const c10::Error*>(&e)) return c10e->what_without_backtrace();
  return e.what();
}

}  // namespace

// ---------------------------------------------------------------------------------------------
TpuWork::TpuWork(int rank, c10d::OpType op, std::vector<at::Tensor> outputs,
                 c10::intrusive_ptr<c10::ivalue::Future> future, c10::intrusive_ptr<c10d::Work> host)
    : c10d::Work(rank, op), outputs_(std::move(outputs)), future_(std::move(future)), host_(std::move(host)) {}

bool TpuWork::isCompleted() { return future_->completed(); }

bool TpuWork::isSuccess() const { return future_->completed() && !future_->hasError(); }

std::exception_ptr TpuWork::exception() const {
  return future_->completed() && future_->hasError() ? future_->exception_ptr() : nullptr;
}

std::vector<at::Tensor> TpuWork::result() { return outputs_; }

bool TpuWork::wait(std::chrono::milliseconds) {
  // The host work is waited for with the group's timeout on the completion thread, so the future
  // always completes: with the results written back, or with the error.
  future_->wait();
  if (future_->hasError()) std::rethrow_exception(future_->exception_ptr());
  return true;
}

// ---------------------------------------------------------------------------------------------
TpuBackend::TpuBackend(c10::intrusive_ptr<c10d::Backend> host, int rank, int size, std::chrono::milliseconds timeout,
                       std::shared_ptr<DeviceCollectives> device)
    : c10d::Backend(rank, size), host_(std::move(host)), device_(std::move(device)), timeout_(timeout) {
  TORCH_CHECK(host_, "tpu_dist needs a host backend to stage collectives through");
  verify_ = settings::enabled("TORCH_TPU_DIST_VERIFY");
  worker_ = std::thread([this] { completion_loop(); });
  std::lock_guard<std::mutex> g(live_mu());
  live().insert(this);
}

TpuBackend::~TpuBackend() {
  {
    std::lock_guard<std::mutex> g(live_mu());
    live().erase(this);
  }
  {
    std::lock_guard<std::mutex> g(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  if (worker_.joinable()) worker_.join();
}

c10::intrusive_ptr<c10d::Backend> TpuBackend::split(const c10::intrusive_ptr<c10d::Store>& store,
                                                    const std::vector<int>& ranks,
                                                    const c10::intrusive_ptr<Options>& opts) {
  auto host = host_->split(store, ranks, opts);
  if (!host) return nullptr;  // this rank is not in `ranks`
  return c10::make_intrusive<TpuBackend>(host, host->getRank(), host->getSize(), opts ? opts->timeout : timeout_);
}

void TpuBackend::completion_loop() {
  pthread_setname_np(pthread_self(), "tpu_dist");
  for (;;) {
    std::function<void()> job;
    {
      std::unique_lock<std::mutex> lk(mu_);
      running_ = false;
      if (jobs_.empty()) idle_cv_.notify_all();
      cv_.wait(lk, [this] { return stop_ || !jobs_.empty(); });
      if (jobs_.empty()) return;  // stopping, and every queued call has finished
      job = std::move(jobs_.front());
      jobs_.pop_front();
      running_ = true;
    }
    job();
    job = nullptr;  // what the job captured goes before the queue reads as idle
  }
}

void TpuBackend::drain() {
  std::vector<c10::intrusive_ptr<c10::ivalue::Future>> done;
  {
    std::unique_lock<std::mutex> lk(mu_);
    idle_cv_.wait(lk, [this] { return jobs_.empty() && !running_; });
    done.swap(retired_);
  }
  // Released on this thread: a tensor whose Python object outlived its last Python reference
  // takes the GIL to release it, which the interpreter still grants.
}

std::mutex& TpuBackend::live_mu() {
  static auto* mu = new std::mutex();
  return *mu;
}

std::set<TpuBackend*>& TpuBackend::live() {
  static auto* backends = new std::set<TpuBackend*>();
  return *backends;
}

void TpuBackend::drain_all() {
  // Held throughout: a backend destroyed meanwhile (by another thread) waits for its drain to end.
  std::lock_guard<std::mutex> g(live_mu());
  for (TpuBackend* b : live()) b->drain();
}

std::string TpuBackend::describe(const char* name) const {
  std::string desc = getGroupDesc();
  std::string uid = getGroupUid();
  return std::string("tpu_dist ") + name + " on process group '" + (desc.empty() ? uid : desc) + "' (rank " +
         std::to_string(rank_) + " of " + std::to_string(size_) + ")";
}

void TpuBackend::check(const at::Tensor& t, const char* name, const char* what) const {
  TORCH_CHECK(t.defined(), describe(name), ": the ", what, " is an undefined tensor");
  TORCH_CHECK(t.device().type() == c10::DeviceType::PrivateUse1, describe(name), ": the ", what, " is a ",
              t.device().str(), " tensor, but tpu_dist runs collectives on tpu tensors. Move it with .to('tpu'), "
              "or give CPU tensors to a gloo group (init_process_group('cpu:gloo,tpu:tpu_dist') serves both).");
  TORCH_CHECK(t.layout() == c10::kStrided, describe(name), ": the ", what, " has layout ", t.layout(),
              "; tpu_dist takes dense (strided) tensors");
}

void TpuBackend::check_root(int64_t root, const char* name) const {
  TORCH_CHECK_VALUE(root >= 0 && root < size_, describe(name), ": invalid root rank ", root,
                    " (the group has ranks 0..", size_ - 1, ")");
}

namespace {
constexpr int64_t kPrint = 8;  // dims of the first tensor kept for the error message
constexpr int64_t kFingerprint = 5 + kPrint;

std::string render(const int64_t* fp) {
  std::string s = c10d::opTypeToString(static_cast<c10d::OpType>(fp[0]));
  if (fp[1] == 0) return s;
  s += " of " + std::to_string(fp[1]) + " tensor(s), the first ";
  s += fp[3] < 0 ? std::string("?") : std::string(c10::toString(static_cast<c10::ScalarType>(fp[3])));
  if (fp[4] >= 0) {
    s += "[";
    for (int64_t d = 0; d < std::min(fp[4], kPrint); ++d) s += (d ? ", " : "") + std::to_string(fp[5 + d]);
    if (fp[4] > kPrint) s += ", ...";
    s += "]";
  }
  return s;
}
}  // namespace

void TpuBackend::agree(const char* name, c10d::OpType op, const std::vector<at::Tensor>& tensors, bool shapes) {
  if (!verify_ || size_ < 2) return;
  std::vector<int64_t> fp(kFingerprint, -1);
  fp[0] = static_cast<int64_t>(op);
  fp[1] = static_cast<int64_t>(tensors.size());
  uint64_t h = 1469598103934665603ull;  // FNV-1a over every tensor's dtype (and sizes)
  auto mix = [&h](int64_t v) { h = (h ^ static_cast<uint64_t>(v)) * 1099511628211ull; };
  for (const auto& t : tensors) {
    mix(static_cast<int64_t>(t.scalar_type()));
    if (shapes) {
      mix(t.dim());
      for (int64_t d : t.sizes()) mix(d);
    }
  }
  fp[2] = static_cast<int64_t>(h >> 1);
  if (!tensors.empty()) {
    fp[3] = static_cast<int64_t>(tensors[0].scalar_type());
    if (shapes) {
      fp[4] = tensors[0].dim();
      for (int64_t d = 0; d < std::min<int64_t>(tensors[0].dim(), kPrint); ++d) fp[5 + d] = tensors[0].size(d);
    }
  }
  at::Tensor mine = at::tensor(fp, at::kLong);
  at::Tensor all = at::empty({size_ * kFingerprint}, at::kLong);
  try {
    host_->_allgather_base(all, mine)->wait(timeout_);
  } catch (const std::exception& e) {
    std::rethrow_exception(backend_error(describe(name) + " failed: " + message(e) +
                                         "\n(the tensors it would have written keep their values)"));
  }
  const int64_t* rows = all.const_data_ptr<int64_t>();
  bool same = true;
  for (int64_t r = 0; r < size_ && same; ++r) same = std::equal(fp.begin(), fp.begin() + 3, rows + r * kFingerprint);
  if (same) return;
  std::string msg = describe(name) + ": the ranks did not make the same call (every rank must call the same "
                    "collective with the same dtypes" + (shapes ? std::string(" and shapes") : std::string()) + "):";
  for (int64_t r = 0; r < size_; ++r) msg += "\n  rank " + std::to_string(r) + ": " + render(rows + r * kFingerprint);
  msg += "\nNothing was changed.";
  TORCH_CHECK_VALUE(false, msg);
}

namespace {
// Whether `t` is its storage's whole buffer (dense, row-major, from offset 0, of the storage's
// element type): then it moves between host and device as one transfer, with no program.
bool whole(const at::Tensor& t) {
  runtime::Cell* c = aten::cell_of(t);
  return t.storage_offset() == 0 && t.is_contiguous() && static_cast<size_t>(t.nbytes()) == c->nbytes &&
         (!c->dtype || *c->dtype == t.scalar_type());
}

// c10d's list forms on the device path: `n` tensors of `like`'s device, shape and dtype (what Gloo
// and NCCL require of them), run as the one-tensor form on their concatenation. Anything else takes
// the host path, which raises c10d's own errors.
bool uniform(const std::vector<at::Tensor>& ts, const at::Tensor& like, size_t n) {
  if (ts.size() != n || !like.defined()) return false;
  return std::all_of(ts.begin(), ts.end(), [&](const at::Tensor& t) {
    return t.defined() && t.device() == like.device() && t.sizes() == like.sizes() &&
           t.scalar_type() == like.scalar_type();
  });
}

bool one_dtype(const std::vector<at::Tensor>& ts) {
  return !ts.empty() && std::all_of(ts.begin(), ts.end(), [&](const at::Tensor& t) {
    return t.defined() && t.scalar_type() == ts[0].scalar_type();
  });
}

// The tensors' elements, one after another, as one new 1-D tensor (one device program).
at::Tensor flat_cat(const std::vector<at::Tensor>& ts) {
  std::vector<at::Tensor> flat;
  for (const auto& t : ts) flat.push_back(t.reshape({-1}));
  return at::cat(flat);
}

// Writes `flat`'s elements into the tensors, one after another (device copies, queued after the
// collective that wrote `flat`).
void split_into(const at::Tensor& flat, const std::vector<at::Tensor>& ts) {
  int64_t at = 0;
  for (const auto& t : ts) {
    t.copy_(flat.narrow(0, at, t.numel()).view(t.sizes()));
    at += t.numel();
  }
}
}  // namespace

// Host tensors are made here, in C++, and never reach Python: Gloo's threads release them when
// its work ends, possibly while the interpreter finalizes, and a tensor with a Python object could
// not be released then (it needs the GIL).
at::Tensor TpuBackend::host_tensor(at::IntArrayRef sizes, at::ScalarType dtype) const {
  int64_t numel = c10::multiply_integers(sizes);
  int64_t nbytes = numel * static_cast<int64_t>(c10::elementSize(dtype));
  at::Tensor buf;
  if (nbytes > 0) {
    std::lock_guard<std::mutex> g(pool_mu_);
    for (const auto& b : pool_) {
      if (b.numel() == nbytes && b.storage().use_count() == 1) {  // only the pool holds it
        buf = b;
        break;
      }
    }
    if (!buf.defined()) {
      buf = at::empty({nbytes}, at::kByte);
      if (pool_.size() < kPoolBuffers) {
        pool_.push_back(buf);
      } else {  // full: replace a buffer nothing holds, else stay unpooled
        for (auto& b : pool_) {
          if (b.storage().use_count() == 1) {
            b = buf;
            break;
          }
        }
      }
    }
  }
  at::Tensor out = at::empty({0}, at::TensorOptions().dtype(dtype));
  if (buf.defined()) out.set_(buf.storage(), 0, sizes, c10::contiguous_strides(sizes));
  else out.resize_(sizes);
  return out;
}

at::Tensor TpuBackend::stage(const at::Tensor& t) const {
  at::Tensor host = host_tensor(t.sizes(), t.scalar_type());
  if (t.numel() == 0) return host;
  // A view (a column, a DDP bucket slice) is read into a dense tensor on the device first.
  at::Tensor src = whole(t) ? t : t.clone(at::MemoryFormat::Contiguous);
  runtime::Cell* c = aten::cell_of(src);
  runtime::Runtime::get().ensure_typed(*c, src.scalar_type());
  runtime::Runtime::get().download(*c, host.data_ptr(), host.nbytes());
  return host;
}

void TpuBackend::write_back(const at::Tensor& device, const at::Tensor& host) {
  if (device.numel() == 0) return;
  c10::DeviceGuard guard(device.device());
  // The device buffer reads the host memory in place until it is gone; `keep` holds the host
  // storage (a C++-only tensor: releasing it needs no GIL) until then.
  auto adopt = [&host](const at::Tensor& dst) {
    runtime::Runtime::get().adopt_host(*aten::cell_of(dst), host.const_data_ptr(), host.scalar_type(), host.numel(),
                                       [keep = host]() mutable { keep = at::Tensor(); });
  };
  if (whole(device)) {
    adopt(device);
    return;
  }
  // A view: the result becomes a fresh dense tensor, then one copy program writes it into the base.
  at::Tensor fresh = at::empty(device.sizes(), device.options());
  adopt(fresh);
  device.copy_(fresh);
}

at::Tensor TpuBackend::receive_into(const at::Tensor& t, Call& call, bool copy_value) const {
  // Fused eager's recorded writes to `t` (its torch.zeros, say) are issued now, before the result
  // replaces its value (stage() does the same for inputs, reading them).
  if (!copy_value) runtime::Runtime::get().flush_recorded();
  at::Tensor host = copy_value ? stage(t) : host_tensor(t.sizes(), t.scalar_type());
  call.write_back.push_back({t, host});
  return host;
}

c10d::ReduceOp TpuBackend::host_op(const c10d::ReduceOp& op, const char* name) const {
  TORCH_CHECK(op != c10d::ReduceOp::PREMUL_SUM, describe(name),
              ": ReduceOp.PREMUL_SUM is not supported; scale the tensor, then use ReduceOp.SUM");
  if (op == c10d::ReduceOp::AVG) return c10d::ReduceOp(c10d::ReduceOp::SUM);
  return op;
}

std::function<void()> TpuBackend::averaging(const c10d::ReduceOp& op, std::vector<at::Tensor> host) const {
  if (op != c10d::ReduceOp::AVG) return {};
  int64_t n = size_;
  return [host = std::move(host), n] {
    for (const auto& t : host) {
      if (at::isIntegralType(t.scalar_type(), /*includeBool=*/true)) {
        TORCH_CHECK(t.scalar_type() != at::kBool, "ReduceOp.AVG is not defined for bool tensors");
        t.div_(n, "trunc");
      } else {
        t.div_(n);
      }
    }
  };
}

void TpuBackend::retire(c10::intrusive_ptr<c10::ivalue::Future> future) {
  std::lock_guard<std::mutex> g(mu_);
  retired_.push_back(std::move(future));
}

c10::intrusive_ptr<c10d::Work> TpuBackend::run(Call call, const std::function<c10::intrusive_ptr<c10d::Work>()>& start) {
  std::vector<c10::intrusive_ptr<c10::ivalue::Future>> done;
  {
    std::lock_guard<std::mutex> g(mu_);
    done.swap(retired_);
  }
  done.clear();  // released here, on the caller's thread
  std::string what = describe(call.name);
  c10::intrusive_ptr<c10d::Work> host_work;
  try {
    host_work = start();
  } catch (const std::exception& e) {
    std::rethrow_exception(backend_error(what + " failed: " + message(e)));
  }
  auto future = tensor_list_future();
  auto work = c10::make_intrusive<TpuWork>(rank_, call.op, call.outputs, future, host_work);
  auto timeout = timeout_;
  auto job = [this, call = std::move(call), host_work, future, what, timeout]() mutable {
    // Every reference to the caller's tensors is dropped before the future completes: once wait()
    // returns, the program may be shutting down, and releasing a tensor that has a Python object
    // on this thread would then need the GIL of a finalizing interpreter.
    std::vector<at::Tensor> outputs = std::move(call.outputs);
    try {
      if (host_work) host_work->wait(timeout);
      if (call.after_host) call.after_host();
      for (const auto& wb : call.write_back) write_back(wb.device, wb.host);
      call = Call{};
      host_work.reset();
      c10::IValue value(std::move(outputs));
      future->markCompleted(std::move(value));
    } catch (const std::exception& e) {
      call = Call{};
      host_work.reset();
      outputs.clear();
      future->setError(backend_error(what + " failed: " + message(e) +
                                     "\n(the tensors it would have written keep their values)"));
    }
    retire(std::move(future));
  };
  {
    std::lock_guard<std::mutex> g(mu_);
    jobs_.push_back(std::move(job));
  }
  cv_.notify_one();
  return work;
}

// ---------------------------------------------------------------------------------------------
std::string TpuBackend::device_op(const c10d::ReduceOp& op, const char* name) const {
  switch (op.op_) {
    case c10d::ReduceOp::SUM: return "sum";
    case c10d::ReduceOp::AVG: return "avg";
    case c10d::ReduceOp::PRODUCT: return "product";
    case c10d::ReduceOp::MIN: return "min";
    case c10d::ReduceOp::MAX: return "max";
    case c10d::ReduceOp::BAND: return "band";
    case c10d::ReduceOp::BOR: return "bor";
    case c10d::ReduceOp::BXOR: return "bxor";
    default:
      TORCH_CHECK(false, describe(name), ": ReduceOp.PREMUL_SUM is not supported; scale the tensor, then use ReduceOp.SUM");
  }
}

c10::intrusive_ptr<c10d::Work> TpuBackend::on_device(Call call, CollectiveSignature sig, const at::Tensor& input,
                                                     const at::Tensor& output, bool flat, bool peer) {
  std::string what = describe(call.name);
  auto& rt = runtime::Runtime::get();
  // The program's parameter is the input's storage buffer, which must be laid out as on every other
  // rank (the ranks' programs must be the same program): as the tensor's shape, which the ranks
  // agreed on, or flat for send/recv (the peers' shapes may differ). Else the input is copied so.
  std::vector<int64_t> dims = peer ? std::vector<int64_t>{input.numel()} : input.sizes().vec();
  auto laid_out = [&](const at::Tensor& t) {
    if (!whole(t)) return false;
    runtime::Cell* c = aten::cell_of(t);
    rt.ensure_typed(*c, t.scalar_type());
    return c->dims == dims;
  };
  at::Tensor src = laid_out(input) ? input : input.contiguous().view(dims).clone();
  // In place: the program's result replaces the buffer it read (copied back where src is a copy).
  at::Tensor dst = input.is_same(output) ? src : whole(output) ? output : at::empty(output.sizes(), output.options());
  runtime::Cell* cell = aten::cell_of(src);
  rt.ensure_typed(*cell, src.scalar_type());
  sig.dtype = src.scalar_type();
  sig.dims = cell->dims;
  sig.shape = flat || peer ? std::vector<int64_t>{src.numel()} : src.sizes().vec();
  try {
    device_->run(sig, src, dst, timeout_, what);
    if (!dst.is_same(output)) output.copy_(dst.view(output.sizes()));
  } catch (const std::exception& e) {
    std::rethrow_exception(backend_error(what + " failed: " + message(e) +
                                         "\n(the tensors it would have written keep their values)"));
  }
  auto future = tensor_list_future();
  future->markCompleted(c10::IValue(call.outputs));
  return c10::make_intrusive<TpuWork>(rank_, call.op, call.outputs, future, nullptr);
}

std::vector<at::Tensor> TpuBackend::stage_all(const std::vector<at::Tensor>& ts, const char* name,
                                              const char* what) const {
  std::vector<at::Tensor> host;
  for (const auto& t : ts) {
    check(t, name, what);
    host.push_back(stage(t));
  }
  return host;
}

std::vector<at::Tensor> TpuBackend::receive_all(const std::vector<at::Tensor>& ts, Call& call, const char* what,
                                                bool copy_value) const {
  std::vector<at::Tensor> host;
  for (const auto& t : ts) {
    check(t, call.name, what);
    host.push_back(receive_into(t, call, copy_value));
    call.outputs.push_back(t);
  }
  return host;
}

std::vector<std::vector<at::Tensor>> TpuBackend::stage_lists(const std::vector<std::vector<at::Tensor>>& lists,
                                                             const char* name) const {
  std::vector<std::vector<at::Tensor>> host;
  for (const auto& ts : lists) host.push_back(stage_all(ts, name, "input"));
  return host;
}

std::vector<std::vector<at::Tensor>> TpuBackend::receive_lists(const std::vector<std::vector<at::Tensor>>& lists,
                                                               Call& call) const {
  std::vector<std::vector<at::Tensor>> host;
  for (const auto& ts : lists) host.push_back(receive_all(ts, call, "output"));
  return host;
}

c10::intrusive_ptr<c10d::Work> TpuBackend::broadcast(std::vector<at::Tensor>& tensors, const c10d::BroadcastOptions& opts) {
  Call call{c10d::OpType::BROADCAST, "broadcast"};
  check_root(opts.rootRank, call.name);
  for (const auto& t : tensors) check(t, call.name, "tensor");
  agree(call.name, call.op, tensors, true);
  if (device_ && tensors.size() == 1) {
    call.outputs = tensors;
    return on_device(std::move(call), {"broadcast", {}, {}, {}, "", opts.rootRank}, tensors[0], tensors[0], false);
  }
  // The root's tensor is only read; the others' only written.
  std::vector<at::Tensor> host = rank_ == opts.rootRank ? stage_all(tensors, call.name, "tensor")
                                                        : receive_all(tensors, call, "tensor");
  call.outputs = tensors;
  return run(std::move(call), [&] { return host_->broadcast(host, opts); });
}

c10::intrusive_ptr<c10d::Work> TpuBackend::allreduce(std::vector<at::Tensor>& tensors, const c10d::AllreduceOptions& opts) {
  Call call{c10d::OpType::ALLREDUCE, "all_reduce"};
  if (device_ && tensors.size() == 1) {
    check(tensors[0], call.name, "tensor");
    agree(call.name, call.op, tensors, true);
    call.outputs = tensors;
    return on_device(std::move(call), {"all_reduce", {}, {}, {}, device_op(opts.reduceOp, call.name)}, tensors[0],
                     tensors[0], false);
  }
  c10d::AllreduceOptions o = opts;
  o.reduceOp = host_op(opts.reduceOp, call.name);
  std::vector<at::Tensor> host = reduced(tensors, call, opts.reduceOp);
  return run(std::move(call), [&] { return host_->allreduce(host, o); });
}

c10::intrusive_ptr<c10d::Work> TpuBackend::allreduce_coalesced(std::vector<at::Tensor>& tensors,
                                                               const c10d::AllreduceCoalescedOptions& opts) {
  Call call{c10d::OpType::ALLREDUCE_COALESCED, "all_reduce_coalesced"};
  if (device_ && one_dtype(tensors)) {  // one all_reduce of their concatenation
    for (const auto& t : tensors) check(t, call.name, "tensor");
    std::string op = device_op(opts.reduceOp, call.name);
    agree(call.name, call.op, tensors, true);
    call.outputs = tensors;
    at::Tensor flat = flat_cat(tensors);
    auto work = on_device(std::move(call), {"all_reduce", {}, {}, {}, op}, flat, flat, false);
    split_into(flat, tensors);
    return work;
  }
  c10d::AllreduceCoalescedOptions o = opts;
  o.reduceOp = host_op(opts.reduceOp, call.name);
  std::vector<at::Tensor> host = reduced(tensors, call, opts.reduceOp);
  return run(std::move(call), [&] { return host_->allreduce_coalesced(host, o); });
}

std::vector<at::Tensor> TpuBackend::reduced(const std::vector<at::Tensor>& tensors, Call& call,
                                            const c10d::ReduceOp& op) {
  for (const auto& t : tensors) check(t, call.name, "tensor");
  agree(call.name, call.op, tensors, true);
  std::vector<at::Tensor> host = receive_all(tensors, call, "tensor", /*copy_value=*/true);
  call.after_host = averaging(op, host);
  return host;
}

c10::intrusive_ptr<c10d::Work> TpuBackend::reduce(std::vector<at::Tensor>& tensors, const c10d::ReduceOptions& opts) {
  Call call{c10d::OpType::REDUCE, "reduce"};
  check_root(opts.rootRank, call.name);
  if (device_ && tensors.size() == 1) {
    check(tensors[0], call.name, "tensor");
    agree(call.name, call.op, tensors, true);
    call.outputs = tensors;
    return on_device(std::move(call), {"reduce", {}, {}, {}, device_op(opts.reduceOp, call.name), opts.rootRank},
                     tensors[0], tensors[0], false);
  }
  c10d::ReduceOptions o = opts;
  o.reduceOp = host_op(opts.reduceOp, call.name);
  std::vector<at::Tensor> host;
  if (rank_ == opts.rootRank) {
    host = reduced(tensors, call, opts.reduceOp);
  } else {  // only the root's tensor receives the result; the others keep theirs (as with NCCL)
    for (const auto& t : tensors) check(t, call.name, "tensor");
    agree(call.name, call.op, tensors, true);
    host = stage_all(tensors, call.name, "tensor");
    call.outputs = tensors;
  }
  return run(std::move(call), [&] { return host_->reduce(host, o); });
}

c10::intrusive_ptr<c10d::Work> TpuBackend::allgather(std::vector<std::vector<at::Tensor>>& outputs,
                                                     std::vector<at::Tensor>& inputs,
                                                     const c10d::AllgatherOptions& opts) {
  Call call{c10d::OpType::ALLGATHER, "all_gather"};
  if (device_ && inputs.size() == 1 && outputs.size() == 1 && uniform(outputs[0], inputs[0], size_)) {
    check(inputs[0], call.name, "input");
    agree(call.name, call.op, inputs, true);
    call.outputs = outputs[0];
    at::Tensor flat = at::empty({size_ * inputs[0].numel()}, inputs[0].options());
    auto work = on_device(std::move(call), {"all_gather"}, inputs[0], flat, true);
    split_into(flat, outputs[0]);
    return work;
  }
  std::vector<at::Tensor> host_in = stage_all(inputs, call.name, "input");
  agree(call.name, call.op, inputs, true);
  auto host_out = receive_lists(outputs, call);
  return run(std::move(call), [&] { return host_->allgather(host_out, host_in, opts); });
}

c10::intrusive_ptr<c10d::Work> TpuBackend::_allgather_base(at::Tensor& output, at::Tensor& input,
                                                           const c10d::AllgatherOptions& opts) {
  Call call{c10d::OpType::_ALLGATHER_BASE, "all_gather_into_tensor"};
  check(output, call.name, "output");
  check_sizes(call.name, output, input, size_);
  if (device_) {
    check(input, call.name, "input");
    agree(call.name, call.op, {input, output}, true);
    call.outputs = {output};
    return on_device(std::move(call), {"all_gather"}, input, output, true);
  }
  at::Tensor host_in = stage_all({input}, call.name, "input")[0].view({-1});
  agree(call.name, call.op, {input, output}, true);
  // Flat views for Gloo, which wants (world x n,) for an (n,) input; the output's own shape is the
  // caller's business (SyncBatchNorm gathers (2C+1,) into (1, world x (2C+1))), as with NCCL.
  at::Tensor host_out = receive_all({output}, call, "output")[0].view({-1});
  return run(std::move(call), [&] { return host_->_allgather_base(host_out, host_in, opts); });
}

c10::intrusive_ptr<c10d::Work> TpuBackend::allgather_coalesced(std::vector<std::vector<at::Tensor>>& outputs,
                                                               std::vector<at::Tensor>& inputs,
                                                               const c10d::AllgatherOptions& opts) {
  Call call{c10d::OpType::ALLGATHER_COALESCED, "all_gather_coalesced"};
  std::vector<at::Tensor> host_in = stage_all(inputs, call.name, "input");
  agree(call.name, call.op, inputs, true);
  auto host_out = receive_lists(outputs, call);
  return run(std::move(call), [&] { return host_->allgather_coalesced(host_out, host_in, opts); });
}

c10::intrusive_ptr<c10d::Work> TpuBackend::allgather_into_tensor_coalesced(std::vector<at::Tensor>& outputs,
                                                                           std::vector<at::Tensor>& inputs,
                                                                           const c10d::AllgatherOptions& opts) {
  Call call{c10d::OpType::COALESCED, "all_gather_into_tensor_coalesced"};
  if (device_ && one_dtype(inputs) && outputs.size() == inputs.size()) {
    // One all_gather of the inputs' concatenation (N elements per rank): output i is, per rank r,
    // the N-wide row r's columns of input i.
    for (size_t i = 0; i < inputs.size(); ++i) {
      check(inputs[i], call.name, "input");
      check(outputs[i], call.name, "output");
      check_sizes(call.name, outputs[i], inputs[i], size_);
    }
    agree(call.name, call.op, inputs, true);
    call.outputs = outputs;
    at::Tensor flat = flat_cat(inputs);
    at::Tensor gathered = at::empty({size_ * flat.numel()}, flat.options());
    auto work = on_device(std::move(call), {"all_gather"}, flat, gathered, true);
    at::Tensor rows = gathered.view({size_, flat.numel()});
    int64_t at = 0;
    for (size_t i = 0; i < inputs.size(); ++i) {
      int64_t n = inputs[i].numel();
      outputs[i].copy_(rows.narrow(1, at, n).reshape(outputs[i].sizes()));
      at += n;
    }
    return work;
  }
  std::vector<at::Tensor> host_in = stage_all(inputs, call.name, "input");
  agree(call.name, call.op, inputs, true);
  std::vector<at::Tensor> host_out = receive_all(outputs, call, "output");
  return run(std::move(call), [&] { return host_->allgather_into_tensor_coalesced(host_out, host_in, opts); });
}

c10::intrusive_ptr<c10d::Work> TpuBackend::gather(std::vector<std::vector<at::Tensor>>& outputs,
                                                  std::vector<at::Tensor>& inputs, const c10d::GatherOptions& opts) {
  Call call{c10d::OpType::GATHER, "gather"};
  check_root(opts.rootRank, call.name);
  std::vector<at::Tensor> host_in = stage_all(inputs, call.name, "input");
  agree(call.name, call.op, inputs, true);
  auto host_out = receive_lists(outputs, call);  // empty except on the root
  return run(std::move(call), [&] { return host_->gather(host_out, host_in, opts); });
}

c10::intrusive_ptr<c10d::Work> TpuBackend::scatter(std::vector<at::Tensor>& outputs,
                                                   std::vector<std::vector<at::Tensor>>& inputs,
                                                   const c10d::ScatterOptions& opts) {
  Call call{c10d::OpType::SCATTER, "scatter"};
  check_root(opts.rootRank, call.name);
  auto host_in = stage_lists(inputs, call.name);  // empty except on the root
  for (const auto& t : outputs) check(t, call.name, "output");
  agree(call.name, call.op, outputs, true);
  std::vector<at::Tensor> host_out = receive_all(outputs, call, "output");
  return run(std::move(call), [&] { return host_->scatter(host_out, host_in, opts); });
}

c10::intrusive_ptr<c10d::Work> TpuBackend::reduce_scatter(std::vector<at::Tensor>& outputs,
                                                          std::vector<std::vector<at::Tensor>>& inputs,
                                                          const c10d::ReduceScatterOptions& opts) {
  Call call{c10d::OpType::REDUCE_SCATTER, "reduce_scatter"};
  if (device_ && outputs.size() == 1 && inputs.size() == 1 && uniform(inputs[0], outputs[0], size_)) {
    check(outputs[0], call.name, "output");
    std::string op = device_op(opts.reduceOp, call.name);
    agree(call.name, call.op, outputs, true);
    call.outputs = outputs;
    return on_device(std::move(call), {"reduce_scatter", {}, {}, {}, op}, flat_cat(inputs[0]), outputs[0], true);
  }
  c10d::ReduceScatterOptions o = opts;
  o.reduceOp = host_op(opts.reduceOp, call.name);
  auto host_in = stage_lists(inputs, call.name);
  for (const auto& t : outputs) check(t, call.name, "output");
  agree(call.name, call.op, outputs, true);
  std::vector<at::Tensor> host_out = receive_all(outputs, call, "output");
  call.after_host = averaging(opts.reduceOp, host_out);
  return run(std::move(call), [&] { return host_->reduce_scatter(host_out, host_in, o); });
}

c10::intrusive_ptr<c10d::Work> TpuBackend::_reduce_scatter_base(at::Tensor& output, at::Tensor& input,
                                                                const c10d::ReduceScatterOptions& opts) {
  Call call{c10d::OpType::_REDUCE_SCATTER_BASE, "reduce_scatter_tensor"};
  c10d::ReduceScatterOptions o = opts;
  o.reduceOp = host_op(opts.reduceOp, call.name);
  check(output, call.name, "output");
  check_sizes(call.name, input, output, size_);
  if (device_) {
    check(input, call.name, "input");
    agree(call.name, call.op, {input, output}, true);
    call.outputs = {output};
    return on_device(std::move(call), {"reduce_scatter", {}, {}, {}, device_op(opts.reduceOp, call.name)}, input,
                     output, true);
  }
  at::Tensor host_in = stage_all({input}, call.name, "input")[0].view({-1});
  agree(call.name, call.op, {input, output}, true);
  at::Tensor host_out = receive_all({output}, call, "output")[0].view({-1});  // flat, as above
  call.after_host = averaging(opts.reduceOp, {host_out});
  return run(std::move(call), [&] { return host_->_reduce_scatter_base(host_out, host_in, o); });
}

c10::intrusive_ptr<c10d::Work> TpuBackend::reduce_scatter_tensor_coalesced(std::vector<at::Tensor>& outputs,
                                                                           std::vector<at::Tensor>& inputs,
                                                                           const c10d::ReduceScatterOptions& opts) {
  Call call{c10d::OpType::REDUCE_SCATTER_TENSOR_COALESCED, "reduce_scatter_tensor_coalesced"};
  if (device_ && one_dtype(inputs) && outputs.size() == inputs.size()) {
    // One reduce_scatter of rows r = (input 0's block r, input 1's block r, ...): rank r's result is
    // its outputs, one after another.
    std::vector<at::Tensor> blocks;
    for (size_t i = 0; i < inputs.size(); ++i) {
      check(inputs[i], call.name, "input");
      check(outputs[i], call.name, "output");
      check_sizes(call.name, inputs[i], outputs[i], size_);
      blocks.push_back(inputs[i].reshape({size_, -1}));
    }
    std::string op = device_op(opts.reduceOp, call.name);
    agree(call.name, call.op, inputs, true);
    call.outputs = outputs;
    at::Tensor rows = at::cat(blocks, 1).reshape({-1});
    at::Tensor mine = at::empty({rows.numel() / size_}, rows.options());
    auto work = on_device(std::move(call), {"reduce_scatter", {}, {}, {}, op}, rows, mine, true);
    split_into(mine, outputs);
    return work;
  }
  c10d::ReduceScatterOptions o = opts;
  o.reduceOp = host_op(opts.reduceOp, call.name);
  std::vector<at::Tensor> host_in = stage_all(inputs, call.name, "input");
  agree(call.name, call.op, inputs, true);
  std::vector<at::Tensor> host_out = receive_all(outputs, call, "output");
  call.after_host = averaging(opts.reduceOp, host_out);
  return run(std::move(call), [&] { return host_->reduce_scatter_tensor_coalesced(host_out, host_in, o); });
}

c10::intrusive_ptr<c10d::Work> TpuBackend::alltoall_base(at::Tensor& output, at::Tensor& input,
                                                         std::vector<int64_t>& output_splits,
                                                         std::vector<int64_t>& input_splits,
                                                         const c10d::AllToAllOptions& opts) {
  Call call{c10d::OpType::ALLTOALL_BASE, "all_to_all_single"};
  check(output, call.name, "output");
  auto even = [&](const std::vector<int64_t>& splits, const at::Tensor& t) {
    return splits.empty() || std::all_of(splits.begin(), splits.end(), [&](int64_t v) {
      return t.dim() > 0 && v * size_ == t.size(0);
    });
  };
  if (device_ && input.dim() > 0 && input.size(0) % size_ == 0 && even(input_splits, input) && even(output_splits, output) &&
      input.sizes() == output.sizes()) {
    check(input, call.name, "input");
    agree(call.name, call.op, {input, output}, true);
    call.outputs = {output};
    return on_device(std::move(call), {"all_to_all"}, input, output, true);
  }
  at::Tensor host_in = stage_all({input}, call.name, "input")[0];
  agree(call.name, call.op, {input, output}, false);  // split sizes may differ by rank
  at::Tensor host_out = receive_all({output}, call, "output")[0];
  return run(std::move(call),
             [&] { return host_->alltoall_base(host_out, host_in, output_splits, input_splits, opts); });
}

c10::intrusive_ptr<c10d::Work> TpuBackend::alltoall(std::vector<at::Tensor>& outputs, std::vector<at::Tensor>& inputs,
                                                    const c10d::AllToAllOptions& opts) {
  Call call{c10d::OpType::ALLTOALL, "all_to_all"};
  std::vector<at::Tensor> host_in = stage_all(inputs, call.name, "input");
  agree(call.name, call.op, inputs, false);
  std::vector<at::Tensor> host_out = receive_all(outputs, call, "output");
  return run(std::move(call), [&] { return host_->alltoall(host_out, host_in, opts); });
}

c10::intrusive_ptr<c10d::Work> TpuBackend::send(std::vector<at::Tensor>& tensors, int dst, int tag) {
  Call call{c10d::OpType::SEND, "send"};
  check_peer(dst, call.name);
  if (device_ && tensors.size() == 1) {  // a program over (this rank, dst); this rank's result is dropped
    check(tensors[0], call.name, "tensor");
    call.outputs = tensors;
    CollectiveSignature sig{"permute"};
    sig.ranks = {rank_, dst};
    return on_device(std::move(call), sig, tensors[0], at::empty({tensors[0].numel()}, tensors[0].options()), true,
                     true);
  }
  std::vector<at::Tensor> host = stage_all(tensors, call.name, "tensor");
  call.outputs = tensors;
  return run(std::move(call), [&] { return host_->send(host, dst, tag); });
}

c10::intrusive_ptr<c10d::Work> TpuBackend::recv(std::vector<at::Tensor>& tensors, int src, int tag) {
  Call call{c10d::OpType::RECV, "recv"};
  check_peer(src, call.name);
  if (device_ && tensors.size() == 1) {  // the sender's program: its tensor arrives in this one's
    check(tensors[0], call.name, "tensor");
    call.outputs = tensors;
    CollectiveSignature sig{"permute"};
    sig.ranks = {src, rank_};
    return on_device(std::move(call), sig, tensors[0], tensors[0], true, true);
  }
  std::vector<at::Tensor> host = receive_all(tensors, call, "tensor");
  return run(std::move(call), [&] { return host_->recv(host, src, tag); });
}

c10::intrusive_ptr<c10d::Work> TpuBackend::recvAnysource(std::vector<at::Tensor>& tensors, int tag) {
  Call call{c10d::OpType::RECVANYSOURCE, "recv"};
  std::vector<at::Tensor> host = receive_all(tensors, call, "tensor");
  return run(std::move(call), [&] { return host_->recvAnysource(host, tag); });
}

c10::intrusive_ptr<c10d::Work> TpuBackend::barrier(const c10d::BarrierOptions& opts) {
  Call call{c10d::OpType::BARRIER, "barrier"};
  agree(call.name, call.op, {}, false);
  return run(std::move(call), [&] { return host_->barrier(opts); });
}

void TpuBackend::check_sizes(const char* name, const at::Tensor& whole, const at::Tensor& part, int64_t size) const {
  TORCH_CHECK_VALUE(whole.numel() == size * part.numel(), describe(name), ": the gathered tensor has ", whole.numel(),
                    " elements; it must have world size (", size, ") x the per-rank tensor's ", part.numel());
  TORCH_CHECK_VALUE(whole.scalar_type() == part.scalar_type(), describe(name), ": the input is ", part.scalar_type(),
                    " and the output ", whole.scalar_type(), "; they must match");
}

void TpuBackend::check_peer(int peer, const char* name) const {
  check_root(peer, name);
  TORCH_CHECK_VALUE(peer != rank_, describe(name), ": a rank cannot exchange with itself (peer ", peer, ")");
}

}  // namespace torch_tpu::distributed
