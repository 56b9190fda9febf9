// torch_tpu._C.graph.GraphRunner: the per-call work of a compiled graph (torch.compile(backend="tpu")),
// in C++ because it runs on every step and the host thread competes with the device's.
#include "python/bindings.h"

#include <ATen/ops/empty_strided.h>
#include <torch/csrc/autograd/python_variable.h>

#include <chrono>
#include <optional>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "aten/device.h"
#include "eager/plan.h"
#include "python/launch_args.h"
#include "runtime/replica_meeting.h"

namespace torch_tpu::python {
namespace {

using runtime::Cell;
using runtime::LaunchArg;
using runtime::Runtime;

// Kinds of program argument, as torch_tpu/dynamo/lower_graph.py's GraphProgram plans them (_C.graph.ArgKind).
enum Kind : int { kTpuInput = 0, kCpuInput = 1, kRngState = 2, kHostPack = 3, kConstant = 4 };

struct Arg {
  Kind kind;
  int64_t index;                 // the graph input (kTpuInput, kCpuInput) or host pack (kHostPack)
  py::object constant;           // kConstant: a tensor
  std::vector<int64_t> strides;  // kTpuInput: the layout the program reads it in (empty: contiguous)
  std::vector<int64_t> dims;     // kTpuInput: the dims of the buffer the program takes
};

// True when t has `strides` (dims of size 1 excepted), or is contiguous when `strides` is empty.
bool has_layout(const at::Tensor& t, const std::vector<int64_t>& strides) {
  if (strides.empty()) return t.is_contiguous();
  if (static_cast<size_t>(t.dim()) != strides.size()) return false;
  for (int64_t d = 0; d < t.dim(); ++d)
    if (t.size(d) != 1 && t.stride(d) != strides[d]) return false;
  return true;
}

// Runs one compiled graph per call:
// - a tpu input that is its whole storage, in the storage's dtype and the layout the program reads
//   (contiguous, or the strides its plan entry gives), whose buffer has the dims the program takes,
//   is passed as that storage's buffer; any other view, and a storage passed twice where one use is
//   donated, as a copy in that layout (a fresh buffer of those dims), reported in
//   `copied` so that the caller writes results back into the view;
// - CPU inputs, host packs and CPU constants are uploaded; the rng operand advances the generator;
// - result k that replaces input i's value (sink_plan) is written into i's storage unless i was
//   copied; every other result gets a new tensor of its (shape, dtype[, strides]) spec.
// A graph with collectives is one program over several devices (`meet`: where the parts meet, the
// local device of each replica or -1, the timeout in ms): this call launches the replica on its
// inputs' device, together with the other replicas this process drives (runtime/replica_meeting.h).
class GraphRunner {
 public:
  GraphRunner(std::shared_ptr<pjrt::Executable> exe, py::list plan, const std::vector<int64_t>& donated,
              std::vector<std::pair<int64_t, int64_t>> sink_plan, py::list specs, std::string producer,
              uint64_t rng_draws, std::optional<std::tuple<std::string, std::vector<int>, int64_t>> meet)
      : exe_(std::move(exe)), sink_plan_(std::move(sink_plan)), producer_(std::move(producer)),
        rng_draws_(rng_draws), meet_(std::move(meet)) {
    for (py::handle h : plan) {
      auto entry = h.cast<py::tuple>();
      Arg a{entry[0].cast<Kind>(), -1, py::none()};
      if (a.kind == kConstant) {
        a.constant = py::reinterpret_borrow<py::object>(entry[1]);
        const at::Tensor& t = THPVariable_Unpack(a.constant.ptr());
        if (!t.is_cpu() && constant_device_ < 0) constant_device_ = t.get_device();
      } else if (a.kind != kRngState) {
        a.index = entry[1].cast<int64_t>();
      }
      if (a.kind == kTpuInput && !entry[2].is_none()) a.strides = entry[2].cast<std::vector<int64_t>>();
      if (a.kind == kTpuInput) a.dims = entry[3].cast<std::vector<int64_t>>();
      if (a.kind == kTpuInput && first_tpu_input_ < 0) first_tpu_input_ = a.index;
      if (a.kind == kTpuInput || a.kind == kCpuInput) num_inputs_ = std::max(num_inputs_, a.index + 1);
      plan_.push_back(std::move(a));
    }
    for (auto& [k, i] : sink_plan_) num_inputs_ = std::max(num_inputs_, i + 1);
    donated_.assign(num_inputs_, false);
    for (int64_t i : donated) {
      TORCH_CHECK(i >= 0 && i < num_inputs_, "GraphRunner: donated input ", i, " is not a tpu input");
      donated_[i] = true;
    }
    for (py::handle h : specs) specs_.push_back(h.cast<eager::FreshSpec>());
    TORCH_CHECK(specs_.size() == exe_->num_outputs(), "GraphRunner: ", specs_.size(), " result specs for ",
                exe_->num_outputs(), " program outputs");
  }

