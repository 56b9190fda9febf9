// GoogleTest of the runtime above PJRT, built with ThreadSanitizer by tests/test_pjrt_cpp.py: the
// storage cells and their launch queue (csrc/runtime/runtime.*), the executable cache
// (csrc/runtime/compile_cache.*), the profiler's execution records (csrc/runtime/trace.*), the eager
// plan cache and scalar operands (csrc/eager/plan.*), the per-thread eager mode
// (csrc/eager/mode.*) and fused eager's recorder (csrc/eager/fused.*), each driven from several
// threads at once. The
// plugin is the one named by env TORCH_TPU_TEST_PLUGIN; the cache directory by TORCH_TPU_TEST_DIR.
#include <gtest/gtest.h>
#include <torch/library.h>
#include <ATen/ops/scalar_tensor.h>

#include <atomic>
#include <cstdlib>
#include <map>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "aten/device.h"
#include "eager/fused.h"
#include "eager/mode.h"
#include "eager/op_kernel.h"
#include "eager/plan.h"
#include "graph/graph_runner.h"
#include "runtime/compile_cache.h"
#include "runtime/runtime.h"
#include "runtime/settings.h"
#include "runtime/trace.h"

using torch_tpu::runtime::Cell;
using torch_tpu::runtime::Runtime;

namespace {

constexpr int kThreads = 4;

const char* kAddOne = R"(module @m {
  func.func public @main(%a: tensor<4xf32> {tf.aliasing_output = 0 : i32}) -> tensor<4xf32> {
    %c = "stablehlo.constant"() {value = dense<1.0> : tensor<4xf32>} : () -> tensor<4xf32>
    %0 = "stablehlo.add"(%a, %c) : (tensor<4xf32>, tensor<4xf32>) -> tensor<4xf32>
    "func.return"(%0) : (tensor<4xf32>) -> ()
  }
})";

const char* kAddScalar = R"(module @m {
  func.func public @main(%a: tensor<4xf32>, %s: tensor<f32>) -> tensor<4xf32> {
    %b = "stablehlo.broadcast_in_dim"(%s) {broadcast_dimensions = array<i64>} : (tensor<f32>) -> tensor<4xf32>
    %0 = "stablehlo.add"(%a, %b) : (tensor<4xf32>, tensor<4xf32>) -> tensor<4xf32>
    "func.return"(%0) : (tensor<4xf32>) -> ()
  }
})";

const char* kCopyBytes = R"(module @m {
  func.func public @main(%a: tensor<16xui8>) -> tensor<16xui8> {
    "func.return"(%a) : (tensor<16xui8>) -> ()
  }
})";

Runtime& runtime() {
  static bool configured = [] {
    const char* p = std::getenv("TORCH_TPU_TEST_PLUGIN");
    Runtime::get().configure(p ? p : "", "TORCH_TPU_TEST_PLUGIN is not set", {{"cpu_device_count", 2}});
    return true;
  }();
  (void)configured;
  return Runtime::get();
}

std::shared_ptr<torch_tpu::pjrt::Executable> compiled(const std::string& key, const char* text) {
  return torch_tpu::runtime::compile_cache().get_or_compile(runtime().client(), key, text);
}

Cell* cell_of_floats(const std::vector<float>& v, int device) {
  Cell* c = runtime().new_cell(v.size() * sizeof(float), device);
  runtime().upload(*c, v.data(), c10::ScalarType::Float, static_cast<int64_t>(v.size()));
  return c;
}

std::vector<float> read(Cell* c) {
  std::vector<float> out(c->numel);
  runtime().download(*c, out.data(), out.size() * sizeof(float));
  return out;
}

}  // namespace

// First in the file: the client must not have started yet. Threads that each find it not started
// race to start it, and read it while it starts (started(), then client()): one client for all.
TEST(Settings, ReadThroughTheTableOnly) {
  namespace s = torch_tpu::settings;
  EXPECT_THROW(s::get("TORCH_TPU_NOT_DECLARED"), c10::Error);
  ::unsetenv("TORCH_TPU_DIST_VERIFY");
  EXPECT_TRUE(s::enabled("TORCH_TPU_DIST_VERIFY"));  // its default
  ::setenv("TORCH_TPU_DIST_VERIFY", "0", 1);
  EXPECT_FALSE(s::enabled("TORCH_TPU_DIST_VERIFY"));
  ::unsetenv("TORCH_TPU_DIST_VERIFY");
  ::setenv("TORCH_TPU_KEEP_BUSY_BYTES", "", 1);  // set but empty: the default
  EXPECT_EQ(s::integer("TORCH_TPU_KEEP_BUSY_BYTES"), 262144);
  ::setenv("TORCH_TPU_KEEP_BUSY_BYTES", "12k", 1);
  EXPECT_THROW(s::integer("TORCH_TPU_KEEP_BUSY_BYTES"), c10::Error);
  ::unsetenv("TORCH_TPU_KEEP_BUSY_BYTES");
  EXPECT_FALSE(s::get("TORCH_TPU_PLUGIN_LOGS").has_value());  // no default
}

