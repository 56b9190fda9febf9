// torch_tpu._C: the Python binding of the runtime (PJRT client, cells, compile/execute) and of
// the device integration (current device, generators, fallback counters).
#include <torch/csrc/utils/pybind.h>
#include <ATen/Tensor.h>
#include <ATen/ops/empty.h>
#include <torch/csrc/DynamicTypes.h>
#include <torch/csrc/Exceptions.h>
#include <torch/csrc/Generator.h>
#include <torch/csrc/autograd/engine.h>
#include <torch/csrc/autograd/function.h>
#include <torch/csrc/autograd/python_variable.h>

#include <cstring>
#include <optional>

#include "aten/device.h"
#include "python/distributed.h"
#include "aten/fallback.h"
#include "eager/index_errors.h"
#include "python/graph_runner.h"
#include "python/host_caches.h"
#include "python/custom_autograd.h"
#include "python/op_kernel.h"
#include "python/launch_args.h"
#include "python/targets.h"
#include "runtime/compile_cache.h"
#include "distributed/job_store.h"
#include "runtime/runtime.h"

namespace py = pybind11;
using torch_tpu::runtime::Cell;
using torch_tpu::runtime::Runtime;

using torch_tpu::python::cell_by_key;
using torch_tpu::python::cell_of;

namespace {

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

// One device's part of a launch, from _launch's arguments (see its docstring): fills part.args and
// part.sinks, and returns the new tensors that receive the outputs given no sink.
std::vector<at::Tensor> launch_part(py::handle inputs, py::handle sinks, py::handle new_specs, int device,
                                    Runtime::ReplicaPart& part) {
  part.device = device;
  for (py::handle h : inputs) part.args.push_back(torch_tpu::python::launch_arg(h, device));
  std::vector<at::Tensor> fresh;
  for (py::handle h : new_specs)
    fresh.push_back(torch_tpu::python::new_tpu_tensor_of_spec(h.cast<torch_tpu::eager::FreshSpec>(), device));
  size_t next_new = 0;
  for (py::handle h : sinks) {
    if (h.is_none()) {
      part.sinks.push_back(cell_of(fresh.at(next_new++)));
    } else if (PyLong_Check(h.ptr())) {
      part.sinks.push_back(cell_by_key(h.cast<uintptr_t>()));
    } else {
      part.sinks.push_back(cell_of(THPVariable_Unpack(h.ptr())));
    }
  }
  return fresh;
}

}  // namespace

