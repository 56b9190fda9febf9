// torch_tpu._C.runtime bindings of compile-only targets (pjrt::Topology): a plugin's topology description
// and PJRT_Compile for it, with no client and no chip (torch_tpu/aot/ is their Python front), and
// the compile cache's store.
#include "python/bindings.h"

#include "pjrt/pjrt.h"
#include "runtime/compile_cache.h"

#include <torch/csrc/Exceptions.h>

namespace py = pybind11;
using torch_tpu::pjrt::CompiledProgram;
using torch_tpu::pjrt::DeviceDescription;
using torch_tpu::pjrt::Plugin;
using torch_tpu::pjrt::Topology;

namespace torch_tpu::python {
namespace {

py::dict named(const std::map<std::string, std::vector<int64_t>>& ints, const std::map<std::string, std::string>& strings) {
  py::dict attrs;
  for (auto& [k, v] : ints) attrs[py::str(k)] = v.size() == 1 ? py::cast(v[0]) : py::cast(v);
  for (auto& [k, v] : strings) attrs[py::str(k)] = v;
  return attrs;
}

py::dict description(const DeviceDescription& d) {
  py::dict out;
  out["kind"] = d.kind;
  out["id"] = d.id;
  out["process_index"] = d.process_index;
  out["attributes"] = named(d.ints, d.strings);
  return out;
}

}  // namespace

void bind_compile_targets(py::module_& m) {
  m.def("replica_compile_options", [](const std::vector<int64_t>& device_ids) {
    return py::bytes(torch_tpu::pjrt::replica_compile_options(device_ids));
  }, py::arg("device_ids"),
     "The serialized xla.CompileOptionsProto for one replica on each of device_ids (csrc/pjrt/pjrt.h).");
  m.def("compile_options_at_level", [](int level) {
    return py::bytes(torch_tpu::pjrt::compile_options_at_level(level));
  }, py::arg("level"),
     "The serialized xla.CompileOptionsProto of one replica with xla_backend_optimization_level = level "
     "for that program only (csrc/pjrt/pjrt.h).");
  m.def("cache_store", [](const std::string& key, const py::bytes& payload, double seconds,
                           const std::vector<std::string>& dirs) {
    torch::PyWarningHandler warnings;  // "cannot write executables into ...": a Python warning
    std::string bytes = payload;
    std::vector<std::string> written;
    {
      py::gil_scoped_release nogil;
      written = torch_tpu::runtime::compile_cache().store(key, bytes, seconds, dirs);
    }
    return written;
  }, py::arg("key"), py::arg("payload"), py::arg("seconds"), py::arg("dirs"),
     "Writes a serialized executable compiled elsewhere under `key` into every usable directory tier of the "
     "executable cache, or into `dirs` when not empty (csrc/runtime/compile_cache.h); returns the tiers or "
     "directories written.");

  py::class_<Topology, std::shared_ptr<Topology>>(m, "Topology",
      "A compile-only target: a PJRT plugin's topology description (libtpu's \"v5e:2x2\"). "
      "csrc/pjrt/pjrt.h, class Topology.")
      .def(py::init([](const std::string& path, const std::string& env_var, const std::string& name,
                       const std::vector<std::pair<std::string, int64_t>>& options) {
             return Topology::create(Plugin::load(path, env_var), name, options);
           }),
           py::arg("plugin_path"), py::arg("env_var"), py::arg("name"), py::arg("options"),
           "PJRT_TopologyDescription_Create(name, int64 options) with the plugin at plugin_path; raises "
           "torch_tpu._C.runtime.PjrtError with the plugin's message for an unknown name or option.")
      .def_property_readonly("name", &Topology::name)
      .def_property_readonly("platform_name", &Topology::platform_name)
      .def_property_readonly("platform_version", &Topology::platform_version)
      .def_property_readonly("api_version", [](const Topology& t) {
        return std::make_pair(t.plugin().api_major(), t.plugin().api_minor());
      })
      .def("devices", [](const Topology& t) {
        py::list out;
        for (const auto& d : t.devices()) out.append(description(d));
        return out;
      }, "Every device: {kind, id, process_index, attributes} (libtpu: coords, core_on_chip, num_cores, "
         "device_memory_bytes_limit, slice_index).")
      .def("compile", [](const Topology& t, const std::string& mlir, const py::bytes& options) {
        std::string opts = options;
        CompiledProgram c;
        {
          py::gil_scoped_release nogil;  // seconds of compiling: other threads (shadow mode) go on
          c = t.compile(mlir, opts);
        }
        py::dict out;
        out["serialized"] = py::bytes(c.serialized);
        out["num_outputs"] = c.num_outputs;
        py::dict cost;
        for (auto& [k, v] : c.cost) cost[py::str(k)] = v;
        out["cost"] = cost;
        out["code_bytes"] = c.code_bytes;
        out["argument_bytes"] = c.argument_bytes;
        out["output_bytes"] = c.output_bytes;
        out["alias_bytes"] = c.alias_bytes;
        out["temp_bytes"] = c.temp_bytes;
        out["peak_bytes"] = c.peak_bytes;
        return out;
      }, py::arg("mlir"), py::arg("options") = py::bytes(),
         "PJRT_Compile of StableHLO text for this topology (options: a serialized xla.CompileOptionsProto; "
         "empty: pjrt::default_compile_options(), 1 replica, 1 partition). Returns {serialized (bytes), num_outputs, cost {name: float}, "
         "code_bytes, argument_bytes, output_bytes, alias_bytes, temp_bytes, peak_bytes (-1: not reported)}; "
         "raises PjrtError with the compiler's message.");
}

}  // namespace torch_tpu::python
