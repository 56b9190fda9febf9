// The tpu_dist backend's Python type and job-store callbacks: torch_tpu._C.distributed.
// Python binding of the tpu_dist backend: torch_tpu._C.distributed.TpuBackend, a subclass of c10d's Backend
// type (so torch.distributed accepts it from the creator that torch_tpu.distributed registers).
#include <pybind11/chrono.h>
#include <torch/csrc/distributed/c10d/Backend.hpp>
#include <torch/csrc/utils/pybind.h>

#include "distributed/backend.h"
#include "distributed/job_store.h"
#include "python/bindings.h"
#include "runtime/runtime.h"

namespace py = pybind11;

namespace torch_tpu::python {
namespace {

// What the key-value callbacks hand back as errors here: the plugin's callback_error makes a
// PJRT_Error; this one carries the message, to be raised.
PJRT_Error* message_error(PJRT_Error_Code, const char* message, size_t size) {
  return reinterpret_cast<PJRT_Error*>(new std::string(message, size));
}
PJRT_CallbackError kMessageError = message_error;

void raise_if(PJRT_Error* err) {
  if (!err) return;
  std::unique_ptr<std::string> message(reinterpret_cast<std::string*>(err));
  throw std::runtime_error(*message);
}

// The C callbacks a plugin calls for `store`, called as a plugin calls them.
struct KeyValueCallbacksHandle {
  std::shared_ptr<pjrt::KeyValueStore> store;

  void put(const std::string& key, const std::string& value) const {
    auto a = PJRT_KeyValuePutCallback_Args{PJRT_KeyValuePutCallback_Args_STRUCT_SIZE};
    a.key = key.data(), a.key_size = key.size(), a.value = value.data(), a.value_size = value.size();
    a.callback_error = &kMessageError;
    a.user_arg = store.get();
    raise_if(pjrt::key_value_callbacks().put(&a));
  }
  py::bytes get(const std::string& key, int timeout_ms) const {
    auto a = PJRT_KeyValueGetCallback_Args{PJRT_KeyValueGetCallback_Args_STRUCT_SIZE};
    a.key = key.data(), a.key_size = key.size(), a.timeout_in_ms = timeout_ms;
    a.callback_error = &kMessageError;
    a.user_arg = store.get();
    PJRT_Error* err;
    {
      py::gil_scoped_release nogil;
      err = pjrt::key_value_callbacks().get(&a);
    }
    raise_if(err);
    py::bytes out(a.value, a.value_size);
    a.value_deleter_callback(a.value);
    return out;
  }
  py::object try_get(const std::string& key) const {
    auto a = PJRT_KeyValueTryGetCallback_Args{PJRT_KeyValueTryGetCallback_Args_STRUCT_SIZE};
    a.key = key.data(), a.key_size = key.size();
    a.callback_error = &kMessageError;
    a.user_arg = store.get();
    PJRT_Error* err = pjrt::key_value_callbacks().try_get(&a);
    if (err) {
      delete reinterpret_cast<std::string*>(err);
      return py::none();
    }
    py::bytes out(a.value, a.value_size);
    a.value_deleter_callback(a.value);
    return out;
  }
};

// A ProgramBuilder calling the Python function `fn` (with the GIL). The function object is released
// with the GIL too, whichever thread drops the last backend holding it.
distributed::ProgramBuilder program_builder(py::object fn) {
  std::shared_ptr<py::object> held(new py::object(std::move(fn)), [](py::object* p) {
    if (!Py_IsInitialized()) return;  // interpreter gone: leaked, not touched
    py::gil_scoped_acquire gil;
    delete p;
  });
  return [held](const distributed::CollectiveSignature& s) {
    py::gil_scoped_acquire gil;
    py::object exe = (*held)(s.kind, py::tuple(py::cast(s.shape)), s.dtype, py::tuple(py::cast(s.dims)), s.op, s.root,
                             py::tuple(py::cast(s.ranks)));
    return exe.cast<std::shared_ptr<pjrt::Executable>>();
  };
}

}  // namespace

void bind_distributed(py::module_& m) {
  // torch registers c10d::Backend's Python type when torch.distributed's C module loads.
  py::module::import("torch._C._distributed_c10d");
  m.def("drain_collectives", [] {
    py::gil_scoped_release nogil;  // the completion threads may need the GIL to finish
    distributed::TpuBackend::drain_all();
  }, "At exit: waits for every tpu_dist backend's queued collectives (each within its group's timeout) "
     "and releases the tensors they held (TpuBackend::drain_all).");
  py::class_<distributed::TpuBackend, c10d::Backend, c10::intrusive_ptr<distributed::TpuBackend>>(
      m, "TpuBackend",
      "tpu_dist's c10d Backend; built by torch_tpu.distributed's backend creator, not by hand.")
      .def(py::init([](const c10::intrusive_ptr<c10d::Backend>& host, int rank, int size,
                       std::chrono::milliseconds timeout, py::object device) {
             std::shared_ptr<distributed::DeviceCollectives> path;
             if (!device.is_none()) {
               auto d = device.cast<py::tuple>();
               path = std::make_shared<distributed::DeviceCollectives>(
                   d[0].cast<std::string>(), d[1].cast<std::vector<int>>(), rank, program_builder(d[2]));
             }
             return c10::make_intrusive<distributed::TpuBackend>(host, rank, size, timeout, std::move(path));
           }),
           py::arg("host"), py::arg("rank"), py::arg("size"), py::arg("timeout"), py::arg("device") = py::none(),
           "device: None (every collective through `host`), or (group_key, local_devices, build) for the device "
           "path (csrc/distributed/device_collectives.h): build(kind, shape, dtype, dims, op, root, ranks) returns the "
           "executable of one collective over the devices of the group's `ranks` (empty: all).")
      // new_group() calls this on the ranks left out of a group split from a device-bound default
      // group (NCCL needs every rank in ncclCommSplit). A split host group is made by its members
      // alone, so the others have nothing to do.
      // split_group() copies the parent's options into the split: the host backend's.
      .def_property_readonly("options", &distributed::TpuBackend::getBackendOptions)
      .def("perform_nocolor_split", [](distributed::TpuBackend&, const at::Device&) {});

  py::class_<KeyValueCallbacksHandle>(
      m, "KeyValueCallbacks",
      "The PJRT key-value callbacks (kv_put / kv_get / kv_try_get) a plugin's client is given, called as the "
      "plugin calls them: over a c10d Store, or (of_runtime) over the running client's own store.")
      .def(py::init([](const c10::intrusive_ptr<c10d::Store>& store) {
             return KeyValueCallbacksHandle{distributed::key_value_store(store)};
           }),
           py::arg("store"))
      .def_static("of_runtime", []() -> py::object {
        auto& kv = runtime::Runtime::get().client().key_value_store();
        if (!kv) return py::none();
        return py::cast(KeyValueCallbacksHandle{kv});
      }, "The running client's key-value callbacks; None when it was created without a store.")
      .def("put", &KeyValueCallbacksHandle::put, py::arg("key"), py::arg("value"))
      .def("get", &KeyValueCallbacksHandle::get, py::arg("key"), py::arg("timeout_ms"),
           "Waits up to timeout_ms for `key`; raises RuntimeError (DEADLINE_EXCEEDED's message) after it.")
      .def("try_get", &KeyValueCallbacksHandle::try_get, py::arg("key"), "The value, or None (NOT_FOUND).");
}

}  // namespace torch_tpu::python
