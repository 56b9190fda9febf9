#include "graph/graph_runner.h"

#include <ATen/ops/empty_strided.h>

#include <chrono>

#include "aten/device.h"
#include "runtime/replica_meeting.h"

namespace torch_tpu::graph {
namespace {

using runtime::Cell;
using runtime::LaunchArg;
using runtime::Runtime;

// True when t has `strides` (dims of size 1 excepted), or is contiguous when `strides` is empty.
bool has_layout(const at::Tensor& t, const std::vector<int64_t>& strides) {
  if (strides.empty()) return t.is_contiguous();
  if (static_cast<size_t>(t.dim()) != strides.size()) return false;
  for (int64_t d = 0; d < t.dim(); ++d)
    if (t.size(d) != 1 && t.stride(d) != strides[d]) return false;
  return true;
}

// A constant or host operand: a tpu tensor's storage, or a CPU tensor uploaded to `device`.
LaunchArg tensor_arg(const at::Tensor& t, int device) {
  if (!t.is_cpu()) return {aten::cell_of(t), nullptr};
  return aten::host_tensor_arg(t, device);
}

}  // namespace

GraphRunner::GraphRunner(std::shared_ptr<pjrt::Executable> exe, std::vector<GraphArg> plan,
                         const std::vector<int64_t>& donated, std::vector<std::pair<int64_t, int64_t>> sink_plan,
                         std::vector<aten::FreshSpec> specs, std::string producer, uint64_t rng_draws,
                         std::optional<Meet> meet)
    : exe_(std::move(exe)), plan_(std::move(plan)), sink_plan_(std::move(sink_plan)), specs_(std::move(specs)),
      producer_(std::move(producer)), rng_draws_(rng_draws), meet_(std::move(meet)) {
  for (const GraphArg& a : plan_) {
    if (a.kind == ArgKind::kConstant && !a.constant.is_cpu() && constant_device_ < 0)
      constant_device_ = a.constant.get_device();
    if (a.kind == ArgKind::kTpuInput && first_tpu_input_ < 0) first_tpu_input_ = a.index;
    if (a.kind == ArgKind::kTpuInput || a.kind == ArgKind::kCpuInput) num_inputs_ = std::max(num_inputs_, a.index + 1);
  }
  for (auto& [k, i] : sink_plan_) num_inputs_ = std::max(num_inputs_, i + 1);
  donated_.assign(num_inputs_, false);
  for (int64_t i : donated) {
    TORCH_CHECK(i >= 0 && i < num_inputs_, "GraphRunner: donated input ", i, " is not a tpu input");
    donated_[i] = true;
  }
  TORCH_CHECK(specs_.size() == exe_->num_outputs(), "GraphRunner: ", specs_.size(), " result specs for ",
              exe_->num_outputs(), " program outputs");
}

GraphResults GraphRunner::run(const std::vector<at::Tensor>& inputs, const std::vector<at::Tensor>& packs) const {
  TORCH_CHECK(static_cast<int64_t>(inputs.size()) >= num_inputs_, "compiled ", producer_, ": expected ", num_inputs_,
              " inputs, got ", inputs.size());
  auto& rt = Runtime::get();
  auto input = [&](int64_t i) -> const at::Tensor& {
    TORCH_CHECK(inputs[i].defined(), "compiled ", producer_, ": input ", i, " is not a tensor");
    return inputs[i];
  };
  int device = first_tpu_input_ >= 0 ? input(first_tpu_input_).get_device()
               : constant_device_ >= 0 ? constant_device_
                                       : static_cast<int>(aten::current_device());
  std::vector<LaunchArg> args;
  args.reserve(plan_.size());
  std::vector<std::pair<uintptr_t, int64_t>> owners;  // storage key -> the input passing it
  owners.reserve(plan_.size());
  GraphResults out;
  std::vector<at::Tensor> copies;
  for (const GraphArg& a : plan_) {
    switch (a.kind) {
      case ArgKind::kTpuInput: {
        const at::Tensor& t = input(a.index);
        Cell* c = aten::cell_of(t);
        rt.ensure_typed(*c, t.scalar_type());
        bool whole = *c->dtype == t.scalar_type() && t.storage_offset() == 0 && t.numel() == c->numel &&
                     has_layout(t, a.strides) && c->dims == a.dims;
        bool clash = false;
        if (whole) {
          for (auto& [key, owner] : owners) {
            if (key == c->addr && (donated_[a.index] || donated_[owner])) clash = true;
          }
        }
        if (!whole || clash) {  // the program takes whole buffers in its layout; donation needs a sole user
          if (a.strides.empty()) {
            copies.push_back(t.clone(at::MemoryFormat::Contiguous));
          } else {
            copies.push_back(at::empty_strided(t.sizes(), a.strides, t.options()));
            copies.back().copy_(t);
          }
          out.copied.push_back(a.index);
          runtime::counters().graph_input_copies++;
          c = aten::cell_of(copies.back());
          rt.ensure_typed(*c, copies.back().scalar_type());
        }
        owners.emplace_back(c->addr, a.index);
        args.push_back({c, nullptr});
        break;
      }
      case ArgKind::kCpuInput: args.push_back(tensor_arg(input(a.index), device)); break;
      case ArgKind::kRngState: args.push_back(aten::rng_arg(aten::generator_next(std::nullopt, rng_draws_, device))); break;
      case ArgKind::kHostPack: args.push_back(tensor_arg(packs.at(a.index), device)); break;
      case ArgKind::kConstant: args.push_back(tensor_arg(a.constant, device)); break;
    }
  }
  std::vector<Cell*> sinks(specs_.size(), nullptr);
  out.tensors.resize(specs_.size());
  for (auto& [k, i] : sink_plan_) {
    bool was_copied = false;
    for (int64_t x : out.copied) was_copied |= x == i;
    if (was_copied) continue;  // the result goes to a new tensor; the caller writes it back
    sinks[k] = aten::cell_of(input(i));
    out.tensors[k] = inputs[i];
  }
  for (size_t k = 0; k < sinks.size(); ++k) {
    if (sinks[k]) continue;
    out.tensors[k] = aten::new_tensor_of(specs_[k], device);
    sinks[k] = aten::cell_of(out.tensors[k]);
  }
  // The copies above are eager ops: in fused eager they are recorded, not yet run.
  if (!copies.empty()) rt.flush_recorded();
  if (meet_) {
    launch_replica(std::move(args), std::move(sinks), device);
  } else {
    rt.execute(exe_, std::move(args), std::move(sinks), device, producer_);
  }
  return out;
}

// This device's replica of a program over several devices.
void GraphRunner::launch_replica(std::vector<LaunchArg> args, std::vector<Cell*> sinks, int device) const {
  int locals = 0, mine = -1;
  for (int d : meet_->local) {
    if (d < 0) continue;
    if (d == device) mine = locals;
    locals++;
  }
  TORCH_CHECK(mine >= 0, "compiled ", producer_, ": its inputs are on tpu:", device,
              ", which runs none of its replicas (a graph with collectives runs on the devices of its process "
              "group's ranks)");
  Runtime::get().flush_recorded();  // fused eager's recorded writes to the inputs are issued first
  Runtime::ReplicaPart part{std::move(args), std::move(sinks), device};
  runtime::launch_together(meet_->place, locals, mine, exe_, std::move(part),
                           std::chrono::milliseconds(meet_->timeout_ms), producer_);
}

}  // namespace torch_tpu::graph
