// torch_tpu._C: the Python binding of the runtime (PJRT client, cells, compile/execute) and of
// the device integration (current device, generators, fallback counters).
#include <torch/csrc/utils/pybind.h>
#include <pybind11/complex.h>
#include <torch/csrc/Generator.h>
#include <torch/csrc/Exceptions.h>
#include <ATen/Tensor.h>
#include <c10/core/DeviceGuard.h>
#include <ATen/EmptyTensor.h>
#include <torch/csrc/autograd/python_variable.h>
#include <torch/csrc/Dtype.h>
#include <torch/csrc/DynamicTypes.h>
#include <complex>

#include "aten/device.h"
#include "aten/fallback.h"
#include "runtime/compile_cache.h"
#include "runtime/runtime.h"

namespace py = pybind11;
using torch_tpu::runtime::Cell;
using torch_tpu::runtime::Runtime;

namespace {

Cell* cell_of(const at::Tensor& t) {
  TORCH_CHECK(t.device().type() == c10::DeviceType::PrivateUse1, "expected a tpu tensor, got one on ",
              t.device());
  auto* c = static_cast<Cell*>(t.storage().data_ptr().get_context());
  TORCH_CHECK(c, "tpu tensor has no storage cell");
  return c;
}

Cell* cell_by_key(uintptr_t key) {
  Cell* c = Runtime::get().cell_at(reinterpret_cast<void*>(key));
  TORCH_CHECK(c && c->addr == key, "no live tpu storage has key ", key);
  return c;
}

}  // namespace

