#include "runtime/runtime.h"
#include "runtime/settings.h"
#include "runtime/warm_start.h"

#include <c10/util/ApproximateClock.h>
#include <c10/util/Exception.h>

#include <pthread.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <thread>

namespace torch_tpu::runtime {

PJRT_Buffer_Type to_pjrt_type(c10::ScalarType t) {
  switch (t) {
    case c10::ScalarType::Bool: return PJRT_Buffer_Type_PRED;
    case c10::ScalarType::Char: return PJRT_Buffer_Type_S8;
    case c10::ScalarType::Short: return PJRT_Buffer_Type_S16;
    case c10::ScalarType::Int: return PJRT_Buffer_Type_S32;
    case c10::ScalarType::Long: return PJRT_Buffer_Type_S64;
    case c10::ScalarType::Byte: return PJRT_Buffer_Type_U8;
    case c10::ScalarType::UInt16: return PJRT_Buffer_Type_U16;
    case c10::ScalarType::UInt32: return PJRT_Buffer_Type_U32;
    case c10::ScalarType::UInt64: return PJRT_Buffer_Type_U64;
    case c10::ScalarType::Half: return PJRT_Buffer_Type_F16;
    case c10::ScalarType::Float: return PJRT_Buffer_Type_F32;
    case c10::ScalarType::Double: return PJRT_Buffer_Type_F64;
    case c10::ScalarType::BFloat16: return PJRT_Buffer_Type_BF16;
    case c10::ScalarType::ComplexFloat: return PJRT_Buffer_Type_C64;
    case c10::ScalarType::ComplexDouble: return PJRT_Buffer_Type_C128;
    case c10::ScalarType::Float8_e5m2: return PJRT_Buffer_Type_F8E5M2;
    case c10::ScalarType::Float8_e4m3fn: return PJRT_Buffer_Type_F8E4M3FN;
    case c10::ScalarType::Float8_e5m2fnuz: return PJRT_Buffer_Type_F8E5M2FNUZ;
    case c10::ScalarType::Float8_e4m3fnuz: return PJRT_Buffer_Type_F8E4M3FNUZ;
    case c10::ScalarType::Float8_e8m0fnu: return PJRT_Buffer_Type_F8E8M0FNU;
    default:
      TORCH_CHECK(false, "dtype ", t, " has no PJRT element type; the tpu device cannot hold it");
  }
}

c10::ScalarType from_pjrt_type(PJRT_Buffer_Type t) {
  for (auto s : {c10::ScalarType::Bool, c10::ScalarType::Char, c10::ScalarType::Short,
                 c10::ScalarType::Int, c10::ScalarType::Long, c10::ScalarType::Byte,
                 c10::ScalarType::UInt16, c10::ScalarType::UInt32, c10::ScalarType::UInt64,
                 c10::ScalarType::Half, c10::ScalarType::Float, c10::ScalarType::Double,
                 c10::ScalarType::BFloat16, c10::ScalarType::ComplexFloat,
                 c10::ScalarType::ComplexDouble, c10::ScalarType::Float8_e5m2,
                 c10::ScalarType::Float8_e4m3fn, c10::ScalarType::Float8_e5m2fnuz,
                 c10::ScalarType::Float8_e4m3fnuz, c10::ScalarType::Float8_e8m0fnu}) {
    if (to_pjrt_type(s) == t) return s;
  }
  TORCH_CHECK(false, "PJRT element type ", static_cast<int>(t), " has no torch dtype");
}

Counters& counters() {
  static Counters c;
  return c;
}

namespace {
std::atomic<bool> forked_after_start{false};

void check_not_forked() {
  TORCH_CHECK(!forked_after_start.load(std::memory_order_relaxed),
              "the tpu device cannot be used in a process forked after it started: PJRT's client and "
              "its threads do not survive fork(). Use the 'spawn' or 'forkserver' start method "
              "(torch.multiprocessing.set_start_method('spawn')), or touch the tpu device only in the "
              "child process.");
}

// What a plugin prints to stderr while it loads and its client starts, with absl's INFO lines
// ("I0000 ... cpu_device_count set via create_options: 2") and its notice that logging is not
// initialised left out: every process of a job printed them at its first tpu op. Warnings and errors
// are written back as they came; everything is, when the start fails or TORCH_TPU_PLUGIN_LOGS=1.
class PluginStartLog {
 public:
  PluginStartLog() {
    std::fflush(stderr);
    saved_ = dup(STDERR_FILENO);
    file_ = std::tmpfile();
    active_ = saved_ >= 0 && file_ && dup2(fileno(file_), STDERR_FILENO) >= 0;
  }
  ~PluginStartLog() {
    finish(/*everything=*/true);
    if (file_) std::fclose(file_);
    if (saved_ >= 0) ::close(saved_);
  }
  PluginStartLog(const PluginStartLog&) = delete;
  PluginStartLog& operator=(const PluginStartLog&) = delete;

