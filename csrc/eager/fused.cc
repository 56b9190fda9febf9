#include "eager/fused.h"

#include <c10/util/Exception.h>

#include <algorithm>
#include <set>
#include <string>

#include "aten/device.h"

namespace torch_tpu::eager {

using runtime::Cell;
using runtime::LaunchArg;
using runtime::Runtime;

namespace {
uint64_t mix(uint64_t a, uint64_t b) {
  uint64_t h = a * 0x9E3779B97F4A7C15ull ^ (b + 0x632BE59BD9B4E019ull + (a << 6) + (a >> 2));
  h ^= h >> 31;
  h *= 0xBF58476D1CE4E5B9ull;
  h ^= h >> 29;
  return h;
}
}  // namespace

int FusedRecorder::Run::local(const at::Tensor& t) {
  return local(aten::cell_of(t), t.storage());
}

int FusedRecorder::Run::local(Cell* c, const c10::Storage& storage) {
  auto it = local_of.find(c);
  if (it != local_of.end()) return it->second;
  int i = static_cast<int>(locals.size());
  local_of.emplace(c, i);
  cells.push_back(c);
  locals.push_back(storage);
  written.push_back(false);
  deps.emplace_back();
  return i;
}

namespace {
bool has_bit(const std::vector<uint64_t>& bits, int i) {
  size_t w = static_cast<size_t>(i) / 64;
  return w < bits.size() && (bits[w] >> (i % 64)) & 1u;
}

void add_bits(std::vector<uint64_t>& into, const std::vector<uint64_t>& from) {
  if (into.size() < from.size()) into.resize(from.size(), 0);
  for (size_t w = 0; w < from.size(); ++w) into[w] |= from[w];
}

void set_bit(std::vector<uint64_t>& bits, int i) {
  size_t w = static_cast<size_t>(i) / 64;
  if (bits.size() <= w) bits.resize(w + 1, 0);
  bits[w] |= uint64_t{1} << (i % 64);
}
}  // namespace

void FusedRecorder::note_deps(Run& run, const Record& r) {
  std::vector<uint64_t> read;
  for (const auto& w : r.wiring) {
    if (!w.local) continue;
    set_bit(read, w.index);
    add_bits(read, run.deps[w.index]);
  }
  for (int o : r.outs) add_bits(run.deps[o], read);
}

bool FusedRecorder::writes_what_it_derives(const std::vector<at::Tensor>& input_tensors,
                                           const std::vector<at::Tensor>& sinks) const {
  for (const auto& t : sinks) {
    bool whole = t.storage_offset() == 0 && t.is_non_overlapping_and_dense() &&
                 static_cast<size_t>(t.numel()) * t.element_size() == t.storage().nbytes();
    if (whole) continue;  // an elementwise write of every element (h += f(h)): no update slice
    Cell* c = aten::cell_of(t);
    auto o = run_.local_of.find(c);
    if (o == run_.local_of.end()) continue;  // nothing in the run came from it
    bool reads_it = false, derived = false;
    for (const auto& in : input_tensors) {
      Cell* ic = aten::cell_of(in);
      if (ic == c) {
        reads_it = true;
        continue;
      }
      auto j = run_.local_of.find(ic);
      derived = derived || (j != run_.local_of.end() && has_bit(run_.deps[j->second], o->second));
    }
    if (reads_it && derived) return true;
  }
  return false;
}

void FusedRecorder::record(std::shared_ptr<const Plan> plan, std::vector<LaunchArg> inputs,
                           std::vector<at::Tensor> input_tensors, std::vector<at::Tensor> sinks, int device) {
  std::lock_guard<std::recursive_mutex> g(mu_);
  if ((run_.device >= 0 && run_.device != device) || writes_what_it_derives(input_tensors, sinks)) {
    run_start_ = position_;
    flush_locked(run_);
  }
  run_.device = device;
  Record r;
  r.plan = plan;
  size_t next_tensor = 0;
  for (auto& a : inputs) {
    if (a.cell) {
      r.wiring.push_back({true, run_.local(input_tensors.at(next_tensor++))});
    } else {
      r.wiring.push_back({false, static_cast<int>(run_.host.size())});
      run_.host.push_back(std::move(a));
    }
  }
  for (const auto& t : sinks) {
    Runtime::get().ensure_typed(*aten::cell_of(t), t.scalar_type());  // later ops read its layout now
    int i = run_.local(t);
    run_.written[i] = true;
    r.outs.push_back(i);
  }
  note_deps(run_, r);
  r.pair = mix(prev_uid_, plan->uid);
  prev_uid_ = plan->uid;
  run_.records.push_back(std::move(r));
  stats_.ops++;
  position_++;
  window_.push_back(run_.records.back().pair);
  if (window_.size() > 2 * kCutRadius + 1) window_.pop_front();
  if (window_.size() == 2 * kCutRadius + 1) {
    // Strictly smallest on the left, smallest on the right: in a loop shorter than the window each
    // iteration's minimum has an equal one iteration earlier, so such loops are not cut into single
    // iterations; they run to kMaxOps and are split at the same phase every time.
    uint64_t mid = window_[kCutRadius];
    bool cut = std::all_of(window_.begin(), window_.begin() + kCutRadius, [mid](uint64_t h) { return mid < h; }) &&
               std::all_of(window_.begin() + kCutRadius + 1, window_.end(), [mid](uint64_t h) { return mid <= h; });
    int64_t q = position_ - 1 - static_cast<int64_t>(kCutRadius);  // the stream position of `mid`
    if (cut && q >= run_start_) {
      split_locked(static_cast<size_t>(q - run_start_));
      return;
    }
  }
  if (run_.records.size() >= kMaxOps) {
    // The prefix ends at the last occurrence of the run's smallest hash (past its first quarter).
    uint64_t low = UINT64_MAX;
    size_t k = run_.records.size() - 1;
    for (size_t i = kMaxOps / 4; i < run_.records.size(); ++i) {
      if (run_.records[i].pair <= low) {
        low = run_.records[i].pair;
        k = i;
      }
    }
    split_locked(k);
  }
}

void FusedRecorder::split_locked(size_t k) {
  run_start_ += static_cast<int64_t>(k + 1);
  if (k + 1 >= run_.records.size()) {
    flush_locked(run_);
    return;
  }
  Run rest;
  rest.device = run_.device;
  for (size_t i = k + 1; i < run_.records.size(); ++i) {
    Record r = run_.records[i];
    for (auto& w : r.wiring) {
      if (w.local) {
        w.index = rest.local(run_.cells[w.index], run_.locals[w.index]);
      } else {
        int j = static_cast<int>(rest.host.size());
        rest.host.push_back(run_.host[w.index]);
        w.index = j;
      }
    }
    for (auto& o : r.outs) {
      int j = rest.local(run_.cells[o], run_.locals[o]);
      rest.written[j] = true;
      o = j;
    }
    note_deps(rest, r);
    rest.records.push_back(std::move(r));
  }
  run_.records.resize(k + 1);
  std::fill(run_.written.begin(), run_.written.end(), false);
  for (const auto& r : run_.records)
    for (int o : r.outs) run_.written[o] = true;
  // The prefix outputs what the rest reads, since the rest holds those storages.
  Run prefix = std::move(run_);
  run_ = std::move(rest);
  flush_locked(prefix);
}

void FusedRecorder::flush() {
  std::lock_guard<std::recursive_mutex> g(mu_);
  // A host read starts the stream afresh: cut points count from it, so a loop that syncs at the
  // same place every step is cut the same way every step even before its window fills.
  window_.clear();
  run_start_ = position_;
  flush_locked(run_);
}

void FusedRecorder::flush_locked(Run& run_ref) {
  if (run_ref.records.empty()) {
    run_ref = Run();
    return;
  }
  Run run = std::move(run_ref);
  run_ref = Run();
  // Outputs: written storages still in use (by a tensor, a view, autograd) besides this run.
  std::vector<int> outputs;
  for (size_t i = 0; i < run.locals.size(); ++i) {
    bool alive = run.locals[i].use_count() > 1;  // a tensor (the user's, a view, autograd's) besides ours
    if (run.written[i] && alive) outputs.push_back(static_cast<int>(i));
  }
  std::vector<int64_t> key;
  key.reserve(run.records.size() * 8 + outputs.size() + 2);
  for (const auto& r : run.records) {
    key.push_back(static_cast<int64_t>(r.plan->uid));
    key.push_back(static_cast<int64_t>(r.wiring.size()));
    for (const auto& w : r.wiring) key.push_back(w.local ? w.index : -1 - w.index);
    key.push_back(static_cast<int64_t>(r.outs.size()));
    key.insert(key.end(), r.outs.begin(), r.outs.end());
  }
  key.push_back(-1);
  key.insert(key.end(), outputs.begin(), outputs.end());
  std::shared_ptr<const FusedProgram> found = programs_.find(key);
  if (!found) {
    TORCH_CHECK(builder_, "fused eager: no program builder (torch_tpu was not imported?)");
    try {
      found = std::make_shared<const FusedProgram>(builder_(run.records, outputs));
    } catch (...) {
      replay(run);  // each op ran alone before; keep going op by op, then report
      throw;
    }
    stats_.compiles++;
    programs_.put(std::move(key), found, runtime::program_bytes(*found->exe));
  }
  const FusedProgram& prog = *found;
  std::vector<LaunchArg> args;
  args.reserve(prog.args.size());
  for (const auto& w : prog.args) {
    if (w.local)
      args.push_back({run.cells[w.index], nullptr});
    else
      args.push_back(run.host[w.index]);
  }
  std::vector<Cell*> sinks;
  sinks.reserve(outputs.size());
  for (int i : outputs) sinks.push_back(run.cells[i]);
  std::string names;
  std::set<std::string> seen;
  for (const auto& r : run.records) {
    if (seen.insert(r.plan->name).second) names += (names.empty() ? "" : ", ") + r.plan->name;
  }
  stats_.flushes++;
  std::string trace_name;
  if (runtime::trace::recording()) trace_name = "fused run (" + std::to_string(run.records.size()) + " ops)";
  Runtime::get().execute(prog.exe, std::move(args), std::move(sinks), run.device, "fused program of [" + names + "]",
                         std::move(trace_name));
}

void FusedRecorder::replay(Run& run) {
  for (const auto& r : run.records) {
    auto exe = r.plan->exe ? r.plan->exe : op_executable_(*r.plan);
    std::vector<LaunchArg> args;
    for (const auto& w : r.wiring) args.push_back(w.local ? LaunchArg{run.cells[w.index], nullptr} : run.host[w.index]);
    std::vector<Cell*> sinks;
    for (int o : r.outs) sinks.push_back(run.cells[o]);
    Runtime::get().execute(exe, std::move(args), std::move(sinks), run.device, r.plan->name);
  }
}

size_t FusedRecorder::pending() {
  std::lock_guard<std::recursive_mutex> g(mu_);
  return run_.records.size();
}

FusedStats FusedRecorder::stats() {
  std::lock_guard<std::recursive_mutex> g(mu_);
  return stats_;
}

void FusedRecorder::reset_stats() {
  std::lock_guard<std::recursive_mutex> g(mu_);
  stats_ = FusedStats();
}

void FusedRecorder::set_builder(FusedBuilder b, OpExecutable op_executable) {
  std::lock_guard<std::recursive_mutex> g(mu_);
  builder_ = std::move(b);
  op_executable_ = std::move(op_executable);
}

FusedRecorder& fused() {
  static auto* f = new FusedRecorder();  // never destroyed: programs outlive static destruction order
  return *f;
}

}  // namespace torch_tpu::eager