TEST(Runtime, ClientStartedFromManyThreadsAtOnce) {
  ASSERT_FALSE(runtime().started());
  std::vector<torch_tpu::pjrt::Client*> seen(kThreads, nullptr);
  std::atomic<int> ready{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      ready++;
      while (ready.load() < kThreads) {
      }
      (void)runtime().started();  // read while another thread may be starting the client
      seen[t] = &runtime().client();
      EXPECT_TRUE(runtime().started());
    });
  }
  for (auto& th : threads) th.join();
  for (int t = 1; t < kThreads; ++t) EXPECT_EQ(seen[t], seen[0]);
  EXPECT_GT(runtime().client().device_count(), 0u);
}

TEST(Runtime, UploadLaunchDownload) {
  auto exe = compiled("runtime_test_add_one", kAddOne);
  Cell* c = cell_of_floats({1, 2, 3, 4}, 0);
  for (int i = 0; i < 3; ++i) runtime().execute(exe, {{c, nullptr}}, {c}, 0, "add_one");
  EXPECT_EQ(read(c), (std::vector<float>{4, 5, 6, 7}));
  runtime().free_cell(c);
}

TEST(Runtime, LaunchesFromManyThreads) {
  // Each thread updates its own cell in place (a donated buffer) while the others do the same; one
  // launcher thread issues them all. Every update lands, in each thread's order.
  auto exe = compiled("runtime_test_add_one", kAddOne);
  std::vector<Cell*> cells;
  for (int t = 0; t < kThreads; ++t) cells.push_back(cell_of_floats({0, 0, 0, float(t)}, t % 2));
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      for (int i = 0; i < 100; ++i) runtime().execute(exe, {{cells[t], nullptr}}, {cells[t]}, t % 2, "add_one");
      runtime().synchronize(t % 2);
    });
  }
  for (auto& th : threads) th.join();
  for (int t = 0; t < kThreads; ++t) {
    EXPECT_EQ(read(cells[t]), (std::vector<float>{100, 100, 100, 100.0f + t}));
    runtime().free_cell(cells[t]);
  }
}

TEST(Runtime, CellsMadeAndFreedFromManyThreads) {
  std::vector<std::thread> threads;
  std::atomic<int> wrong{0};
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      for (int i = 0; i < 50; ++i) {
        Cell* c = cell_of_floats({float(t), float(i), 0, 0}, 0);
        if (runtime().cell_at(reinterpret_cast<void*>(c->addr)) != c) wrong++;
        if (read(c)[1] != float(i)) wrong++;
        runtime().free_cell(c);
      }
    });
  }
  for (auto& th : threads) th.join();
  EXPECT_EQ(wrong.load(), 0);
}

TEST(Runtime, NeverWrittenCellsReadByALaunchWhileTheCallerWritesThem) {
  // A launch reads a cell nobody wrote (its zeros are made on the launcher thread, in the cell's
  // type) while this thread at once queues a launch that writes the cell: a queued launch's cells
  // never have their type or size written under it (ThreadSanitizer). A never-typed argument is
  // typed on this thread when its launch is queued, not later by the launcher.
  auto add_one = compiled("runtime_test_add_one", kAddOne);
  auto copy_bytes = compiled("runtime_test_copy_bytes", kCopyBytes);
  for (int i = 0; i < 50; ++i) {
    Cell* zeros = runtime().new_cell(4 * sizeof(float), 0);
    runtime().ensure_typed(*zeros, c10::ScalarType::Float);  // as an eager call key types it
    Cell* out = runtime().new_cell(4 * sizeof(float), 0);
    runtime().execute(add_one, {{zeros, nullptr}}, {out}, 0, "read_zeros");
    runtime().execute(add_one, {{out, nullptr}}, {zeros}, 0, "write_zeros");
    Cell* bytes = runtime().new_cell(16, 0);
    Cell* copy = runtime().new_cell(16, 0);
    runtime().execute(copy_bytes, {{bytes, nullptr}}, {copy}, 0, "copy_bytes");
    EXPECT_EQ(bytes->dtype, c10::ScalarType::Byte);
    EXPECT_EQ(read(zeros), (std::vector<float>{2, 2, 2, 2}));
    for (Cell* c : {zeros, out, bytes, copy}) runtime().free_cell(c);
  }
}