  // Restores stderr and writes back what was printed (all of it, or less absl's INFO lines).
  void finish(bool everything) {
    if (!active_) return;
    active_ = false;
    std::fflush(stderr);
    dup2(saved_, STDERR_FILENO);
    std::rewind(file_);
    char line[4096];
    while (std::fgets(line, sizeof(line), file_)) {
      bool info = line[0] == 'I' && std::isdigit(static_cast<unsigned char>(line[1])) &&
                  std::isdigit(static_cast<unsigned char>(line[4])) && line[5] == ' ';
      static const char kNotice[] = "WARNING: All log messages before absl::InitializeLog()";
      bool notice = std::strncmp(line, kNotice, sizeof(kNotice) - 1) == 0;
      if (everything || !(info || notice)) std::fputs(line, stderr);
    }
    std::fflush(stderr);
  }

 private:
  int saved_ = -1;
  std::FILE* file_ = nullptr;
  bool active_ = false;
};
}  // namespace

bool Runtime::in_bad_fork() { return forked_after_start.load(std::memory_order_relaxed); }

Runtime& Runtime::get() {
  static Runtime* r = new Runtime();  // never destroyed: buffers may outlive static teardown
  return *r;
}

void Runtime::configure(const std::string& plugin_path, const std::string& error,
                        const std::vector<std::pair<std::string, int64_t>>& options,
                        std::function<std::shared_ptr<pjrt::KeyValueStore>()> key_value_store) {
  std::lock_guard<std::mutex> g(mu_);
  TORCH_CHECK(!client_, "the tpu runtime has already started; configure it before first use");
  plugin_path_ = plugin_path;
  config_error_ = error;
  options_ = options;
  key_value_store_ = std::move(key_value_store);
}

pjrt::Client& Runtime::client() {
  check_not_forked();
  if (auto* started = started_client_.load(std::memory_order_acquire)) return *started;
  std::lock_guard<std::mutex> g(mu_);
  if (client_) return *client_;
  TORCH_CHECK(!plugin_path_.empty(), config_error_);
  {
    PluginStartLog log;  // writes everything back if the start throws
    auto plugin = pjrt::Plugin::load(plugin_path_, "TORCH_TPU_PJRT_PLUGIN");
    try {
      client_ = pjrt::Client::create(plugin, options_, key_value_store_ ? key_value_store_() : nullptr);
    } catch (const pjrt::PjrtError& e) {  // say which plugin failed (libtpu on a host without TPU chips)
      throw pjrt::PjrtError(std::string(e.what()) + "\n(the tpu device's PJRT plugin " + plugin_path_ +
                                " could not start; TORCH_TPU_PJRT_PLUGIN chooses another)",
                            e.code());
    }
    log.finish(/*everything=*/settings::get("TORCH_TPU_PLUGIN_LOGS") == "1");
  }
  // Around fork(), hold the runtime's locks so that the child's copies are not left locked by a
  // thread (the launcher) that does not exist there; the child may still free and allocate cells.
  pthread_atfork(
      [] {
        Runtime::get().qmu_.lock();
        Runtime::get().mu_.lock();
      },
      [] {
        Runtime::get().mu_.unlock();
        Runtime::get().qmu_.unlock();
      },
      [] {
        forked_after_start.store(true);
        Runtime::get().mu_.unlock();
        Runtime::get().qmu_.unlock();
      });
  const char* rank = std::getenv("RANK");  // a multi-process job: said once, by rank 0
  if (client_->platform_name() == "cpu" && !(rank && std::string(rank) != "0")) {
    // One line: a verbatim warning's location is what Python prints before it, and a file with no
    // line 0 leaves out the source line that Python prints after a warning from code.
    c10::warn(c10::Warning(c10::UserWarning(), c10::SourceLocation{__func__, "torch_tpu", 0},
                           "No TPU here: the tpu device runs on OpenXLA's CPU PJRT plugin "
                           "(TORCH_TPU_PJRT_PLUGIN picks another)", /*verbatim=*/true));
  }
  started_client_.store(client_.get(), std::memory_order_release);
  warm_start::on_client_start(*client_);
  return *client_;
}

int Runtime::device_count_noexcept() noexcept {
  if (in_bad_fork()) return static_cast<int>(started_client_.load()->device_count());  // the parent's count
  {
    // The CPU plugin makes exactly the devices it is asked for, so the count needs no client. The
    // autograd engine asks every backend for it on the first backward(), CPU-only ones included:
    // answering here keeps a CPU-only program from starting PJRT (its threads, the "No TPU" warning).
    std::lock_guard<std::mutex> g(mu_);
    if (!client_) {
      for (const auto& [name, value] : options_)
        if (name == "cpu_device_count") return static_cast<int>(value);
    }
  }
  try {
    return static_cast<int>(client().device_count());
  } catch (...) {
    return 0;
  }
}

Cell* Runtime::new_cell(size_t nbytes, int device) {
  auto* c = new Cell();
  c->device = device;
  c->nbytes = nbytes;
  std::lock_guard<std::mutex> g(mu_);
  c->addr = next_addr_;
  // 256-byte aligned, and at least one byte apart so that every storage has its own address.
  next_addr_ += ((nbytes + 1 + 255) / 256) * 256;
  cells_[c->addr] = c;
  auto& m = memory_[device];
  m.bytes += static_cast<int64_t>(nbytes);
  m.peak_bytes = std::max(m.peak_bytes, m.bytes);
  m.allocated_bytes += static_cast<int64_t>(nbytes);
  m.peak_count = std::max(m.peak_count, ++m.count);
  ++m.allocations;
  return c;
}

void Runtime::free_cell(Cell* cell) {
  {
    std::lock_guard<std::mutex> g(mu_);
    cells_.erase(cell->addr);
    auto& m = memory_[cell->device];
    m.bytes -= static_cast<int64_t>(cell->nbytes);
    m.freed_bytes += static_cast<int64_t>(cell->nbytes);
    --m.count;
    ++m.frees;
  }
  if (in_bad_fork()) {  // destroying the parent's PJRT buffer here could wait on threads that are gone
    new std::shared_ptr<pjrt::Buffer>(std::move(cell->buffer));
    delete cell;
    return;
  }
  if (!defer([cell] { delete cell; })) delete cell;  // queued launches may still read it
}

Runtime::MemoryCounters Runtime::memory(int device) {
  std::lock_guard<std::mutex> g(mu_);
  auto it = memory_.find(device);
  return it == memory_.end() ? MemoryCounters{} : it->second;
}

void Runtime::reset_peak_memory(int device) {
  std::lock_guard<std::mutex> g(mu_);
  auto& m = memory_[device];
  m.peak_bytes = m.bytes;
  m.peak_count = m.count;
}

void Runtime::reset_accumulated_memory(int device) {
  std::lock_guard<std::mutex> g(mu_);
  auto& m = memory_[device];
  m.allocated_bytes = m.freed_bytes = m.allocations = m.frees = 0;
}

Cell* Runtime::cell_at(const void* addr) {
  auto a = reinterpret_cast<uintptr_t>(addr);
  std::lock_guard<std::mutex> g(mu_);
  auto it = cells_.upper_bound(a);
  if (it == cells_.begin()) return nullptr;
  --it;
  Cell* c = it->second;
  return (a >= c->addr && a <= c->addr + c->nbytes) ? c : nullptr;
}

namespace {
int64_t product(const std::vector<int64_t>& dims) {
  int64_t n = 1;
  for (int64_t d : dims) n *= d;
  return n;
}
}  // namespace

// A cell's dtype, numel and dims are read without a lock (call keys on the dispatching thread, zero
// buffers made by the launcher thread, uploads by collectives' threads). They are set on the thread
// that queues a launch, before it is queued (a never-written cell read by a launch is typed then,
// not by the launcher), and afterwards written only where they change, which every writer of a
// storage keeps them from doing (a program writes a storage in its type and dims, an upload takes
// the cell's dims): a launch in flight never sees them written under it.
static void set_dims(Cell& cell, const std::vector<int64_t>& dims) {
  if (cell.dims != dims) cell.dims = dims;
}

static void set_type(Cell& cell, c10::ScalarType dtype, int64_t numel) {
  if (cell.dtype != dtype) cell.dtype = dtype;
  if (cell.numel != numel) cell.numel = numel;
}

void Runtime::ensure_typed(Cell& cell, c10::ScalarType dtype) {
  if (cell.dtype) return;
  cell.dtype = dtype;
  cell.numel = static_cast<int64_t>(cell.nbytes / c10::elementSize(dtype));
  if (cell.hint_dtype == dtype && product(cell.hint) == cell.numel) {
    cell.dims = cell.hint;
  } else {
    cell.dims = {cell.numel};
  }
}

void Runtime::hint_layout(Cell& cell, c10::ScalarType dtype, std::vector<int64_t> dims) {
  if (cell.dtype) return;
  cell.hint_dtype = dtype;
  cell.hint = std::move(dims);
}

// The dims an upload of `numel` elements of `dtype` into `cell` takes: the cell's own where they
// fit (later programs were keyed on them), else 1-D.
static std::vector<int64_t> upload_dims(Cell& cell, c10::ScalarType dtype, int64_t numel) {
  if (cell.dtype == dtype && cell.numel == numel && product(cell.dims) == numel) return cell.dims;
  return {numel};
}

pjrt::Buffer& Runtime::materialize(Cell& cell) {
  if (cell.buffer) return *cell.buffer;
  if (cell.error) throw pjrt::PjrtError(*cell.error, PJRT_Error_Code_UNKNOWN);
  if (!cell.dtype) ensure_typed(cell, c10::ScalarType::Byte);  // (a download's; a launch's is typed when queued)
  std::vector<char> zeros(cell.numel * c10::elementSize(*cell.dtype), 0);
  upload_now(cell, zeros.data(), *cell.dtype, cell.numel);  // in the cell's dims
  return *cell.buffer;
}

bool async_launch() {
  static const bool on = settings::enabled("TORCH_TPU_ASYNC_LAUNCH");
  return on;
}

void Runtime::upload(Cell& cell, const void* data, c10::ScalarType dtype, int64_t numel) {
  wait_issued();
  cell.host_copy.reset();
  upload_now(cell, data, dtype, numel);
}

void Runtime::upload_ordered(Cell& cell, const void* data, c10::ScalarType dtype, int64_t numel,
                             size_t keep_host_bytes) {
  check_not_forked();
  ensure_typed(cell, dtype);
  auto dims = upload_dims(cell, dtype, numel);
  size_t bytes = static_cast<size_t>(numel) * c10::elementSize(dtype);
  std::shared_ptr<pjrt::Buffer> buf = client().buffer_from_host(data, to_pjrt_type(dtype), dims, cell.device);
  // Typed now, as a launch's sinks are: ops queued after this key on the cell's dtype and dims.
  set_type(cell, dtype, numel);
  set_dims(cell, dims);
  const char* p = static_cast<const char*>(data);
  cell.host_copy = bytes <= keep_host_bytes ? std::make_shared<const std::vector<char>>(p, p + bytes) : nullptr;
  counters().h2d_transfers++;
  counters().h2d_bytes += static_cast<int64_t>(bytes);
  if (!async_launch()) {
    cell.buffer = std::move(buf);
    cell.error.reset();
    return;
  }
  enqueue([c = &cell, buf = std::move(buf)] {  // a freed cell's delete is queued behind this (free_cell)
    c->buffer = buf;
    c->error.reset();
  });
}

void Runtime::upload_now(Cell& cell, const void* data, c10::ScalarType dtype, int64_t numel) {
  ensure_typed(cell, dtype);
  auto dims = upload_dims(cell, dtype, numel);
  set_uploaded(cell, client().buffer_from_host(data, to_pjrt_type(dtype), dims, cell.device), dtype, dims);
}

void Runtime::set_uploaded(Cell& cell, std::shared_ptr<pjrt::Buffer> buf, c10::ScalarType dtype,
                           std::vector<int64_t> dims) {
  int64_t numel = product(dims);
  counters().h2d_transfers++;
  counters().h2d_bytes += numel * c10::elementSize(dtype);
  cell.buffer = std::move(buf);
  cell.error.reset();
  set_type(cell, dtype, numel);
  set_dims(cell, dims);
}

void Runtime::adopt_host(Cell& cell, const void* data, c10::ScalarType dtype, int64_t numel,
                         std::function<void()> release) {
  try {
    wait_issued();
  } catch (...) {
    release();
    throw;
  }
  cell.host_copy.reset();
  ensure_typed(cell, dtype);
  auto dims = upload_dims(cell, dtype, numel);
  set_uploaded(cell, client().buffer_aliasing_host(data, to_pjrt_type(dtype), dims, cell.device, std::move(release)),
               dtype, dims);
}

void Runtime::download(Cell& cell, void* dst, size_t size) {
  run_hook();
  drain();
  pjrt::Buffer& b = materialize(cell);
  counters().d2h_transfers++;
  counters().d2h_bytes += size;
  counters().host_syncs++;
  try {
    b.to_host(dst, size);
  } catch (const pjrt::PjrtError& e) {
    if (cell.producer.empty()) throw;
    throw pjrt::PjrtError(std::string(e.what()) + "\n(raised by the asynchronous tpu op " + cell.producer +
                              "; run with TPU_LAUNCH_BLOCKING=1 to raise it where it is called)",
                          e.code());
  }
}

void Runtime::copy_bytes(Cell& dst, const Cell& src, size_t count) {
  if (count == 0) return;
  run_hook();
  drain();
  std::vector<char> bytes(std::max(dst.nbytes, src.nbytes), 0);
  if (src.buffer) download(const_cast<Cell&>(src), bytes.data(), src.numel * c10::elementSize(*src.dtype));
  if (dst.buffer && count < dst.nbytes) {  // keep the destination's bytes past `count`
    std::vector<char> old(dst.numel * c10::elementSize(*dst.dtype));
    download(dst, old.data(), old.size());
    std::memcpy(old.data(), bytes.data(), count);
    bytes.swap(old);
  }
  c10::ScalarType t = src.dtype ? *src.dtype : c10::ScalarType::Byte;
  size_t item = c10::elementSize(t);
  if (dst.nbytes % item != 0) t = c10::ScalarType::Byte, item = 1;
  bytes.resize(dst.nbytes);
  upload(dst, bytes.data(), t, static_cast<int64_t>(dst.nbytes / item));
}

namespace {
size_t keep_busy_bytes() {
  static const size_t limit = static_cast<size_t>(settings::integer("TORCH_TPU_KEEP_BUSY_BYTES"));
  return limit;
}
}  // namespace

std::vector<int64_t> Runtime::busy_inputs(const std::vector<pjrt::Buffer*>& args, const std::vector<Cell*>& sinks) {
  std::vector<int64_t> busy;
  size_t bytes = 0;
  std::lock_guard<std::mutex> g(mu_);
  for (size_t i = 0; i < args.size(); ++i) {
    const auto& last = args[i]->last_use;
    if (!last || last->is_ready()) continue;
    // Only the buffers of cells this launch writes are donation candidates.
    if (std::none_of(sinks.begin(), sinks.end(), [&](Cell* c) { return c->buffer.get() == args[i]; })) continue;
    size_t n = args[i]->on_device_size();
    if (bytes + n > keep_busy_bytes()) continue;  // donated: PJRT waits for its users
    bytes += n;
    busy.push_back(static_cast<int64_t>(i));
    counters().busy_inputs_kept++;
  }
  return busy;
}

void Runtime::prepare_launch(const pjrt::Executable& exe, const std::vector<LaunchArg>& args,
                             const std::vector<Cell*>& sinks, const std::string& producer) {
  TORCH_CHECK(sinks.size() == exe.num_outputs(), "program has ", exe.num_outputs(),
              " outputs but ", sinks.size(), " destinations were given");
  for (const auto& a : args)  // its zeros are made by the launcher, in the type fixed here
    if (a.cell && !a.cell->dtype) ensure_typed(*a.cell, c10::ScalarType::Byte);
  for (size_t i = 0; i < sinks.size(); ++i) {  // known now: later ops read them before the launch runs
    set_dims(*sinks[i], exe.output_dims[i]);
    set_type(*sinks[i], from_pjrt_type(exe.output_types[i]), product(exe.output_dims[i]));
    sinks[i]->producer = producer;
    sinks[i]->host_copy.reset();
  }
}

void Runtime::execute(std::shared_ptr<const pjrt::Executable> exe, std::vector<LaunchArg> args,
                      std::vector<Cell*> sinks, int device, std::string producer, std::string trace_name) {
  prepare_launch(*exe, args, sinks, producer);
  check_not_forked();
  counters().executions++;
  std::shared_ptr<trace::Execution> rec;
  if (trace::recording()) {  // here, not at issue: the op that launches it runs on this thread
    rec = trace_name.empty() ? trace::begin(producer, "", device) : trace::begin(std::move(trace_name), producer, device);
  }
  if (!async_launch()) {
    issue(*exe, args, sinks, device, producer, rec);
    return;
  }
  enqueue([this, exe = std::move(exe), args = std::move(args), sinks = std::move(sinks), device,
           producer = std::move(producer), rec = std::move(rec)] {
    issue(*exe, args, sinks, device, producer, rec);
  });
}

void Runtime::enqueue(std::function<void()> job) {
  std::lock_guard<std::mutex> g(qmu_);
  if (!launcher_started_) {
    std::thread([this] { launcher_loop(); }).detach();  // lives as long as the process
    launcher_started_ = true;
  }
  queue_.push_back(std::move(job));
  qwork_.notify_one();
}

bool Runtime::defer(std::function<void()> job) {
  std::lock_guard<std::mutex> g(qmu_);
  if (queue_.empty() && !issuing_) return false;
  queue_.push_back(std::move(job));
  qwork_.notify_one();
  return true;
}

void Runtime::launcher_loop() {
  pthread_setname_np(pthread_self(), "tpu-launcher");  // what top, perf and py-spy show
  for (;;) {
    std::function<void()> job;
    {
      std::unique_lock<std::mutex> lk(qmu_);
      qwork_.wait(lk, [this] { return !queue_.empty() && !issuing_; });  // one issuer at a time, in order
      job = std::move(queue_.front());
      queue_.pop_front();
      issuing_ = true;
    }
    try {
      job();
    } catch (...) {
      std::lock_guard<std::mutex> g(qmu_);
      if (!launch_error_) launch_error_ = std::current_exception();
    }
    job = nullptr;  // release the launch's buffers before reporting idle
    std::lock_guard<std::mutex> g(qmu_);
    issuing_ = false;
    if (queue_.empty()) qidle_.notify_all();
    else qwork_.notify_one();
  }
}

void Runtime::drain() {
  wait_issued();
  raise_launch_error();
}

void Runtime::wait_issued() {
  check_not_forked();  // the launcher thread is gone: waiting for its queue would never end
  {
    std::unique_lock<std::mutex> lk(qmu_);
    // A thread that must wait for the queue issues what is queued itself while the launcher is not
    // issuing: waking the launcher and then being woken by it costs two thread switches per sync
    // (tens of microseconds each on a busy host), more than a small program's run.
    while (!queue_.empty() && !issuing_) {
      std::function<void()> job = std::move(queue_.front());
      queue_.pop_front();
      issuing_ = true;
      lk.unlock();
      try {
        job();
      } catch (...) {
        std::lock_guard<std::mutex> g(qmu_);
        if (!launch_error_) launch_error_ = std::current_exception();
      }
      job = nullptr;
      lk.lock();
      issuing_ = false;
    }
    if (queue_.empty() && !issuing_) qidle_.notify_all();  // other waiters: what they wait for is issued
    qwork_.notify_one();  // the launcher takes over anything queued meanwhile by other threads
    qidle_.wait(lk, [this] { return queue_.empty() && !issuing_; });
  }
}

void Runtime::raise_launch_error() {
  std::exception_ptr err;
  {
    std::lock_guard<std::mutex> g(qmu_);
    std::swap(err, launch_error_);
  }
  if (err) std::rethrow_exception(err);
}

void Runtime::issue(const pjrt::Executable& exe, const std::vector<LaunchArg>& largs,
                    const std::vector<Cell*>& sinks, int device, const std::string& producer,
                    const std::shared_ptr<trace::Execution>& rec) {
  std::vector<pjrt::Buffer*> bufs;
  std::vector<PJRT_Buffer*> args;
  bufs.reserve(largs.size());
  args.reserve(largs.size());
  std::shared_ptr<pjrt::Event> done;
  std::vector<std::shared_ptr<pjrt::Buffer>> outs;
  std::vector<Cell*> fresh = unwritten(sinks);
  std::vector<std::shared_ptr<pjrt::Buffer>> uploads;
  try {
    for (const auto& a : largs) {
      bufs.push_back(arg_buffer(a, device, uploads));
      args.push_back(bufs.back()->get());
    }
    try {
      auto non_donatable = busy_inputs(bufs, sinks);
      if (rec) rec->issued_ns.store(c10::getTime(), std::memory_order_relaxed);
      outs = client().execute(exe, args, device, non_donatable, &done);
    } catch (const pjrt::PjrtError& e) {
      throw pjrt::PjrtError(std::string(e.what()) + "\n(raised launching the tpu op " + producer + ")", e.code());
    }
  } catch (const std::exception& e) {
    launch_failed(exe, device, producer, fresh, e);
  }

  if (rec) {
    rec->returned_ns.store(c10::getTime(), std::memory_order_release);
    if (done) {
      done->on_ready([rec](const std::string&) { rec->done_ns.store(c10::getTime(), std::memory_order_release); });
    } else {
      rec->done_ns.store(rec->returned_ns.load(std::memory_order_relaxed), std::memory_order_release);
    }
  }
  std::lock_guard<std::mutex> g(mu_);
  launched(done, bufs, outs, sinks, device, producer);
}

pjrt::Buffer* Runtime::arg_buffer(const LaunchArg& a, int device, std::vector<std::shared_ptr<pjrt::Buffer>>& uploads) {
  if (a.cell) return &materialize(*a.cell);
  if (!a.words) return a.buffer.get();
  uploads.push_back(client().small_buffer_from_host(a.value.data(), to_pjrt_type(c10::ScalarType::UInt64), {2}, device));
  return uploads.back().get();
}

std::vector<Cell*> Runtime::unwritten(const std::vector<Cell*>& sinks) {
  std::vector<Cell*> fresh;  // sinks without a value before this launch (materialize gives them zeros)
  for (Cell* c : sinks) {
    if (!c->buffer) fresh.push_back(c);
  }
  return fresh;
}

void Runtime::launch_failed(const pjrt::Executable& exe, int device, const std::string& producer,
                            const std::vector<Cell*>& fresh, const std::exception& e) {
  // The op did not run: outputs that had a value keep it; fresh ones have none, so reading them
  // (or anything computed from them) raises this instead of silently reading zeros.
  std::string what = e.what();
  const auto* pe = dynamic_cast<const pjrt::PjrtError*>(&e);
  bool oom = dynamic_cast<const std::bad_alloc*>(&e) || (pe && pe->code() == PJRT_Error_Code_RESOURCE_EXHAUSTED);
  if (oom) what = out_of_memory_message(exe, device, producer, what);
  auto error = std::make_shared<const std::string>(
      what.rfind("tpu tensor without a value", 0) == 0
          ? what
          : "tpu tensor without a value: the tpu op " + producer + " that was to compute it failed, so it "
            "cannot be read or used (compute it again into a new tensor). The failure: " + what);
  for (Cell* c : fresh) {
    c->buffer.reset();
    c->error = error;
  }
  if (oom) TORCH_CHECK_WITH(OutOfMemoryError, false, what);
  throw;  // the exception being handled by the caller
}

void Runtime::launched(const std::shared_ptr<pjrt::Event>& done, const std::vector<pjrt::Buffer*>& bufs,
                       const std::vector<std::shared_ptr<pjrt::Buffer>>& outs, const std::vector<Cell*>& sinks,
                       int device, const std::string& producer) {
  if (done) {
    for (pjrt::Buffer* b : bufs) b->last_use = done;
    for (auto& b : outs) b->last_use = done;
    auto& fl = inflight_[device];
    if (fl.size() >= 64) fl = take_inflight(device);  // forget finished executions
    fl.push_back(done);
  }
  if (pending_.size() > 4096) {  // forget outputs that are already gone
    decltype(pending_) live;
    for (auto& w : pending_) if (!w.first.expired()) live.push_back(w);
    pending_.swap(live);
  }
  for (size_t i = 0; i < outs.size(); ++i) {
    sinks[i]->buffer = outs[i];
    sinks[i]->error.reset();
    pending_.emplace_back(outs[i], producer);
  }
}

void Runtime::execute_replicas(std::shared_ptr<const pjrt::Executable> exe, std::vector<ReplicaPart> parts,
                               std::string producer) {
  for (auto& p : parts) prepare_launch(*exe, p.args, p.sinks, producer);
  check_not_forked();
  counters().executions++;
  auto job = [this, exe = std::move(exe), parts = std::move(parts), producer = std::move(producer)] {
    issue_replicas(*exe, parts, producer);
  };
  if (!async_launch()) return job();
  enqueue(std::move(job));
}

void Runtime::issue_replicas(const pjrt::Executable& exe, const std::vector<ReplicaPart>& parts,
                             const std::string& producer) {
  std::vector<std::vector<pjrt::Buffer*>> bufs(parts.size());
  std::vector<std::vector<PJRT_Buffer*>> args(parts.size());
  std::vector<std::vector<Cell*>> fresh;
  for (const auto& p : parts) fresh.push_back(unwritten(p.sinks));
  std::vector<std::shared_ptr<pjrt::Event>> done;
  std::vector<std::vector<std::shared_ptr<pjrt::Buffer>>> outs;
  size_t at = 0;  // the part whose failure is reported (materialize fails per device)
  std::vector<std::shared_ptr<pjrt::Buffer>> uploads;
  try {
    for (at = 0; at < parts.size(); ++at) {
      for (const auto& a : parts[at].args) {
        bufs[at].push_back(arg_buffer(a, parts[at].device, uploads));
        args[at].push_back(bufs[at].back()->get());
      }
    }
    at = 0;
    try {
      outs = client().execute_replicas(exe, args, &done);
    } catch (const pjrt::PjrtError& e) {
      throw pjrt::PjrtError(std::string(e.what()) + "\n(raised launching the tpu op " + producer + ")", e.code());
    }
  } catch (const std::exception& e) {
    std::vector<Cell*> all;  // every device's fresh outputs: none of them was written
    for (const auto& f : fresh) all.insert(all.end(), f.begin(), f.end());
    launch_failed(exe, parts[std::min(at, parts.size() - 1)].device, producer, all, e);
  }
  std::lock_guard<std::mutex> g(mu_);
  for (size_t k = 0; k < parts.size(); ++k) launched(done[k], bufs[k], outs[k], parts[k].sinks, parts[k].device, producer);
}

// What to do, said by every out-of-memory error (torch.OutOfMemoryError).
constexpr char kOutOfMemoryAdvice[] =
    "Free tensors you no longer need (del; torch.tpu.empty_cache()), or use a smaller batch or a lower precision.";

std::string Runtime::out_of_memory_message(const pjrt::Executable& exe, int device, const std::string& producer,
                                           const std::string& cause) {
  auto size = [](double bytes) {
    const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB", "PiB"};
    int u = 0;
    while (bytes >= 1024 && u < 5) bytes /= 1024, ++u;
    char buf[32];
    std::snprintf(buf, sizeof(buf), "%.2f %s", bytes, units[u]);
    return std::string(buf);
  };
  double needed = 0;
  for (size_t i = 0; i < exe.output_dims.size(); ++i) {
    double n = c10::elementSize(from_pjrt_type(exe.output_types[i]));
    for (int64_t d : exe.output_dims[i]) n *= static_cast<double>(d);
    needed += n;
  }
  // "tpu:N out of memory." first, as CUDA's "CUDA out of memory.": what libraries match to shrink a
  // batch (accelerate's find_executable_batch_size looks for " out of memory.").
  return "tpu:" + std::to_string(device) + " out of memory. Tried to allocate " + size(needed) +
         " for the results of the tpu op " + producer + " (" + cause + "). Tensors of this process hold " +
         size(static_cast<double>(memory(device).bytes)) + " there (torch.tpu.memory_allocated()). " +
         kOutOfMemoryAdvice;
}

void Runtime::synchronize(int device) {
  run_hook();
  drain();
  std::vector<std::pair<std::shared_ptr<pjrt::Buffer>, std::string>> todo;
  {
    std::lock_guard<std::mutex> g(mu_);
    for (auto& w : pending_) {
      if (auto b = w.first.lock()) todo.emplace_back(b, w.second);
    }
    pending_.clear();
  }
  counters().host_syncs++;
  for (auto& [b, producer] : todo) {
    if (b->is_deleted()) continue;  // donated to a later program, which waits for it
    try {
      b->await_ready();
    } catch (const pjrt::PjrtError& e) {
      std::string msg = std::string(e.what()) + "\n(raised by the asynchronous tpu op " + producer +
                        "; run with TPU_LAUNCH_BLOCKING=1 to raise it where it is called)";
      TORCH_CHECK_WITH(OutOfMemoryError, e.code() != PJRT_Error_Code_RESOURCE_EXHAUSTED, "tpu:", device,
                       " out of memory. ", msg, "\n", kOutOfMemoryAdvice);
      throw pjrt::PjrtError(msg, e.code());
    }
  }
}

}  // namespace torch_tpu::runtime

