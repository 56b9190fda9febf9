// torch_tpu._C.device: the device integration (csrc/aten) as Python sees it: the current device,
// generators, storages, host scalars, the CPU fallback's counters, and the autograd threads.
#include "python/bindings.h"

#include <ATen/ops/empty.h>
#include <torch/csrc/Exceptions.h>
#include <torch/csrc/Generator.h>
#include <torch/csrc/autograd/engine.h>
#include <torch/csrc/autograd/function.h>

#include <cstring>
#include <optional>

#include "aten/device.h"
#include "aten/fallback.h"
#include "runtime/runtime.h"

namespace torch_tpu::python {
namespace {

using runtime::Cell;
using runtime::Runtime;

// A backward node that does nothing. The autograd engine runs it on the device thread of its input's
// device, after whatever that thread took before.
struct AutogradThreadBarrier : torch::autograd::Node {
  torch::autograd::variable_list apply(torch::autograd::variable_list&&) override { return {}; }
  std::string name() const override { return "torch_tpu::AutogradThreadBarrier"; }
};

// Waits until each tpu autograd device thread has finished its last backward, the release of that
// backward's graph task included. The thread that runs a graph task's last node often drops its
// reference after the caller of backward() has already returned, and the graph task holds Python
// objects (the contextvars context that backward() stashes in the thread-local state): destroying it
// takes the GIL. A program that exits right after backward() could thus reach interpreter
// finalization first, and a thread that waits for the GIL then is ended by pthread_exit, whose forced
// unwind through the (noexcept) destructor calls std::terminate ("terminate called without an active
// exception"). A barrier graph per device, run from C++ (no Python objects in its thread-local state)
// with the GIL released, lets those threads finish first; what they release afterwards needs no GIL.
void drain_autograd_threads() {
  auto& rt = Runtime::get();
  // Without a started runtime no tpu backward ran (nothing to wait for, and starting the engine's
  // threads now would only cost); after a fork the device cannot be used.
  if (!rt.started() || Runtime::in_bad_fork()) return;
  auto& engine = torch::autograd::Engine::get_default_engine();
  for (int d = 0; d < rt.device_count_noexcept(); ++d) {
    // An empty tensor: allocating it launches nothing; its device picks the engine's thread.
    at::Tensor grad = at::empty({0}, at::TensorOptions().device(c10::Device(c10::kPrivateUse1, d)));
    c10::intrusive_ptr<torch::autograd::Node> node = c10::make_intrusive<AutogradThreadBarrier>();
    node->add_input_metadata(grad);
    engine.execute({torch::autograd::Edge(node, 0)}, {grad}, /*keep_graph=*/false, /*create_graph=*/false,
                   /*accumulate_grad=*/true);
  }
}

}  // namespace

void bind_device(py::module_& m) {
  m.def("current_device", [] { return static_cast<int>(torch_tpu::aten::current_device()); });
  m.def("set_device", [](int index) { torch_tpu::aten::set_device(index); });
  m.def("check_device_index", [](int index) { torch_tpu::aten::check_device_index(index); });
  m.def("visible_device_count", [] {
    torch::PyWarningHandler warnings;  // the first start's "runs on the CPU plugin" warning
    return static_cast<int>(torch_tpu::aten::visible_device_count());
  });
  m.def("own_device", [](int index) { return static_cast<int>(torch_tpu::aten::own_device(index)); });
  m.def("default_generator", [](int index) {
    return py::reinterpret_steal<py::object>(
        THPGenerator_initDefaultGenerator(torch_tpu::aten::default_generator(index)));
  });

  // Storage cells.
  m.def("storage_key", [](const at::Tensor& t) { return aten::cell_of(t)->addr; },
        "Identity of the tensor's storage (its fake device address).");
  m.def("storage_spec", [](const at::Tensor& t) {
    Cell* c = aten::cell_of(t);
    Runtime::get().ensure_typed(*c, t.scalar_type());
    return std::make_tuple(*c->dtype, py::tuple(py::cast(c->dims)));
  }, "(dtype, dims) of the storage's PJRT buffer, fixing them from t on first use.");

  m.def("host_copy", [](const at::Tensor& t) -> py::object {
    Cell* c = aten::cell_of(t);
    std::shared_ptr<const std::vector<char>> bytes = c->host_copy;
    if (!bytes || !c->dtype) return py::none();
    at::Tensor out = at::empty({c->numel}, at::TensorOptions().dtype(*c->dtype));
    std::memcpy(out.data_ptr(), bytes->data(), bytes->size());
    return py::cast(out);
  }, "The whole storage of tpu tensor t as a new 1-D CPU tensor of the storage's dtype, read from the host "
     "bytes kept from its upload (runtime.h's Cell::host_copy: uploaded whole, at most 256 KiB, not written "
     "since), without reading the device; None where none are kept.");

  m.def("content_key", [](const std::vector<at::Tensor>& ts) -> py::object {
    std::vector<int64_t> key;
    for (const auto& t : ts) {
      // Host allocators reuse addresses; inference tensors have no version counter.
      if (t.device().type() != c10::DeviceType::PrivateUse1 || t.is_inference()) return py::none();
      key.push_back(t.get_device());
      key.push_back(reinterpret_cast<int64_t>(t.data_ptr()));
      key.push_back(static_cast<int64_t>(t._version()));
      key.push_back(static_cast<int64_t>(t.scalar_type()));
      key.push_back(t.dim());
      key.insert(key.end(), t.sizes().begin(), t.sizes().end());
      key.insert(key.end(), t.strides().begin(), t.strides().end());
    }
    return py::tuple(py::cast(key));
  }, "A hashable identity of the tensors' data (device, address, version, dtype, layout), or None when "
     "one is not a tpu tensor or has no version counter. tpu storage addresses are never reused and "
     "every write bumps the version, so an unchanged key means unchanged data.");
  // Host scalars: an optimizer's step counts are many 0-dim CPU tensors; a compiled graph updates
  // them as one packed tensor (torch_tpu/dynamo/host_part.py). These two move their bytes.
  m.def("gather_scalars", [](const std::vector<at::Tensor>& ts) {
    TORCH_CHECK(!ts.empty(), "gather_scalars: no tensors");
    auto dtype = ts[0].scalar_type();
    for (const auto& t : ts)
      TORCH_CHECK(t.is_cpu() && t.dim() == 0 && t.scalar_type() == dtype,
                  "gather_scalars: expected 0-dim CPU tensors of one dtype (", dtype, "), got one of ",
                  t.scalar_type(), " with ", t.dim(), " dims on ", t.device());
    at::Tensor out = at::empty({static_cast<int64_t>(ts.size())}, ts[0].options());
    size_t size = c10::elementSize(dtype);
    auto* dst = static_cast<char*>(out.data_ptr());
    for (size_t i = 0; i < ts.size(); ++i) std::memcpy(dst + i * size, ts[i].const_data_ptr(), size);
    return out;
  }, "torch.stack of 0-dim CPU tensors of one dtype (a 1-D tensor); raises for any other tensor.");
  m.def("scatter_scalars", [](const at::Tensor& src, const std::vector<std::optional<at::Tensor>>& dsts) {
    // copy_ of src[i] into dsts[i] (skipping None), when that is a plain byte copy; otherwise
    // writes nothing and returns False (the caller copies with PyTorch's kernels).
    if (!src.is_cpu() || src.dim() != 1 || !src.is_contiguous() || src.numel() != static_cast<int64_t>(dsts.size()))
      return false;
    for (const auto& d : dsts) {
      if (d && (!d->is_cpu() || d->dim() != 0 || d->scalar_type() != src.scalar_type() || d->requires_grad() ||
                d->is_inference()))
        return false;
    }
    size_t size = c10::elementSize(src.scalar_type());
    const auto* from = static_cast<const char*>(src.const_data_ptr());
    for (size_t i = 0; i < dsts.size(); ++i) {
      if (!dsts[i]) continue;
      std::memcpy(dsts[i]->mutable_data_ptr(), from + i * size, size);
      dsts[i]->unsafeGetTensorImpl()->bump_version();  // as copy_ does
    }
    return true;
  }, "Writes src[i] into the 0-dim CPU tensor dsts[i] (None: skipped) as copy_ would; False (nothing "
     "written) when some pair needs more than a byte copy (another dtype or device, requires_grad).");
  m.def("drain_autograd_threads", [] {
    py::gil_scoped_release nogil;  // the threads may need the GIL to finish
    drain_autograd_threads();
  }, "At exit: waits for the tpu autograd device threads to finish their last backward (see "
     "drain_autograd_threads).");
  m.def("note_fallback", [](const std::string& full) {
    torch::PyWarningHandler warnings;  // the first use's warning, as a Python warning
    torch_tpu::aten::note_fallback(full);
  }, "Counts one CPU-fallback run of op `full` (warns the first time; NotImplementedError when disabled).");
  m.def("without_cpp_warnings", [](const py::function& fn, const py::args& args) {
    // The caller's warning handler (the outer op's) would hold these until the outer call returns,
    // past any Python warnings filter the caller set around fn.
    struct Drop final : c10::WarningHandler {
      void process(const c10::Warning&) override {}
    } drop;
    c10::WarningUtils::WarningHandlerGuard guard(&drop);
    return fn(*args);
  }, "fn(*args) with the C++ warnings it raises (TORCH_WARN) dropped: for calls whose warnings are not "
     "the user's (the CPU dtype probe's one-element runs).");
  m.def("fallback_counts", &torch_tpu::aten::fallback_counts);
  m.def("reset_fallback_counts", &torch_tpu::aten::reset_fallback_counts);
}

}  // namespace torch_tpu::python