TEST(CompileCache, SameProgramFromManyThreads) {
  auto& cache = torch_tpu::runtime::compile_cache();
  cache.reset_stats();
  std::vector<std::shared_ptr<torch_tpu::pjrt::Executable>> got(kThreads);
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t)
    threads.emplace_back([&, t] { got[t] = compiled("runtime_test_add_scalar", kAddScalar); });
  for (auto& th : threads) th.join();
  for (auto& e : got) ASSERT_TRUE(e != nullptr);
  auto s = cache.stats();
  int64_t tier_hits = 0;
  for (const auto& t : s.tiers) tier_hits += t.hits;
  EXPECT_EQ(s.memory_hits + tier_hits + s.misses, kThreads);
  EXPECT_GE(s.misses + tier_hits, 1);
  EXPECT_TRUE(compiled("runtime_test_add_scalar", kAddScalar) != nullptr);
  EXPECT_GE(cache.stats().memory_hits, 1);
}

TEST(CompileCache, DiskTierServesAfterMemoryIsDropped) {
  const char* dir = std::getenv("TORCH_TPU_TEST_DIR");
  ASSERT_TRUE(dir) << "TORCH_TPU_TEST_DIR is not set";
  auto& cache = torch_tpu::runtime::compile_cache();
  cache.configure({{"disk", dir, int64_t(1) << 30, false}});
  compiled("runtime_test_disk", kAddOne);
  cache.clear_memory();
  cache.reset_stats();
  ASSERT_TRUE(compiled("runtime_test_disk", kAddOne) != nullptr);
  EXPECT_EQ(cache.stats().tiers.at(0).hits, 1);
  cache.configure({});
}

TEST(CompileCache, HitInASlowerTierIsPromotedIntoTheFasterOnes) {
  const char* dir = std::getenv("TORCH_TPU_TEST_DIR");
  ASSERT_TRUE(dir) << "TORCH_TPU_TEST_DIR is not set";
  const std::string fast = std::string(dir) + "/fast", slow = std::string(dir) + "/slow";
  auto& cache = torch_tpu::runtime::compile_cache();
  cache.configure({{"fast", "", 0, false}, {"slow", slow, 0, false}});  // "fast" off: only "slow" gets it
  compiled("runtime_test_promote", kAddOne);
  cache.configure({{"fast", fast, 0, false}, {"slow", slow, 0, false}});
  cache.clear_memory();
  cache.reset_stats();
  ASSERT_TRUE(compiled("runtime_test_promote", kAddOne) != nullptr);
  auto s = cache.stats();
  EXPECT_EQ(s.misses, 0);
  EXPECT_EQ(s.tiers.at(0).hits, 0);
  EXPECT_EQ(s.tiers.at(1).hits, 1);
  EXPECT_EQ(s.tiers.at(0).writes, 1);
  cache.clear_memory();
  ASSERT_TRUE(compiled("runtime_test_promote", kAddOne) != nullptr);
  EXPECT_EQ(cache.stats().tiers.at(0).hits, 1);  // now served by the faster tier
  cache.configure({});
}

TEST(Trace, ExecutionsRecordedFromManyThreads) {
  // While recording, every launch gets one record, with its thread's correlation id, stamped by the
  // issuing thread and by the plugin's completion callback; nothing is recorded after stop().
  namespace trace = torch_tpu::runtime::trace;
  auto exe = compiled("runtime_test_add_one", kAddOne);
  std::vector<Cell*> cells;
  for (int t = 0; t < kThreads; ++t) cells.push_back(cell_of_floats({0, 0, 0, 0}, t % 2));
  constexpr int kLaunches = 25;
  trace::start();
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      trace::push_correlation(100 + t);
      for (int i = 0; i < kLaunches; ++i) runtime().execute(exe, {{cells[t], nullptr}}, {cells[t]}, t % 2, "add_one");
      trace::pop_correlation();
      runtime().synchronize(t % 2);
    });
  }
  for (auto& th : threads) th.join();
  trace::stop();
  EXPECT_FALSE(trace::recording());
  runtime().execute(exe, {{cells[0], nullptr}}, {cells[0]}, 0, "after stop");
  runtime().synchronize(-1);
  auto records = trace::take();
  ASSERT_EQ(records.size(), size_t(kThreads * kLaunches));
  std::vector<int> per_thread(kThreads, 0);
  for (const auto& r : records) {
    EXPECT_EQ(r->name, "add_one");
    ASSERT_TRUE(r->correlation >= 100 && r->correlation < 100 + kThreads);
    int t = static_cast<int>(r->correlation - 100);
    per_thread[t]++;
    EXPECT_EQ(r->device, t % 2);
    int64_t issued = r->issued_ns.load(), returned = r->returned_ns.load(), done = r->done_ns.load();
    EXPECT_GT(issued, 0);
    EXPECT_GE(returned, issued);
    EXPECT_TRUE(done == 0 || done >= returned);
  }
  for (int n : per_thread) EXPECT_EQ(n, kLaunches);
  EXPECT_TRUE(trace::take().empty());
  for (Cell* c : cells) runtime().free_cell(c);
}