namespace torch_tpu::runtime {

std::vector<std::shared_ptr<pjrt::Event>> Runtime::take_inflight(int device) {
  std::vector<std::shared_ptr<pjrt::Event>> out;
  for (auto& e : inflight_[device]) {
    if (!e->is_ready()) out.push_back(e);
  }
  return out;
}

std::shared_ptr<Marker> Runtime::mark(int device) {
  run_hook();
  auto m = std::make_shared<Marker>();
  auto reach = [this, m, device] {
    std::vector<std::shared_ptr<pjrt::Event>> fl;
    {
      std::lock_guard<std::mutex> g(mu_);
      fl = take_inflight(device);
      inflight_[device] = fl;
    }
    m->reach(std::move(fl));
  };
  if (!async_launch() || !defer(reach)) reach();
  return m;
}

bool Runtime::idle(int device) {
  {
    std::lock_guard<std::mutex> g(qmu_);
    if (!queue_.empty() || issuing_) return false;
  }
  std::lock_guard<std::mutex> g(mu_);
  auto fl = take_inflight(device);
  inflight_[device] = fl;
  return fl.empty();
}

namespace {
int64_t now_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now().time_since_epoch())
      .count();
}
}  // namespace

void Marker::reach(std::vector<std::shared_ptr<pjrt::Event>> inflight) {
  {
    std::lock_guard<std::mutex> g(mu_);
    reached_ = true;
    remaining_ = static_cast<int>(inflight.size()) + 1;  // +1: held until every callback is set
  }
  for (auto& e : inflight) {
    // The callback keeps the marker alive (a torch.Event may be dropped before the work ends).
    e->on_ready([self = shared_from_this()](const std::string& err) { self->finish_one(err); });
  }
  finish_one("");
}

void Marker::finish_one(const std::string& error) {
  std::lock_guard<std::mutex> g(mu_);
  if (!error.empty() && error_.empty()) error_ = error;
  if (--remaining_ == 0) {
    done_ns_ = now_ns();
    cv_.notify_all();
  }
}

bool Marker::query() {
  std::lock_guard<std::mutex> g(mu_);
  return reached_ && remaining_ == 0;
}

void Marker::synchronize() {
  std::unique_lock<std::mutex> lk(mu_);
  cv_.wait(lk, [this] { return reached_ && remaining_ == 0; });
  if (!error_.empty()) throw pjrt::PjrtError(error_, 0);
}

std::optional<int64_t> Marker::completed_ns() {
  std::lock_guard<std::mutex> g(mu_);
  return done_ns_;
}

}  // namespace torch_tpu::runtime