  // real: the graph's inputs (list); packs: the host packs' CPU tensors, in plan order.
  // Returns (results, copied): per program result, the tensor holding it (an input whose storage
  // received it, or a new tensor), and the indices of the inputs passed as copies.
  py::tuple call(const py::list& real, const py::list& packs) {
    TORCH_CHECK(static_cast<int64_t>(real.size()) >= num_inputs_, "compiled ", producer_, ": expected ",
                num_inputs_, " inputs, got ", real.size());
    auto& rt = Runtime::get();
    auto input = [&](int64_t i) -> const at::Tensor& {
      PyObject* o = PyList_GET_ITEM(real.ptr(), i);
      TORCH_CHECK(THPVariable_Check(o), "compiled ", producer_, ": input ", i, " is not a tensor");
      return THPVariable_Unpack(o);
    };
    int device = first_tpu_input_ >= 0 ? input(first_tpu_input_).get_device()
                 : constant_device_ >= 0 ? constant_device_
                                         : static_cast<int>(aten::current_device());
    std::vector<LaunchArg> args;
    args.reserve(plan_.size());
    std::vector<std::pair<uintptr_t, int64_t>> owners;  // storage key -> the input passing it
    owners.reserve(plan_.size());
    std::vector<int64_t> copied;
    std::vector<at::Tensor> copies;
    for (const Arg& a : plan_) {
      switch (a.kind) {
        case kTpuInput: {
          const at::Tensor& t = input(a.index);
          Cell* c = cell_of(t);
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
            copied.push_back(a.index);
            runtime::counters().graph_input_copies++;
            c = cell_of(copies.back());
            rt.ensure_typed(*c, copies.back().scalar_type());
          }
          owners.emplace_back(c->addr, a.index);
          args.push_back({c, nullptr});
          break;
        }
        case kCpuInput: args.push_back(launch_arg(PyList_GET_ITEM(real.ptr(), a.index), device)); break;
        case kRngState: {
          args.push_back(eager::rng_arg(aten::generator_next(std::nullopt, rng_draws_)));
          break;
        }
        case kHostPack: args.push_back(launch_arg(packs[a.index], device)); break;
        default: args.push_back(launch_arg(a.constant, device)); break;
      }
    }
    std::vector<Cell*> sinks(specs_.size(), nullptr);
    py::list results(specs_.size());
    for (auto& [k, i] : sink_plan_) {
      bool was_copied = false;
      for (int64_t x : copied) was_copied |= x == i;
      if (was_copied) continue;  // the result goes to a new tensor; the caller writes it back
      sinks[k] = cell_of(input(i));
      results[k] = real[i];
    }
    for (size_t k = 0; k < sinks.size(); ++k) {
      if (sinks[k]) continue;
      at::Tensor t = new_tpu_tensor_of_spec(specs_[k], device);
      sinks[k] = cell_of(t);
      results[k] = py::reinterpret_steal<py::object>(THPVariable_Wrap(std::move(t)));
    }
    // The copies above are eager ops: in fused eager they are recorded, not yet run.
    if (!copies.empty()) rt.flush_recorded();
    if (meet_) {
      launch_replica(std::move(args), std::move(sinks), device);
    } else {
      rt.execute(exe_, std::move(args), std::move(sinks), device, producer_);
    }
    return py::make_tuple(results, py::cast(copied));
  }

 private:
  // This device's replica of a program over several devices.
  void launch_replica(std::vector<LaunchArg> args, std::vector<Cell*> sinks, int device) {
    const auto& [place, local, timeout_ms] = *meet_;
    int locals = 0, mine = -1;
    for (int d : local) {
      if (d < 0) continue;
      if (d == device) mine = locals;
      locals++;
    }
    TORCH_CHECK(mine >= 0, "compiled ", producer_, ": its inputs are on tpu:", device,
                ", which runs none of its replicas (a graph with collectives runs on the devices of its process "
                "group's ranks)");
    Runtime::get().flush_recorded();  // fused eager's recorded writes to the inputs are issued first
    Runtime::ReplicaPart part{std::move(args), std::move(sinks), device};
    py::gil_scoped_release nogil;  // the other ranks' threads may need the GIL to arrive
    runtime::launch_together(place, locals, mine, exe_, std::move(part), std::chrono::milliseconds(timeout_ms),
                             producer_);
  }

  std::shared_ptr<pjrt::Executable> exe_;
  std::vector<Arg> plan_;
  std::vector<bool> donated_;
  std::vector<std::pair<int64_t, int64_t>> sink_plan_;
  std::vector<eager::FreshSpec> specs_;  // per program output
  std::string producer_;
  uint64_t rng_draws_;
  int64_t first_tpu_input_ = -1, num_inputs_ = 0;
  int constant_device_ = -1;
  std::optional<std::tuple<std::string, std::vector<int>, int64_t>> meet_;
};

}  // namespace

void bind_graph(py::module_& m) {
  py::enum_<Kind>(m, "ArgKind", "Where a compiled graph's program argument comes from, per call (GraphRunner's plan).")
      .value("tpu_input", kTpuInput)
      .value("cpu_input", kCpuInput)
      .value("rng_state", kRngState)
      .value("host_pack", kHostPack)
      .value("constant", kConstant);
  py::class_<GraphRunner>(m, "GraphRunner", "The per-call work of one compiled graph (see graph_runner.cc).")
      .def(py::init<std::shared_ptr<pjrt::Executable>, py::list, const std::vector<int64_t>&,
                    std::vector<std::pair<int64_t, int64_t>>, py::list, std::string, uint64_t,
                    std::optional<std::tuple<std::string, std::vector<int>, int64_t>>>(),
           py::arg("exe"), py::arg("plan"), py::arg("donated"), py::arg("sink_plan"), py::arg("specs"),
           py::arg("producer"), py::arg("rng_draws"), py::arg("meet") = py::none())
      .def("__call__", &GraphRunner::call, py::arg("inputs"), py::arg("packs"),
           "(results, copied): runs the program on `inputs` (the graph's inputs) and `packs` (host packs).");
}

}  // namespace torch_tpu::python