TEST(ScalarOperands, OneBufferPerValueFromManyThreads) {
  auto exe = compiled("runtime_test_add_scalar", kAddScalar);
  std::vector<Cell*> out(kThreads);
  Cell* in = cell_of_floats({1, 1, 1, 1}, 0);
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    out[t] = runtime().new_cell(4 * sizeof(float), 0);
    threads.emplace_back([&, t] {
      for (int i = 0; i < 50; ++i) {
        auto s = torch_tpu::aten::scalar_arg(c10::Scalar(double(i % 3)), c10::ScalarType::Float, 0);
        runtime().execute(exe, {{in, nullptr}, s}, {out[t]}, 0, "add_scalar");
      }
    });
  }
  for (auto& th : threads) th.join();
  for (int t = 0; t < kThreads; ++t) {
    EXPECT_EQ(read(out[t]), (std::vector<float>{2, 2, 2, 2}));  // the last value was 49 % 3 = 1
    runtime().free_cell(out[t]);
  }
  runtime().free_cell(in);
}

TEST(PlanCache, FindsWhatWasPutAndEvictsTheLeastRecentlyUsed) {
  torch_tpu::eager::PlanCache cache("test plans", 8);
  for (int64_t i = 0; i < 8; ++i) cache.put({i}, std::make_shared<torch_tpu::eager::Plan>());
  ASSERT_TRUE(cache.find({0}) != nullptr);  // now the most recently used
  cache.put({100}, std::make_shared<torch_tpu::eager::Plan>());  // full: the least recently used goes
  EXPECT_EQ(cache.size(), 8u);
  EXPECT_TRUE(cache.find({0}) != nullptr);
  EXPECT_TRUE(cache.find({1}) == nullptr);
  EXPECT_TRUE(cache.find({2}) != nullptr);
  EXPECT_TRUE(cache.find({100}) != nullptr);
  auto s = cache.stats();
  EXPECT_EQ(s.name, "test plans");
  EXPECT_EQ(s.entries, 8);
  EXPECT_EQ(s.capacity, 8);
  EXPECT_EQ(s.hits, 4);
  EXPECT_EQ(s.misses, 1);
  EXPECT_EQ(s.evictions, 1);
}

// A value leaves the cache after its lock is released: here an evicted value's destructor uses the
// cache (as a plan's Python entry may wait for the GIL that a thread inside the cache holds).
TEST(LruCache, EvictedValuesAreReleasedOutsideTheLock) {
  using Cache = torch_tpu::runtime::LruCache<int, std::shared_ptr<int>>;
  Cache cache("test reentrant", 2);
  int seen_size = -1;
  for (int i = 0; i < 3; ++i) {
    auto v = std::shared_ptr<int>(new int(i), [&cache, &seen_size](int* p) {
      seen_size = static_cast<int>(cache.size());  // would deadlock under the cache's lock
      delete p;
    });
    cache.put(i, std::move(v));
  }
  EXPECT_EQ(seen_size, 2);  // the evicted first value, released once the third was in
  EXPECT_TRUE(cache.find(0) == nullptr);
  cache.clear();
  EXPECT_EQ(cache.size(), 0u);
}

// The byte bound: the least recently used go until the values' bytes fit; a value bigger than the
// bound alone stays (the cache never refuses what was just put); replacing a value recounts it.
TEST(LruCache, BoundedByBytes) {
  using Cache = torch_tpu::runtime::LruCache<int, std::shared_ptr<int>>;
  Cache cache("test bytes", 100, 1000);
  for (int i = 0; i < 4; ++i) cache.put(i, std::make_shared<int>(i), 300);
  auto s = cache.stats();
  EXPECT_EQ(s.entries, 3);
  EXPECT_EQ(s.bytes, 900);
  EXPECT_EQ(s.max_bytes, 1000);
  EXPECT_EQ(s.evictions, 1);
  EXPECT_TRUE(cache.find(0) == nullptr);
  cache.find(1);  // now the most recently used: 2 goes first
  cache.put(9, std::make_shared<int>(9), 250);
  EXPECT_TRUE(cache.find(2) == nullptr);
  EXPECT_TRUE(cache.find(1) != nullptr);
  cache.put(3, std::make_shared<int>(33), 100);  // replaced: 300 -> 100 bytes
  EXPECT_EQ(cache.stats().bytes, 300 + 250 + 100);
  cache.put(7, std::make_shared<int>(7), 5000);  // alone past the bound: it stays, the rest go
  s = cache.stats();
  EXPECT_EQ(s.entries, 1);
  EXPECT_EQ(s.bytes, 5000);
  EXPECT_TRUE(cache.find(7) != nullptr);
  cache.clear();
  EXPECT_EQ(cache.stats().bytes, 0);
}