PYBIND11_MODULE(_C, m) {
  m.doc() = "TorchTPU core: PJRT runtime and PrivateUse1 device integration";
  py::register_exception<torch_tpu::pjrt::PjrtError>(m, "PjrtError", PyExc_RuntimeError);

  py::class_<torch_tpu::pjrt::Executable, std::shared_ptr<torch_tpu::pjrt::Executable>>(m, "Executable")
      .def_property_readonly("num_outputs", &torch_tpu::pjrt::Executable::num_outputs);

  m.def("_configure", [](const std::string& path, const std::string& error,
                         const std::vector<std::pair<std::string, int64_t>>& options) {
    Runtime::get().configure(path, error, options);
  });
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
  m.def("_current_device", [] { return static_cast<int>(torch_tpu::aten::current_device()); });
  m.def("_set_device", [](int index) { torch_tpu::aten::set_device(index); });
  m.def("_check_device_index", [](int index) { torch_tpu::aten::check_device_index(index); });
  m.def("_default_generator", [](int index) {
    return py::reinterpret_steal<py::object>(
        THPGenerator_initDefaultGenerator(torch_tpu::aten::default_generator(index)));
  });
  m.def("_generator_next", [](std::optional<at::Generator> gen, uint64_t increment) {
    return torch_tpu::aten::generator_next(gen, increment);
  });

  // Storage cells.
  m.def("_storage_key", [](const at::Tensor& t) { return cell_of(t)->addr; },
        "Identity of the tensor's storage (its fake device address).");
  m.def("_storage_spec", [](const at::Tensor& t) {
    Cell* c = cell_of(t);
    Runtime::get().ensure_typed(*c, t.scalar_type());
    return std::make_tuple(*c->dtype, c->numel);
  }, "(dtype, numel) of the storage's 1-D PJRT buffer, fixing it from t on first use.");
  m.def("_upload", [](const at::Tensor& dst, const at::Tensor& src) {
    TORCH_CHECK(src.is_cpu() && src.is_contiguous(), "_upload: source must be a contiguous CPU tensor");
    Cell* c = cell_of(dst);
    TORCH_CHECK(static_cast<size_t>(src.nbytes()) == c->nbytes,
                "_upload: source has ", src.nbytes(), " bytes, storage has ", c->nbytes);
    py::gil_scoped_release nogil;
    Runtime::get().upload(*c, src.data_ptr(), src.scalar_type(), src.numel());
  }, "Replaces the whole storage of dst with the bytes of the contiguous CPU tensor src.");
  m.def("_download", [](const at::Tensor& src, const at::Tensor& dst) {
    TORCH_CHECK(dst.is_cpu() && dst.is_contiguous(), "_download: destination must be a contiguous CPU tensor");
    Cell* c = cell_of(src);
    Runtime::get().ensure_typed(*c, dst.scalar_type());
    TORCH_CHECK(c->numel * static_cast<int64_t>(c10::elementSize(*c->dtype)) == dst.nbytes(),
                "_download: storage holds ", c->numel, " elements of ", *c->dtype, ", destination has ",
                dst.nbytes(), " bytes");
    py::gil_scoped_release nogil;
    Runtime::get().download(*c, dst.data_ptr(), dst.nbytes());
  }, "Copies the whole storage of src into the contiguous CPU tensor dst and waits.");

  // Programs.
  m.def("_compile_cached", [](const std::string& key, const std::string& mlir) {
    torch::PyWarningHandler warnings;  // e.g. "ignoring compilation cache entry": a Python warning
    std::shared_ptr<torch_tpu::pjrt::Executable> exe;
    {
      py::gil_scoped_release nogil;
      exe = torch_tpu::runtime::compile_cache().get_or_compile(Runtime::get().client(), key, mlir);
    }
    return exe;
  }, "The executable of `mlir` from the compilation cache (memory, then disk), compiling on a miss. "
     "`key` must be a hex digest covering everything the executable depends on.");
  m.def("_cache_configure", [](const std::string& dir, bool disk, int64_t max_bytes) {
    torch_tpu::runtime::compile_cache().configure(dir, disk, max_bytes);
  });
  m.def("_cache_stats", [] {
    auto s = torch_tpu::runtime::compile_cache().stats();
    py::dict d;
    d["memory_hits"] = s.memory_hits;
    d["disk_hits"] = s.disk_hits;
    d["misses"] = s.misses;
    d["disk_writes"] = s.disk_writes;
    d["disk_rejected"] = s.disk_rejected;
    d["evictions"] = s.evictions;
    d["compile_seconds"] = s.compile_seconds;
    d["compile_seconds_saved"] = s.saved_seconds;
    return d;
  });
  m.def("_cache_reset_stats", [] { torch_tpu::runtime::compile_cache().reset_stats(); });
  m.def("_cache_clear_memory", [] { torch_tpu::runtime::compile_cache().clear_memory(); });
  m.def("_launch", [](std::shared_ptr<torch_tpu::pjrt::Executable> exe, py::list inputs, py::list sinks,
                      py::list new_specs, int device, std::string producer) {
    auto& rt = Runtime::get();
    std::vector<torch_tpu::runtime::LaunchArg> args;
    args.reserve(inputs.size());
    for (py::handle h : inputs) {
      if (PyLong_Check(h.ptr())) {  // a storage by its key (fused eager replays by address)
        args.push_back({cell_by_key(h.cast<uintptr_t>()), nullptr});
        continue;
      }
      if (THPVariable_Check(h.ptr())) {
        const at::Tensor& t = THPVariable_Unpack(h.ptr());
        if (t.is_cpu()) {  // a host tensor operand (0-dim CPU tensor, copy_ source)
          at::Tensor c = t.contiguous();
          std::vector<int64_t> dims(c.sizes().begin(), c.sizes().end());
          args.push_back({nullptr, rt.client().buffer_from_host(
              c.data_ptr(), torch_tpu::runtime::to_pjrt_type(c.scalar_type()), dims, device)});
          torch_tpu::runtime::counters().h2d_transfers++;
        } else {
          args.push_back({cell_of(t), nullptr});
        }
        continue;
      }
      // (python number, torch.dtype): a Scalar operand, 0-dim.
      auto tup = h.cast<py::tuple>();
      auto st = reinterpret_cast<THPDtype*>(tup[1].ptr())->scalar_type;
      alignas(16) unsigned char bytes[16] = {0};
      py::handle v = tup[0];
      switch (st) {
        case c10::ScalarType::Bool: { bool x = v.cast<bool>(); std::memcpy(bytes, &x, 1); break; }
        case c10::ScalarType::Long: { int64_t x = v.cast<int64_t>(); std::memcpy(bytes, &x, 8); break; }
        case c10::ScalarType::Float: { float x = v.cast<float>(); std::memcpy(bytes, &x, 4); break; }
        case c10::ScalarType::Double: { double x = v.cast<double>(); std::memcpy(bytes, &x, 8); break; }
        case c10::ScalarType::UInt64: {
          auto pair = v.cast<std::pair<uint64_t, uint64_t>>();
          std::memcpy(bytes, &pair.first, 8);
          std::memcpy(bytes + 8, &pair.second, 8);
          break;
        }
        case c10::ScalarType::ComplexFloat: {
          auto c = v.cast<std::complex<double>>();
          float x[2] = {static_cast<float>(c.real()), static_cast<float>(c.imag())};
          std::memcpy(bytes, x, 8);
          break;
        }
        case c10::ScalarType::ComplexDouble: {
          auto c = v.cast<std::complex<double>>();
          std::memcpy(bytes, &c, 16);
          break;
        }
        default: TORCH_CHECK(false, "unsupported scalar operand dtype ", st);
      }
      std::vector<int64_t> dims;
      if (st == c10::ScalarType::UInt64) dims.push_back(2);  // an RNG (seed, offset) pair
      args.push_back({nullptr, rt.client().small_buffer_from_host(bytes, torch_tpu::runtime::to_pjrt_type(st), dims,
                                                                  device)});
    }
    std::vector<at::Tensor> fresh;
    fresh.reserve(new_specs.size());
    {
      c10::DeviceGuard guard(c10::Device(c10::DeviceType::PrivateUse1, device));
      auto* alloc = c10::GetAllocator(c10::DeviceType::PrivateUse1);
      for (py::handle h : new_specs) {
        auto spec = h.cast<py::tuple>();
        auto shape = spec[0].cast<std::vector<int64_t>>();
        auto st = reinterpret_cast<THPDtype*>(spec[1].ptr())->scalar_type;
        fresh.push_back(at::detail::empty_generic(shape, alloc, c10::DispatchKeySet(c10::DispatchKey::PrivateUse1),
                                                  st, std::nullopt));
      }
    }
    std::vector<Cell*> out_cells;
    out_cells.reserve(sinks.size());
    size_t next_new = 0;
    for (py::handle h : sinks) {
      if (h.is_none()) {
        out_cells.push_back(cell_of(fresh.at(next_new++)));
      } else if (PyLong_Check(h.ptr())) {
        out_cells.push_back(cell_by_key(h.cast<uintptr_t>()));
      } else {
        out_cells.push_back(cell_of(THPVariable_Unpack(h.ptr())));
      }
    }
    rt.execute(std::move(exe), std::move(args), std::move(out_cells), device, std::move(producer));
    return fresh;
  }, "Runs exe on tpu:device. inputs: tpu tensors (their storages' buffers), CPU tensors (uploaded) or "
     "(number, dtype) scalar operands. sinks: per output, the tensor whose storage receives it, or None "
     "for a new tensor of the next (shape, dtype) in new_specs. Returns the new tensors.");
  m.def("_describe", [](const at::Tensor& t) {
    Cell* c = cell_of(t);
    Runtime::get().ensure_typed(*c, t.scalar_type());
    return py::make_tuple(t.device().index(), c->addr, py::cast(t.sizes().vec()), py::cast(t.strides().vec()),
                          t.storage_offset(), py::reinterpret_borrow<py::object>(
                              reinterpret_cast<PyObject*>(torch::getTHPDtype(*c->dtype))), c->numel);
  }, "(device index, storage key, sizes, strides, offset, storage dtype, storage numel) of a tpu tensor.");
  m.def("_whole_key", [](const at::Tensor& t) -> int64_t {
    Cell* c = cell_of(t);
    Runtime::get().ensure_typed(*c, t.scalar_type());
    bool whole = *c->dtype == t.scalar_type() && t.storage_offset() == 0 && t.numel() == c->numel &&
                 t.is_contiguous();
    return whole ? static_cast<int64_t>(c->addr) : -1;
  }, "The storage key of a tpu tensor that is its whole storage, densely and in the storage's dtype "
     "(a compiled graph passes it as is); -1 for any other view.");
  m.def("_sole_owner", [](py::handle h) {
    // Unpack without copying: a copy would count as one more owner.
    const at::Tensor& t = THPVariable_Unpack(h.ptr());
    return t.use_count() == 1 && t.storage().use_count() == 1;
  }, "True when no other tensor (view, autograd's saved tensors, ...) shares t's TensorImpl or storage.");
  m.def("_set_host_read_hook", [](py::object fn) {
    if (fn.is_none()) {
      Runtime::get().set_host_read_hook(nullptr);
      return;
    }
    auto holder = std::make_shared<py::object>(std::move(fn));
    Runtime::get().set_host_read_hook([holder] {
      py::gil_scoped_acquire gil;
      (*holder)();
    });
  }, "fn() runs before the host reads device data (fused eager flushes there); None removes it.");
  m.def("_empty_like_specs", [](py::list specs, int device) {
    std::vector<at::Tensor> out;
    c10::DeviceGuard guard(c10::Device(c10::DeviceType::PrivateUse1, device));
    auto* alloc = c10::GetAllocator(c10::DeviceType::PrivateUse1);
    for (py::handle h : specs) {
      auto spec = h.cast<py::tuple>();
      out.push_back(at::detail::empty_generic(spec[0].cast<std::vector<int64_t>>(), alloc,
                                              c10::DispatchKeySet(c10::DispatchKey::PrivateUse1),
                                              reinterpret_cast<THPDtype*>(spec[1].ptr())->scalar_type,
                                              std::nullopt));
    }
    return out;
  }, "New tpu tensors (storage not yet written) of the given (shape, dtype) specs.");
  m.def("_synchronize", [](int device) {
    py::gil_scoped_release nogil;
    Runtime::get().synchronize(device);
  });

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
    return d;
  });
  m.def("_reset_counters", [] {
    auto& c = torch_tpu::runtime::counters();
    for (auto* a : {&c.compiles, &c.executions, &c.h2d_transfers, &c.d2h_transfers, &c.h2d_bytes,
                    &c.d2h_bytes, &c.host_syncs, &c.busy_inputs_kept})
      a->store(0);
  });
  m.def("_note_fallback", [](const std::string& full) {
    torch::PyWarningHandler warnings;  // the first use's warning, as a Python warning
    torch_tpu::aten::note_fallback(full);
  }, "Counts one CPU-fallback run of op `full` (warns the first time; NotImplementedError when disabled).");
  m.def("_fallback_counts", &torch_tpu::aten::fallback_counts);
  m.def("_reset_fallback_counts", &torch_tpu::aten::reset_fallback_counts);
}