PYBIND11_MODULE(_C, m) {
  m.doc() = "TorchTPU core: PJRT runtime and PrivateUse1 device integration";
  py::register_exception<torch_tpu::pjrt::PjrtError>(m, "PjrtError", PyExc_RuntimeError);
  // A launch that could not allocate raises c10::OutOfMemoryError (runtime.cc): torch.OutOfMemoryError
  // from our own bindings (torch.tpu.synchronize) too, as from ATen's, which torch translates itself.
  py::register_exception_translator([](std::exception_ptr p) {
    try {
      if (p) std::rethrow_exception(p);
    } catch (const c10::OutOfMemoryError& e) {
      // torch.OutOfMemoryError, looked up once (libtorch_python does not export its handle).
      static PyObject* oom = py::object(py::module_::import("torch").attr("OutOfMemoryError")).release().ptr();
      PyErr_SetString(oom, e.what_without_backtrace());
    }
  });
  torch_tpu::python::init_distributed(m);
  torch_tpu::python::bind_op_kernels(m);
  torch_tpu::python::bind_custom_autograd(m);
  torch_tpu::python::bind_compile_targets(m);
  torch_tpu::python::bind_host_caches(m);

  py::class_<torch_tpu::pjrt::Executable, std::shared_ptr<torch_tpu::pjrt::Executable>>(m, "Executable")
      .def_property_readonly("num_outputs", &torch_tpu::pjrt::Executable::num_outputs)
      .def_property_readonly(
          "held_bytes", [](const torch_tpu::pjrt::Executable& e) { return torch_tpu::runtime::program_bytes(e); },
          "What the in-memory caches count this program as, in bytes: its generated code where the plugin "
          "reports it, else a fixed estimate (runtime/compile_cache.h program_bytes).");

  m.def("_configure", [](const std::string& path, const std::string& error,
                         const std::vector<std::pair<std::string, int64_t>>& options, bool job_store) {
    Runtime::get().configure(path, error, options,
                             job_store ? torch_tpu::distributed::torchrun_key_value_store : nullptr);
  }, py::arg("path"), py::arg("error"), py::arg("options"), py::arg("job_store") = false,
     "Chooses the plugin, its int64 create options and, with job_store, torchrun's store as the client's "
     "key-value store (csrc/distributed/job_store.h); starts nothing.");
  m.def("_runtime_started", [] { return Runtime::get().started(); });
  m.def("_start", [] {
    torch::PyWarningHandler warnings;  // the one-time "runs on the CPU plugin" warning
    Runtime::get().client();
  });
  m.def("_platform_name", [] { return Runtime::get().client().platform_name(); });
  m.def("_platform_version", [] { return Runtime::get().client().platform_version(); });
  m.def("_plugin_path", [] { return Runtime::get().client().plugin().path(); });
  m.def("_api_version", [] {
    auto& p = Runtime::get().client().plugin();
    return std::make_pair(p.api_major(), p.api_minor());
  });
  m.def("_is_in_bad_fork", [] { return Runtime::in_bad_fork(); });
  m.def("_end_child_without_exit_handlers", &torch_tpu::pjrt::end_child_without_exit_handlers,
        "After fork, in the child (os.register_at_fork): end at exit() without the exit handlers that "
        "loaded plugins registered before the fork (csrc/pjrt/pjrt.h).");
  m.def("_device_count", [] {
    torch::PyWarningHandler warnings;  // the first start's "runs on the CPU plugin" warning
    return Runtime::get().device_count_noexcept();
  });
  m.def("_memory_stats", [](int64_t index) {
    auto s = Runtime::get().client().memory_stats(index);
    py::dict d;
    d["bytes_in_use"] = s.bytes_in_use;
    d["peak_bytes_in_use"] = s.peak_bytes_in_use;
    d["num_allocs"] = s.num_allocs;
    d["bytes_limit"] = s.bytes_limit;
    return d;
  });
  m.def("_describe_device", [](int index) {
    torch_tpu::aten::check_device_index(index);
    auto d = Runtime::get().client().describe(index);
    py::dict attrs;
    for (auto& [k, v] : d.ints) attrs[py::str(k)] = v.size() == 1 ? py::cast(v[0]) : py::cast(v);
    for (auto& [k, v] : d.strings) attrs[py::str(k)] = v;
    py::dict out;
    out["kind"] = d.kind;
    out["id"] = d.id;
    out["process_index"] = d.process_index;
    out["attributes"] = attrs;
    return out;
  });
  m.def("_current_device", [] { return static_cast<int>(torch_tpu::aten::current_device()); });
  m.def("_set_device", [](int index) { torch_tpu::aten::set_device(index); });
  m.def("_check_device_index", [](int index) { torch_tpu::aten::check_device_index(index); });
  m.def("_own_device", [](int index) { return static_cast<int>(torch_tpu::aten::own_device(index)); });
  m.def("_default_generator", [](int index) {
    return py::reinterpret_steal<py::object>(
        THPGenerator_initDefaultGenerator(torch_tpu::aten::default_generator(index)));
  });

  // Storage cells.
  m.def("_storage_key", [](const at::Tensor& t) { return cell_of(t)->addr; },
        "Identity of the tensor's storage (its fake device address).");
  m.def("_storage_spec", [](const at::Tensor& t) {
    Cell* c = cell_of(t);
    Runtime::get().ensure_typed(*c, t.scalar_type());
    return std::make_tuple(*c->dtype, py::tuple(py::cast(c->dims)));
  }, "(dtype, dims) of the storage's PJRT buffer, fixing them from t on first use.");

  // Programs.
  m.def("_compile_cached", [](const std::string& key, const std::string& mlir, const std::string& name,
                              const py::bytes& options) {
    torch::PyWarningHandler warnings;  // e.g. "ignoring compilation cache entry": a Python warning
    std::shared_ptr<torch_tpu::pjrt::Executable> exe;
    std::string opts = options;
    {
      py::gil_scoped_release nogil;
      exe = torch_tpu::runtime::compile_cache().get_or_compile(Runtime::get().client(), key, mlir, name, opts);
    }
    return exe;
  }, py::arg("key"), py::arg("mlir"), py::arg("name"), py::arg("options") = py::bytes(),
     "The executable of `mlir` from the compilation cache (memory, then its directory tiers), compiling "
     "on a miss, with `options` (a serialized xla.CompileOptionsProto; empty: one replica, one partition). "
     "`key` must be a hex digest covering everything the executable depends on, options included; `name` names "
     "the program in profiler traces (\"compile <name>\", \"load <name> from the <tier> cache\").");
  m.def("_trace_recording", &torch_tpu::runtime::trace::recording,
        "True while a profiler session records tpu executions (csrc/runtime/trace.h); launches check it.");
  m.def("_cache_configure", [](const std::vector<std::tuple<std::string, std::string, int64_t, bool, bool>>& tiers) {
    std::vector<torch_tpu::runtime::CacheTierConfig> configs;
    for (const auto& [name, dir, max_bytes, private_dir, owner_writes_only] : tiers)
      configs.push_back({name, dir, max_bytes, private_dir, owner_writes_only});
    torch_tpu::runtime::compile_cache().configure(configs);
  }, "Sets the compilation cache's directory tiers, in search order: (name, dir, max_bytes, private, "
     "owner_writes_only) each; "
     "an empty dir is a tier that is off, max_bytes <= 0 one that is never evicted "
     "(csrc/runtime/compile_cache.h).");
  m.def("_cache_stats", [] {
    auto s = torch_tpu::runtime::compile_cache().stats();
    py::dict d;
    d["memory_hits"] = s.memory_hits;
    int64_t evictions = 0;
    for (const auto& t : s.tiers) {
      d[py::str(t.name + "_hits")] = t.hits;
      d[py::str(t.name + "_writes")] = t.writes;
      d[py::str(t.name + "_rejected")] = t.rejected;
      d[py::str(t.name + "_evictions")] = t.evictions;
      evictions += t.evictions;
    }
    d["misses"] = s.misses;
    d["evictions"] = evictions;
    d["compile_seconds"] = s.compile_seconds;
    d["compile_seconds_saved"] = s.saved_seconds;
    return d;
  });
  m.def("_cache_reset_stats", [] { torch_tpu::runtime::compile_cache().reset_stats(); });
  m.def("_launch", [](std::shared_ptr<torch_tpu::pjrt::Executable> exe, py::list inputs, py::list sinks,
                      py::list new_specs, int device, std::string producer) {
    torch_tpu::runtime::Runtime::ReplicaPart part;
    auto fresh = launch_part(inputs, sinks, new_specs, device, part);
    Runtime::get().execute(std::move(exe), std::move(part.args), std::move(part.sinks), device, std::move(producer));
    return fresh;
  }, "Runs exe on tpu:device. inputs: tpu tensors (their storages' buffers), CPU tensors (uploaded) or "
     "(number, dtype) scalar operands. sinks: per output, the tensor whose storage receives it, or None "
     "for a new tensor of the next _C.FreshSpec in new_specs. Returns the new tensors.");
  m.def("_launch_replicas", [](std::shared_ptr<torch_tpu::pjrt::Executable> exe, py::list parts, std::string producer) {
    std::vector<torch_tpu::runtime::Runtime::ReplicaPart> rparts(parts.size());
    py::list fresh;
    for (size_t k = 0; k < parts.size(); ++k) {
      auto p = parts[k].cast<py::tuple>();
      fresh.append(py::cast(launch_part(p[0], p[1], p[2], p[3].cast<int>(), rparts[k])));
    }
    Runtime::get().execute_replicas(std::move(exe), std::move(rparts), std::move(producer));
    return fresh;
  }, "Runs exe, compiled for one replica on each of several local devices (_replica_compile_options of "
     "their ids), once on each. parts: per device in the executable's device order, (inputs, sinks, "
     "new_specs, device) as _launch takes them. Returns each part's new tensors.");
  torch_tpu::python::bind_graph_runner(m);
  m.def("_content_key", [](const std::vector<at::Tensor>& ts) -> py::object {
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
  m.def("_gather_scalars", [](const std::vector<at::Tensor>& ts) {
    TORCH_CHECK(!ts.empty(), "_gather_scalars: no tensors");
    auto dtype = ts[0].scalar_type();
    for (const auto& t : ts)
      TORCH_CHECK(t.is_cpu() && t.dim() == 0 && t.scalar_type() == dtype,
                  "_gather_scalars: expected 0-dim CPU tensors of one dtype (", dtype, "), got one of ",
                  t.scalar_type(), " with ", t.dim(), " dims on ", t.device());
    at::Tensor out = at::empty({static_cast<int64_t>(ts.size())}, ts[0].options());
    size_t size = c10::elementSize(dtype);
    auto* dst = static_cast<char*>(out.data_ptr());
    for (size_t i = 0; i < ts.size(); ++i) std::memcpy(dst + i * size, ts[i].const_data_ptr(), size);
    return out;
  }, "torch.stack of 0-dim CPU tensors of one dtype (a 1-D tensor); raises for any other tensor.");
  m.def("_scatter_scalars", [](const at::Tensor& src, const std::vector<std::optional<at::Tensor>>& dsts) {
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
  m.def("_drain_autograd_threads", [] {
    py::gil_scoped_release nogil;  // the threads may need the GIL to finish
    drain_autograd_threads();
  }, "At exit: waits for the tpu autograd device threads to finish their last backward (see "
     "drain_autograd_threads).");
  m.def("_synchronize", [](int device, bool index_errors) {
    py::gil_scoped_release nogil;
    Runtime::get().synchronize(device);
    if (index_errors) torch_tpu::eager::raise_index_errors(device);
  }, py::arg("device"), py::arg("index_errors") = true,
     "Waits for every execution on `device` (-1: all); raises their errors, then (index_errors) an "
     "index error found on the device since the last synchronisation.");

  // Metrics.
  m.def("_counters", [] {
    auto& c = torch_tpu::runtime::counters();
    py::dict d;
    d["compiles"] = c.compiles.load();
    d["executions"] = c.executions.load();
    d["h2d_transfers"] = c.h2d_transfers.load();
    d["d2h_transfers"] = c.d2h_transfers.load();
    d["h2d_bytes"] = c.h2d_bytes.load();
    d["d2h_bytes"] = c.d2h_bytes.load();
    d["host_syncs"] = c.host_syncs.load();
    d["busy_inputs_kept"] = c.busy_inputs_kept.load();
    d["graph_input_copies"] = c.graph_input_copies.load();
    return d;
  });
  m.def("_reset_counters", [] {
    auto& c = torch_tpu::runtime::counters();
    for (auto* a : {&c.compiles, &c.executions, &c.h2d_transfers, &c.d2h_transfers, &c.h2d_bytes,
                    &c.d2h_bytes, &c.host_syncs, &c.busy_inputs_kept, &c.graph_input_copies})
      a->store(0);
  });
  m.def("_note_fallback", [](const std::string& full) {
    torch::PyWarningHandler warnings;  // the first use's warning, as a Python warning
    torch_tpu::aten::note_fallback(full);
  }, "Counts one CPU-fallback run of op `full` (warns the first time; NotImplementedError when disabled).");
  m.def("_without_cpp_warnings", [](const py::function& fn, const py::args& args) {
    // The caller's warning handler (the outer op's) would hold these until the outer call returns,
    // past any Python warnings filter the caller set around fn.
    struct Drop final : c10::WarningHandler {
      void process(const c10::Warning&) override {}
    } drop;
    c10::WarningUtils::WarningHandlerGuard guard(&drop);
    return fn(*args);
  }, "fn(*args) with the C++ warnings it raises (TORCH_WARN) dropped: for calls whose warnings are not "
     "the user's (the CPU dtype probe's one-element runs).");
  m.def("_fallback_counts", &torch_tpu::aten::fallback_counts);
  m.def("_reset_fallback_counts", &torch_tpu::aten::reset_fallback_counts);
}