TEST(LruCache, CountersOfEveryLiveCacheByName) {
  using Cache = torch_tpu::runtime::LruCache<int, std::shared_ptr<int>>;
  auto named = [](const std::string& name) {
    for (const auto& s : torch_tpu::runtime::host_caches())
      if (s.name == name) return s;
    return torch_tpu::runtime::HostCacheStats{};
  };
  {
    Cache a("test shapes", 4), b("test shapes", 4);
    a.put(1, std::make_shared<int>(1));
    b.put(2, std::make_shared<int>(2));
    a.find(1);
    b.find(3);
    auto s = named("test shapes");
    EXPECT_EQ(s.entries, 2);
    EXPECT_EQ(s.capacity, 8);
    EXPECT_EQ(s.hits, 1);
    EXPECT_EQ(s.misses, 1);
  }
  EXPECT_EQ(named("test shapes").name, "");  // destroyed caches are gone from the list
}

TEST(PlanCache, ManyThreadsFindAndPut) {
  torch_tpu::eager::PlanCache cache("test plans", 64);
  std::vector<std::thread> threads;
  std::atomic<int> wrong{0};
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      for (int64_t i = 0; i < 2000; ++i) {
        std::vector<int64_t> key{t, i % 50};
        auto p = cache.find(key);
        if (!p) {
          p = std::make_shared<torch_tpu::eager::Plan>();
          p->rng_draws = static_cast<uint64_t>(t * 1000 + i % 50);
          cache.put(key, p);
        } else if (p->rng_draws != static_cast<uint64_t>(t * 1000 + i % 50)) {
          wrong++;
        }
      }
    });
  }
  for (auto& th : threads) th.join();
  EXPECT_EQ(wrong.load(), 0);
  EXPECT_LE(cache.size(), 64u);
}

TEST(EagerMode, BlocksArePerThread) {
  using torch_tpu::eager::Mode;
  torch_tpu::eager::set_default_mode(Mode::kStrict);
  torch_tpu::eager::push_thread_mode(Mode::kFused);
  Mode seen_elsewhere = Mode::kDebug;
  std::thread other([&] { seen_elsewhere = torch_tpu::eager::mode(); });
  other.join();
  EXPECT_EQ(torch_tpu::eager::mode(), Mode::kFused);
  EXPECT_EQ(seen_elsewhere, Mode::kStrict);
  torch_tpu::eager::pop_thread_mode();
  EXPECT_EQ(torch_tpu::eager::mode(), Mode::kStrict);
  EXPECT_FALSE(torch_tpu::eager::thread_mode().has_value());
}

// ---- Fused eager's recorder (csrc/eager/fused.*), with a test builder in place of Python's ----
namespace {

// A plan that adds one to the storage it is given, in place.
std::shared_ptr<torch_tpu::eager::Plan> add_one_plan() {
  auto p = std::make_shared<torch_tpu::eager::Plan>();
  p->exe = compiled("runtime_test_add_one", kAddOne);
  p->uid = 77;
  p->name = "add_one";
  p->sinks = {{false, 0}};
  p->structure = torch_tpu::eager::Plan::kWritten;
  return p;
}

// Builds the fused program of a run of add_one records: each local read is an argument, and each
// output local gets its value plus the number of records that wrote it. Counts its calls.
struct AddOneBuilder {
  std::atomic<int>* calls;
  bool fail = false;
  torch_tpu::eager::FusedProgram operator()(const std::vector<torch_tpu::eager::Record>& records,
                                           const std::vector<int>& outputs) const {
    ++*calls;
    if (fail) throw std::runtime_error("test builder refused the run");
    std::map<int, int> adds;
    std::vector<int> locals;  // in order of first use
    for (const auto& r : records) {
      int l = r.wiring.at(0).index;
      if (!adds.count(l)) locals.push_back(l);
      adds[l]++;
    }
    std::string args, types, body, results;
    torch_tpu::eager::FusedProgram prog;
    for (size_t i = 0; i < locals.size(); ++i) {
      args += (i ? ", " : "") + ("%a" + std::to_string(locals[i])) + ": tensor<4xf32>";
      prog.args.push_back({true, locals[i]});
    }
    for (size_t k = 0; k < outputs.size(); ++k) {
      std::string o = std::to_string(outputs[k]), n = std::to_string(adds[outputs[k]]);
      body += "    %c" + o + " = \"stablehlo.constant\"() {value = dense<" + n + ".0> : tensor<4xf32>} : () -> tensor<4xf32>\n";
      body += "    %r" + o + " = \"stablehlo.add\"(%a" + o + ", %c" + o +
              ") : (tensor<4xf32>, tensor<4xf32>) -> tensor<4xf32>\n";
      types += std::string(k ? ", " : "") + "tensor<4xf32>";
      results += std::string(k ? ", " : "") + "%r" + o;
    }
    std::string text = "module @m {\n  func.func public @main(" + args + ") -> (" + types + ") {\n" + body +
                       "    \"func.return\"(" + results + ") : (" + types + ") -> ()\n  }\n}";
    prog.exe = compiled("runtime_test_fused_" + std::to_string(std::hash<std::string>{}(text)), text.c_str());
    return prog;
  }
};

at::Tensor tpu_floats(const std::vector<float>& v) {
  runtime();
  at::Tensor t = torch_tpu::aten::new_tpu_tensor({static_cast<int64_t>(v.size())}, c10::ScalarType::Float, 0);
  runtime().upload(*torch_tpu::aten::cell_of(t), v.data(), c10::ScalarType::Float, static_cast<int64_t>(v.size()));
  return t;
}

void record_add_one(torch_tpu::eager::FusedRecorder& rec, const std::shared_ptr<torch_tpu::eager::Plan>& plan,
                    const at::Tensor& t) {
  rec.record(plan, {{torch_tpu::aten::cell_of(t), nullptr}}, {t}, {t}, 0);
}

}  // namespace

