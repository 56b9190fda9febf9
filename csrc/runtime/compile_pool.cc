#include "runtime/compile_pool.h"

#include <ATen/ThreadLocalState.h>
#include <c10/util/Exception.h>
#include <pthread.h>

#include <condition_variable>
#include <deque>
#include <functional>
#include <future>
#include <map>
#include <mutex>
#include <set>
#include <stdexcept>
#include <thread>

#include "runtime/compile_cache.h"

namespace torch_tpu::runtime {
namespace {

struct Pool {
  std::mutex mu;
  std::condition_variable work, idle, loaded;
  std::deque<std::function<void()>> jobs;
  std::map<std::string, std::shared_ptr<pjrt::Executable>> compiling;  // key -> its pending executable
  // Prefetch (warm_start.h): keys to load when no compile job waits, and those being loaded now.
  std::deque<std::string> prefetch;
  std::set<std::string> loading;
  pjrt::Client* prefetch_client = nullptr;
  int threads = 1, started = 0;
  std::vector<std::string> warnings;

  bool settled() const { return compiling.empty() && prefetch.empty() && loading.empty(); }
  void start_threads();
};

Pool& pool() {
  static Pool* p = new Pool();  // never destroyed: its threads outlive static destruction
  return *p;
}

// A compile's warnings, kept for the thread that asked for programs (c10's handler is per thread:
// the default one would print them as C++ lines that Python's filters never see).
class KeepWarnings : public c10::WarningHandler {
 public:
  void process(const c10::Warning& w) override {
    std::lock_guard<std::mutex> g(pool().mu);
    pool().warnings.push_back(w.msg());
  }
};

void worker() {
  pthread_setname_np(pthread_self(), "tpu-compile");
  KeepWarnings keep;
  c10::WarningUtils::WarningHandlerGuard guard(&keep);
  Pool& p = pool();
  for (;;) {
    std::function<void()> job;
    std::string key;
    {
      std::unique_lock<std::mutex> g(p.mu);
      p.work.wait(g, [&] { return !p.jobs.empty() || !p.prefetch.empty(); });
      if (!p.jobs.empty()) {  // a program someone waits for goes before a prefetch
        job = std::move(p.jobs.front());
        p.jobs.pop_front();
      } else {
        key = std::move(p.prefetch.front());
        p.prefetch.pop_front();
        if (p.compiling.count(key)) {  // asked for meanwhile: its compile job loads it
          if (p.settled()) p.idle.notify_all();
          continue;
        }
        p.loading.insert(key);
      }
    }
    if (job) {
      job();  // never throws: its error goes to the pending executable
      continue;
    }
    try {
      compile_cache().prefetch(*p.prefetch_client, key);
    } catch (const std::exception&) {  // only a load: the program is compiled when it is asked for
    }
    std::lock_guard<std::mutex> g(p.mu);
    p.loading.erase(key);
    p.loaded.notify_all();
    if (p.settled()) p.idle.notify_all();
  }
}

void Pool::start_threads() {  // under mu
  for (; started < threads; ++started) std::thread(worker).detach();
}

std::string describe(const std::vector<PJRT_Buffer_Type>& types, const std::vector<std::vector<int64_t>>& dims) {
  std::string s;
  for (size_t i = 0; i < types.size(); ++i) {
    s += (i ? ", " : "") + std::to_string(static_cast<int>(types[i])) + "[";
    for (size_t d = 0; d < dims[i].size(); ++d) s += (d ? "," : "") + std::to_string(dims[i][d]);
    s += "]";
  }
  return s;
}

}  // namespace

std::shared_ptr<pjrt::Executable> compile_async(pjrt::Client& client, const std::string& key, const std::string& mlir,
                                                const std::string& name, const std::string& options,
                                                std::vector<PJRT_Buffer_Type> types,
                                                std::vector<std::vector<int64_t>> dims) {
  if (auto hit = compile_cache().in_memory(key)) return hit;
  compile_cache().note_use(key);
  Pool& p = pool();
  std::unique_lock<std::mutex> g(p.mu);
  if (p.threads == 0) {
    g.unlock();
    return compile_cache().get_or_compile(client, key, mlir, name, options);
  }
  if (auto it = p.compiling.find(key); it != p.compiling.end()) return it->second;
  auto promise = std::make_shared<std::promise<std::shared_ptr<pjrt::Executable>>>();
  auto pending = std::make_shared<pjrt::Executable>(types, dims, promise->get_future().share());
  p.compiling.emplace(key, pending);
  // The client outlives the pool's jobs: it is the runtime's, alive for the process.
  // The asking thread's state (its profiler callbacks above all): the compile's span is recorded
  // as that op's, as a synchronous compile's is (trace::HostSpan).
  p.jobs.push_back([&client, key, mlir, name, options, promise, types = std::move(types), dims = std::move(dims),
                    state = at::ThreadLocalState()] {
    at::ThreadLocalStateGuard asker(state);
    {
      // Being prefetched: wait for that load rather than load it twice.
      Pool& p = pool();
      std::unique_lock<std::mutex> g(p.mu);
      p.loaded.wait(g, [&] { return !p.loading.count(key); });
    }
    try {
      auto exe = compile_cache().get_or_compile(client, key, mlir, name, options);
      if (exe->output_types != types || exe->output_dims != dims) {
        throw std::runtime_error("torch_tpu internal error: the compiled program returns " +
                                 describe(exe->output_types, exe->output_dims) + ", its text declares " +
                                 describe(types, dims));
      }
      promise->set_value(std::move(exe));
    } catch (const std::exception& e) {
      promise->set_exception(std::make_exception_ptr(
          std::runtime_error("tpu: compiling " + name + " failed: " + e.what() + "\n--- program ---\n" + mlir)));
    }
    Pool& p = pool();
    std::lock_guard<std::mutex> g(p.mu);
    p.compiling.erase(key);
    if (p.settled()) p.idle.notify_all();
  });
  p.start_threads();
  p.work.notify_one();
  return pending;
}

void prefetch_async(pjrt::Client& client, const std::vector<std::string>& keys) {
  Pool& p = pool();
  std::lock_guard<std::mutex> g(p.mu);
  if (p.threads == 0 || keys.empty()) return;  // no pool: nothing works in the background
  p.prefetch_client = &client;  // the runtime's, alive for the process
  p.prefetch.insert(p.prefetch.end(), keys.begin(), keys.end());
  p.start_threads();
  p.work.notify_all();
}

void cancel_prefetch() {
  Pool& p = pool();
  std::lock_guard<std::mutex> g(p.mu);
  p.prefetch.clear();
  if (p.settled()) p.idle.notify_all();
}

void set_compile_threads(int n) {
  TORCH_CHECK(n >= 0, "TORCH_TPU_COMPILE_THREADS must be >= 0, got ", n);
  Pool& p = pool();
  std::lock_guard<std::mutex> g(p.mu);
  p.threads = n;  // more start with the next compile; threads already started stay
}

int compile_threads() {
  std::lock_guard<std::mutex> g(pool().mu);
  return pool().threads;
}

void wait_compiles() {
  Pool& p = pool();
  std::unique_lock<std::mutex> g(p.mu);
  p.idle.wait(g, [&] { return p.settled(); });
}

std::vector<std::string> take_compile_warnings() {
  std::lock_guard<std::mutex> g(pool().mu);
  return std::exchange(pool().warnings, {});
}

}  // namespace torch_tpu::runtime
