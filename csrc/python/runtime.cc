// torch_tpu._C.runtime: the PJRT runtime (csrc/runtime, csrc/pjrt) as Python sees it: the client and
// its devices, the compilation cache, launches, synchronisation and counters.
#include "python/bindings.h"

#include <torch/csrc/Exceptions.h>
#include <torch/csrc/autograd/python_variable.h>

#include "aten/device.h"
#include "eager/index_errors.h"
#include "aten/launch_values.h"
#include "distributed/job_store.h"
#include "python/launch_args.h"
#include "runtime/compile_cache.h"
#include "runtime/compile_pool.h"
#include "runtime/runtime.h"
#include "runtime/settings.h"
#include "runtime/trace.h"
#include "runtime/warm_start.h"

namespace torch_tpu::python {
namespace {

using runtime::Runtime;

// One device's part of a launch, from launch's arguments (see its docstring): fills part.args and
// part.sinks, and returns the new tensors that receive the outputs given no sink.
std::vector<at::Tensor> launch_part(py::handle inputs, py::handle sinks, py::handle new_specs, int device,
                                    Runtime::ReplicaPart& part) {
  part.device = device;
  for (py::handle h : inputs) part.args.push_back(launch_arg(h, device));
  std::vector<at::Tensor> fresh;
  for (py::handle h : new_specs)
    fresh.push_back(aten::new_tensor_of(h.cast<aten::FreshSpec>(), device));
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

// The client, started here if it was not: the start's one-time "No TPU here" warning then reaches
// Python's warning machinery (its filters, -W ignore) instead of c10's own stderr line.
torch_tpu::pjrt::Client& started_client() {
  torch::PyWarningHandler warnings;
  return Runtime::get().client();
}

}  // namespace

// Every counter and cache statistic is read after it: an op's programs are counted once the op has
// been called, as with synchronous compiles.
void settle_compiles() {
  {
    py::gil_scoped_release nogil;
    runtime::wait_compiles();
  }
  torch::PyWarningHandler warnings;
  for (const auto& w : runtime::take_compile_warnings()) TORCH_WARN(w);
}

void bind_runtime(py::module_& m) {
  py::register_exception<pjrt::PjrtError>(m, "PjrtError", PyExc_RuntimeError);
  py::class_<pjrt::Executable, std::shared_ptr<pjrt::Executable>>(m, "Executable")
      .def_property_readonly("num_outputs", &pjrt::Executable::num_outputs)
      .def_property_readonly(
          "held_bytes", [](const pjrt::Executable& e) { return runtime::program_bytes(e); },
          "What the in-memory caches count this program as, in bytes: its generated code where the plugin "
          "reports it, else a fixed estimate (runtime/compile_cache.h program_bytes).");
  m.def("configure", [](const std::string& path, const std::string& error,
                         const std::vector<std::pair<std::string, int64_t>>& options, bool job_store) {
    Runtime::get().configure(path, error, options,
                             job_store ? torch_tpu::distributed::torchrun_key_value_store : nullptr);
  }, py::arg("path"), py::arg("error"), py::arg("options"), py::arg("job_store") = false,
     "Chooses the plugin, its int64 create options and, with job_store, torchrun's store as the client's "
     "key-value store (csrc/distributed/job_store.h); starts nothing.");
  m.def("configured_plugin", [] { return Runtime::get().configured_plugin(); },
        "The plugin file configure() chose (\"\": none); starts nothing.");
  m.def("started", [] { return Runtime::get().started(); });
  m.def("start", [] { started_client(); });
  m.def("platform_name", [] { return started_client().platform_name(); });
  m.def("platform_version", [] { return started_client().platform_version(); });
  m.def("plugin_path", [] { return started_client().plugin().path(); });
  m.def("api_version", [] {
    auto& p = started_client().plugin();
    return std::make_pair(p.api_major(), p.api_minor());
  });
  m.def("in_bad_fork", [] { return Runtime::in_bad_fork(); });
  m.def("end_child_without_exit_handlers", &torch_tpu::pjrt::end_child_without_exit_handlers,
        "After fork, in the child (os.register_at_fork): end at exit() without the exit handlers that "
        "loaded plugins registered before the fork (csrc/pjrt/pjrt.h).");
  m.def("device_count", [] {
    torch::PyWarningHandler warnings;  // the first start's "runs on the CPU plugin" warning
    return Runtime::get().device_count_noexcept();
  });
  m.def("memory_stats", [](int64_t index) {
    auto s = started_client().memory_stats(index);
    py::dict d;
    d["bytes_in_use"] = s.bytes_in_use;
    d["peak_bytes_in_use"] = s.peak_bytes_in_use;
    d["num_allocs"] = s.num_allocs;
    d["bytes_limit"] = s.bytes_limit;
    return d;
  });
  m.def("describe_device", [](int index) {
    torch_tpu::aten::check_device_index(index);
    auto d = started_client().describe(index);
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
  // Programs.
  m.def("compile_cached", [](const std::string& key, const std::string& mlir, const std::string& name,
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
  m.def("compile_async", [](const std::string& key, const std::string& mlir, const std::string& name,
                             const py::bytes& options, const std::vector<std::pair<py::object, std::vector<int64_t>>>& outputs) {
    std::vector<PJRT_Buffer_Type> types;
    std::vector<std::vector<int64_t>> dims;
    for (const auto& [dtype, shape] : outputs) {
      types.push_back(runtime::to_pjrt_type(dtype_of(dtype)));
      dims.push_back(shape);
    }
    auto& client = started_client();
    auto exe = runtime::compile_async(client, key, mlir, name, std::string(options), std::move(types), std::move(dims));
    torch::PyWarningHandler warnings;
    for (const auto& w : runtime::take_compile_warnings()) TORCH_WARN(w);
    return exe;
  }, py::arg("key"), py::arg("mlir"), py::arg("name"), py::arg("options"), py::arg("outputs"),
     "compile_cached's executable without waiting for a compile: on a miss, a pending executable whose "
     "outputs are `outputs` ((torch dtype, dims) per @main result), compiled by the compile pool; its "
     "launches wait for it on the launcher thread, and a compile error fails them (runtime/compile_pool.h).");
  m.def("set_compile_threads", &runtime::set_compile_threads,
        "The compile pool's thread count (TORCH_TPU_COMPILE_THREADS); 0: compile_async compiles synchronously.");
  m.def("wait_compiles", &settle_compiles,
        "Waits until the compile pool has nothing in flight; raises the warnings its compiles gave.");
  m.def("cpp_settings", [] {
    std::vector<std::pair<std::string, std::optional<std::string>>> out;
    for (const auto& s : settings::kCppSettings)
      out.emplace_back(s.name, s.default_value ? std::optional<std::string>(s.default_value) : std::nullopt);
    return out;
  }, "The variables the C++ core reads and their defaults (csrc/runtime/settings.h): (name, default or None).");
  m.def("set_warm_manifest", &runtime::warm_start::set_manifest,
        "The warm-start manifest's path (csrc/runtime/warm_start.h; \"\": off): read when the client starts.");
  m.def("finish_warm_start", [] {
    py::gil_scoped_release nogil;
    runtime::warm_start::finish();
  }, "At exit: drops the prefetches not started and writes this process's warm-start manifest.");
  m.def("used_program_keys", [] { return runtime::compile_cache().used_keys(); },
        "The cache keys of the programs this process used, in first-use order (at most 1024).");
  m.def("trace_recording", &torch_tpu::runtime::trace::recording,
        "True while a profiler session records tpu executions (csrc/runtime/trace.h); launches check it.");
  m.def("cache_configure", [](const std::vector<std::tuple<std::string, std::string, int64_t, bool, bool>>& tiers) {
    std::vector<torch_tpu::runtime::CacheTierConfig> configs;
    for (const auto& [name, dir, max_bytes, private_dir, owner_writes_only] : tiers)
      configs.push_back({name, dir, max_bytes, private_dir, owner_writes_only});
    torch_tpu::runtime::compile_cache().configure(configs);
  }, "Sets the compilation cache's directory tiers, in search order: (name, dir, max_bytes, private, "
     "owner_writes_only) each; "
     "an empty dir is a tier that is off, max_bytes <= 0 one that is never evicted "
     "(csrc/runtime/compile_cache.h).");
  m.def("cache_stats", [] {
    settle_compiles();
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
  m.def("cache_reset_stats", [] {
    settle_compiles();
    torch_tpu::runtime::compile_cache().reset_stats();
  });
  m.def("launch_replicas", [](std::shared_ptr<torch_tpu::pjrt::Executable> exe, py::list parts, std::string producer) {
    std::vector<torch_tpu::runtime::Runtime::ReplicaPart> rparts(parts.size());
    py::list fresh;
    for (size_t k = 0; k < parts.size(); ++k) {
      auto p = parts[k].cast<py::tuple>();
      fresh.append(py::cast(launch_part(p[0], p[1], p[2], p[3].cast<int>(), rparts[k])));
    }
    Runtime::get().execute_replicas(std::move(exe), std::move(rparts), std::move(producer));
    return fresh;
  }, "Runs exe, compiled for one replica on each of several local devices (replica_compile_options of "
     "their ids), once on each. parts: per device in the executable's device order, (inputs, sinks, "
     "new_specs, device) as launch takes them. Returns each part's new tensors.");
  m.def("synchronize", [](int device, bool index_errors) {
    py::gil_scoped_release nogil;
    Runtime::get().synchronize(device);
    if (index_errors) torch_tpu::eager::raise_index_errors(device);
  }, py::arg("device"), py::arg("index_errors") = true,
     "Waits for every execution on `device` (-1: all); raises their errors, then (index_errors) an "
     "index error found on the device since the last synchronisation.");

  // Metrics.
  m.def("counters", [] {
    settle_compiles();
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
  m.def("reset_counters", [] {
    settle_compiles();
    auto& c = torch_tpu::runtime::counters();
    for (auto* a : {&c.compiles, &c.executions, &c.h2d_transfers, &c.d2h_transfers, &c.h2d_bytes,
                    &c.d2h_bytes, &c.host_syncs, &c.busy_inputs_kept, &c.graph_input_copies})
      a->store(0);
  });
  bind_host_caches(m);
  bind_compile_targets(m);
}

void bind_testing(py::module_& m) {
  m.def("launch", [](std::shared_ptr<torch_tpu::pjrt::Executable> exe, py::list inputs, py::list sinks,
                      py::list new_specs, int device, std::string producer) {
    torch_tpu::runtime::Runtime::ReplicaPart part;
    auto fresh = launch_part(inputs, sinks, new_specs, device, part);
    Runtime::get().execute(std::move(exe), std::move(part.args), std::move(part.sinks), device, std::move(producer));
    return fresh;
  }, "Runs exe on tpu:device (tests launch hand-written programs with it; torch_tpu's own launches go "
     "through the eager plans, compiled graphs' runner and launch_replicas). inputs: tpu tensors (their storages' buffers), CPU tensors (uploaded) or "
     "(number, dtype) scalar operands. sinks: per output, the tensor whose storage receives it, or None "
     "for a new tensor of the next _C.eager.FreshSpec in new_specs. Returns the new tensors.");
}

}  // namespace torch_tpu::python