TEST(FusedRecorder, ARunIsOneProgramFoundAgainByItsSignature) {
  torch_tpu::eager::FusedRecorder rec;
  std::atomic<int> calls{0};
  rec.set_builder(AddOneBuilder{&calls}, [](const torch_tpu::eager::Plan& p) { return p.exe; });
  auto plan = add_one_plan();
  at::Tensor a = tpu_floats({1, 2, 3, 4}), b = tpu_floats({0, 0, 0, 0});
  for (int step = 1; step <= 2; ++step) {
    record_add_one(rec, plan, a);
    record_add_one(rec, plan, b);
    record_add_one(rec, plan, a);
    EXPECT_EQ(rec.pending(), 3u);
    rec.flush();
    EXPECT_EQ(rec.pending(), 0u);
    float s = static_cast<float>(step);
    EXPECT_EQ(read(torch_tpu::aten::cell_of(a)), (std::vector<float>{1 + 2 * s, 2 + 2 * s, 3 + 2 * s, 4 + 2 * s}));
    EXPECT_EQ(read(torch_tpu::aten::cell_of(b)), (std::vector<float>{s, s, s, s}));
  }
  EXPECT_EQ(calls.load(), 1);  // the second step's run has the first's signature
  auto st = rec.stats();
  EXPECT_EQ(st.ops, 6);
  EXPECT_EQ(st.flushes, 2);
  EXPECT_EQ(st.compiles, 1);
}

TEST(FusedRecorder, ARunWhoseProgramFailsToBuildRunsOpByOp) {
  torch_tpu::eager::FusedRecorder rec;
  std::atomic<int> calls{0};
  rec.set_builder(AddOneBuilder{&calls, true}, [](const torch_tpu::eager::Plan& p) { return p.exe; });
  auto plan = add_one_plan();
  at::Tensor a = tpu_floats({1, 2, 3, 4});
  record_add_one(rec, plan, a);
  record_add_one(rec, plan, a);
  EXPECT_THROW(rec.flush(), std::exception);
  EXPECT_EQ(rec.pending(), 0u);
  EXPECT_EQ(read(torch_tpu::aten::cell_of(a)), (std::vector<float>{3, 4, 5, 6}));  // each op ran alone
}

TEST(FusedRecorder, RecordsAndFlushesFromManyThreads) {
  // One recorder, as the process has: threads record into the same run and flush it; every
  // update lands once.
  torch_tpu::eager::FusedRecorder rec;
  std::atomic<int> calls{0};
  rec.set_builder(AddOneBuilder{&calls}, [](const torch_tpu::eager::Plan& p) { return p.exe; });
  auto plan = add_one_plan();
  std::vector<at::Tensor> ts;
  for (int t = 0; t < kThreads; ++t) ts.push_back(tpu_floats({0, 0, 0, float(t)}));
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      for (int i = 0; i < 40; ++i) {
        record_add_one(rec, plan, ts[t]);
        if (i % 10 == 9) rec.flush();
      }
    });
  }
  for (auto& th : threads) th.join();
  rec.flush();
  for (int t = 0; t < kThreads; ++t)
    EXPECT_EQ(read(torch_tpu::aten::cell_of(ts[t])), (std::vector<float>{40, 40, 40, 40.0f + t}));
  EXPECT_EQ(rec.stats().ops, 40 * kThreads);
}

// The dispatcher's entry of an op (csrc/eager/op_kernel.h) driven by a C++ front end: what torch_tpu's
// Python kernels do on a miss, here a fixed program that doubles a float32[4].
namespace {

const char* kDouble = R"(module @m {
  func.func public @main(%a: tensor<4xf32>) -> tensor<4xf32> {
    %0 = "stablehlo.add"(%a, %a) : (tensor<4xf32>, tensor<4xf32>) -> tensor<4xf32>
    "func.return"(%0) : (tensor<4xf32>) -> ()
  }
})";

TORCH_LIBRARY(tpu_test, m) { m.def("double_it(Tensor x) -> Tensor"); }

struct DoubleFrontEnd final : torch_tpu::eager::FrontEnd {
  std::atomic<int>* builds;
  std::atomic<int>* waits;
  DoubleFrontEnd(std::atomic<int>* b, std::atomic<int>* w) : builds(b), waits(w) {}
  void call_whole(const torch_tpu::eager::OpKernel&, torch::jit::Stack*) override {
    throw std::logic_error("double_it has no prepare step");
  }
  torch_tpu::eager::Built build(const torch_tpu::eager::OpKernel&, torch::jit::Stack*,
                                const torch_tpu::eager::Call& call,
                                const std::shared_ptr<torch_tpu::eager::Plan>& cached) override {
    EXPECT_EQ(call.parts.size(), 1u);  // described for the front end
    torch_tpu::eager::Built b;
    if (cached) {  // debug eager: the cached plan runs, then waits
      b.run = cached;
      return b;
    }
    ++*builds;
    auto p = std::make_shared<torch_tpu::eager::Plan>();
    p->exe = compiled("runtime_test_double", kDouble);
    p->order = {0};
    p->fresh = {torch_tpu::aten::FreshSpec{{4}, {}, c10::ScalarType::Float}};
    p->sinks = {{true, 0}};
    p->name = "tpu_test::double_it";
    p->fast = true;
    p->entry = std::make_shared<int>(0);
    b.store = b.run = p;
    return b;
  }
  std::shared_ptr<torch_tpu::eager::Plan> reread(const torch_tpu::eager::OpKernel&,
                                                 const torch_tpu::eager::Plan&) override {
    return nullptr;
  }
  void debug_synchronize(const torch_tpu::eager::OpKernel&, const torch_tpu::eager::Call& call) override {
    ++*waits;
    runtime().synchronize(call.device);
  }
};

// The op's kernel, registered once for the whole binary; counts its front end's builds and waits.
struct DoubleOp {
  std::atomic<int> builds{0}, waits{0};
  DoubleOp() {
    torch_tpu::eager::KernelOptions o;
    o.signature.kinds = "T";
    torch_tpu::eager::register_op_kernel("tpu_test::double_it", "", o, true,
                                         std::make_unique<DoubleFrontEnd>(&builds, &waits));
  }
  at::Tensor operator()(const at::Tensor& x) const {
    static auto op = c10::Dispatcher::singleton().findSchemaOrThrow("tpu_test::double_it", "")
                         .typed<at::Tensor(const at::Tensor&)>();
    return op.call(x);
  }
};

DoubleOp& double_op() {
  static DoubleOp op;
  return op;
}

}  // namespace

TEST(OpKernel, AMissIsBuiltByTheFrontEndOnceThenRunsFromThePlanCache) {
  auto& op = double_op();
  at::Tensor x = tpu_floats({1, 2, 3, 4});
  int builds = op.builds.load();
  int64_t fast = torch_tpu::eager::plan_fast_runs().load();
  for (int i = 0; i < 3; ++i) {
    at::Tensor y = op(x);
    EXPECT_EQ(y.sizes(), at::IntArrayRef({4}));
    EXPECT_EQ(read(torch_tpu::aten::cell_of(y)), (std::vector<float>{2, 4, 6, 8}));
  }
  EXPECT_LE(op.builds.load() - builds, 1);  // none when an earlier test built it
  EXPECT_GE(torch_tpu::eager::plan_fast_runs().load() - fast, 2);
}

TEST(OpKernel, DebugEagerRunsTheCachedPlanAndWaitsAfterEachCall) {
  auto& op = double_op();
  at::Tensor x = tpu_floats({1, 1, 1, 1});
  op(x);  // cached
  int waits = op.waits.load();
  torch_tpu::eager::push_thread_mode(torch_tpu::eager::Mode::kDebug);
  for (int i = 0; i < 2; ++i) EXPECT_EQ(read(torch_tpu::aten::cell_of(op(x))), (std::vector<float>{2, 2, 2, 2}));
  torch_tpu::eager::pop_thread_mode();
  EXPECT_EQ(op.waits.load() - waits, 2);
}

TEST(OpKernel, CalledFromManyThreads) {
  auto& op = double_op();
  std::vector<std::thread> threads;
  std::atomic<int> wrong{0};
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      at::Tensor x = tpu_floats({0, 1, 2, float(t)});
      for (int i = 0; i < 25; ++i)
        if (read(torch_tpu::aten::cell_of(op(x))) != std::vector<float>{0, 2, 4, 2.0f * t}) ++wrong;
    });
  }
  for (auto& th : threads) th.join();
  EXPECT_EQ(wrong.load(), 0);
  EXPECT_LE(op.builds.load(), kThreads);  // threads that miss at once may each build
}

// A compiled graph's per-call runner (csrc/graph/graph_runner.h) on the programs above.
namespace {

using torch_tpu::graph::ArgKind;
using torch_tpu::graph::GraphArg;
using torch_tpu::graph::GraphRunner;

GraphArg tpu_input(int64_t index) {
  GraphArg a;
  a.kind = ArgKind::kTpuInput;
  a.index = index;
  a.dims = {4};
  return a;
}

const torch_tpu::aten::FreshSpec kFloats4{{4}, {}, c10::ScalarType::Float};

}  // namespace

TEST(GraphRunner, ADonatedInputReceivesItsResultInPlace) {
  // add_one's output aliases its input: the graph's `x.add_(1)`.
  GraphRunner r(compiled("runtime_test_add_one", kAddOne), {tpu_input(0)}, {0}, {{0, 0}}, {kFloats4}, "add_one", 0,
                std::nullopt);
  at::Tensor x = tpu_floats({1, 2, 3, 4});
  for (int step = 1; step <= 2; ++step) {
    auto out = r.run({x}, {});
    ASSERT_EQ(out.tensors.size(), 1u);
    EXPECT_TRUE(out.tensors[0].is_same(x));
    EXPECT_TRUE(out.copied.empty());
    float s = static_cast<float>(step);
    EXPECT_EQ(read(torch_tpu::aten::cell_of(x)), (std::vector<float>{1 + s, 2 + s, 3 + s, 4 + s}));
  }
}

TEST(GraphRunner, CpuInputsAndConstantsAreUploadedAndResultsAreNewTensors) {
  GraphArg scalar;
  scalar.kind = ArgKind::kCpuInput;
  scalar.index = 1;
  GraphRunner with_input(compiled("runtime_test_add_scalar", kAddScalar), {tpu_input(0), scalar}, {}, {}, {kFloats4},
                         "add_scalar", 0, std::nullopt);
  at::Tensor x = tpu_floats({1, 2, 3, 4});
  auto out = with_input.run({x, at::scalar_tensor(10.0f)}, {});
  EXPECT_FALSE(out.tensors[0].is_same(x));
  EXPECT_EQ(read(torch_tpu::aten::cell_of(out.tensors[0])), (std::vector<float>{11, 12, 13, 14}));
  EXPECT_EQ(read(torch_tpu::aten::cell_of(x)), (std::vector<float>{1, 2, 3, 4}));

  GraphArg constant;
  constant.kind = ArgKind::kConstant;
  constant.constant = at::scalar_tensor(-1.0f);
  GraphRunner with_constant(compiled("runtime_test_add_scalar", kAddScalar), {tpu_input(0), constant}, {}, {},
                            {kFloats4}, "add_constant", 0, std::nullopt);
  EXPECT_EQ(read(torch_tpu::aten::cell_of(with_constant.run({x}, {}).tensors[0])), (std::vector<float>{0, 1, 2, 3}));
}

TEST(GraphRunner, BadPlansAndCallsRaise) {
  auto exe = compiled("runtime_test_add_one", kAddOne);
  EXPECT_THROW(GraphRunner(exe, {tpu_input(0)}, {3}, {}, {kFloats4}, "g", 0, std::nullopt), c10::Error);
  EXPECT_THROW(GraphRunner(exe, {tpu_input(0)}, {}, {}, {kFloats4, kFloats4}, "g", 0, std::nullopt), c10::Error);
  GraphRunner r(exe, {tpu_input(1)}, {}, {}, {kFloats4}, "g", 0, std::nullopt);
  EXPECT_THROW(r.run({tpu_floats({0, 0, 0, 0})}, {}), c10::Error);               // too few inputs
  EXPECT_THROW(r.run({tpu_floats({0, 0, 0, 0}), at::Tensor()}, {}), c10::Error);  // not a tensor
}

TEST(GraphRunner, OneRunnerCalledFromManyThreads) {
  GraphRunner r(compiled("runtime_test_add_one", kAddOne), {tpu_input(0)}, {0}, {{0, 0}}, {kFloats4}, "add_one", 0,
                std::nullopt);
  std::vector<at::Tensor> xs;
  for (int t = 0; t < kThreads; ++t) xs.push_back(tpu_floats({0, 0, 0, float(t)}));
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t)
    threads.emplace_back([&, t] {
      for (int i = 0; i < 30; ++i) r.run({xs[t]}, {});
    });
  for (auto& th : threads) th.join();
  for (int t = 0; t < kThreads; ++t)
    EXPECT_EQ(read(torch_tpu::aten::cell_of(xs[t])), (std::vector<float>{30, 30, 30, 30.0f + t}));
}
