// torch_tpu._C.eager: the eager layer (csrc/eager) as Python sees it, and the Python front end of its
// dispatcher entry (csrc/eager/op_kernel.h): an overload's kernel object (torch_tpu/eager/kernel.py)
// builds the plan of a call the plan cache misses; the entry runs it.
#include "python/bindings.h"

#include <torch/csrc/DynamicTypes.h>
#include <torch/csrc/utils/tensor_memoryformats.h>
#include <torch/csrc/autograd/python_variable.h>
#include <torch/csrc/jit/python/pybind_utils.h>
#include <pybind11/complex.h>

#include <atomic>
#include <complex>
#include <memory>
#include <optional>
#include <vector>

#include "eager/call.h"
#include "eager/fused.h"
#include "eager/index_errors.h"
#include "eager/mode.h"
#include "eager/plan.h"
#include "eager/op_kernel.h"
#include "eager/copies.h"
#include "python/launch_args.h"

namespace torch_tpu::python {
namespace {

namespace py = pybind11;
using eager::Call;
using eager::KeyPart;
using eager::Operand;
using eager::Plan;

py::object dtype_obj(c10::ScalarType t) {
  return py::reinterpret_borrow<py::object>(reinterpret_cast<PyObject*>(torch::getTHPDtype(t)));
}

py::tuple ints(const std::vector<int64_t>& v) { return py::cast(v); }

// The key parts as the Python front-end reads them (kernel.py's _build): _C.eager.KeyPart objects.
py::list key_of(const Call& call) {
  py::list out;
  for (const KeyPart& p : call.parts) out.append(py::cast(p));
  return out;
}

// Operands as Python values: tensors, (number, dtype) scalars, generators (None: the default one).
py::list operands_of(const Call& call) {
  py::list out;
  for (const Operand& o : call.operands) {
    switch (o.kind) {
      case Operand::kCell:
      case Operand::kHostTensor: out.append(py::reinterpret_steal<py::object>(THPVariable_Wrap(o.tensor))); break;
      case Operand::kScalar:
        out.append(py::make_tuple(torch::jit::toPyObject(c10::IValue(o.value)), dtype_obj(o.dtype)));
        break;
      case Operand::kGenerator:
        out.append(o.generator ? torch::jit::toPyObject(c10::IValue(*o.generator)) : py::none());
        break;
    }
  }
  return out;
}

// A schema argument's value as Python sees it: dtypes, layouts and memory formats are ints on the
// stack but objects in Python.
py::object arg_to_py(const c10::Argument& arg, const c10::IValue& v) {
  if (v.isTensor())  // as a tensor even when it is a wrapped number (toPyObject would unwrap it)
    return py::reinterpret_steal<py::object>(THPVariable_Wrap(v.toTensor()));
  if (v.isInt()) {
    auto t = arg.real_type();
    if (auto opt = t->cast<c10::OptionalType>()) t = opt->getElementType();
    switch (t->kind()) {
      case c10::TypeKind::ScalarTypeType: return dtype_obj(static_cast<c10::ScalarType>(v.toInt()));
      case c10::TypeKind::LayoutType:
        return py::reinterpret_borrow<py::object>(reinterpret_cast<PyObject*>(torch::getTHPLayout(static_cast<c10::Layout>(v.toInt()))));
      case c10::TypeKind::MemoryFormatType:
        return py::reinterpret_borrow<py::object>(
            torch::utils::getTHPMemoryFormat(static_cast<c10::MemoryFormat>(v.toInt())));
      default: break;
    }
  }
  return torch::jit::toPyObject(v);
}

// (args, kwargs) of a call: kwarg-only schema arguments by name.
std::pair<py::tuple, py::dict> to_py(const c10::FunctionSchema& schema, c10::ArrayRef<c10::IValue> values) {
  std::vector<py::object> pos;
  py::dict kw;
  for (size_t i = 0; i < values.size(); ++i) {
    const auto& a = schema.arguments()[i];
    if (a.kwarg_only())
      kw[py::str(a.name())] = arg_to_py(a, values[i]);
    else
      pos.push_back(arg_to_py(a, values[i]));
  }
  py::tuple t(pos.size());
  for (size_t i = 0; i < pos.size(); ++i) t[i] = std::move(pos[i]);
  return {std::move(t), std::move(kw)};
}

// Pushes a Python result on the stack as the schema's returns.
void push_result(const c10::FunctionSchema& schema, torch::jit::Stack* stack, const py::object& out) {
  const auto& rets = schema.returns();
  if (rets.size() == 1) {
    stack->push_back(torch::jit::toIValue(out, rets[0].real_type()));
  } else if (rets.size() > 1) {
    auto t = out.cast<py::sequence>();
    TORCH_CHECK(t.size() == rets.size(), schema.name(), ": the tpu kernel returned ", t.size(), " values for ",
                rets.size(), " returns");
    for (size_t i = 0; i < rets.size(); ++i) stack->push_back(torch::jit::toIValue(t[i], rets[i].real_type()));
  }
}

// Owns a Python object; the last owner may be a thread without the GIL.
std::shared_ptr<void> hold(py::object o) {
  return std::shared_ptr<void>(o.release().ptr(), [](void* p) {
    if (!Py_IsInitialized()) return;
    py::gil_scoped_acquire gil;
    Py_DECREF(static_cast<PyObject*>(p));
  });
}

std::atomic<uint64_t> g_next_uid{1};

// The plan of a front-end entry: kernel.py's _Entry, a _C.eager.PlanSpec (ON_HOST among them: a key
// the lowering refused, run on the CPU fallback). written: the op returns its written arguments;
// has_check: a per-call check must run in Python first. Raises a cast error for any other object.
std::shared_ptr<Plan> plan_of_entry(const py::object& entry, bool written, bool has_check) {
  auto& spec = entry.cast<eager::PlanSpec&>();
  if (spec.uid == 0) spec.uid = g_next_uid++;  // stable per entry: a fused run keys on it
  auto p = std::make_shared<Plan>();
  static_cast<eager::PlanSpec&>(*p) = spec;
  if (written) p->structure = Plan::kWritten;
  p->fast = !has_check;
  p->entry = hold(entry);
  return p;
}

// An overload's Python front end: its torch_tpu/eager/kernel.py kernel object.
class PyFrontEnd final : public eager::FrontEnd {
 public:
  explicit PyFrontEnd(py::object kernel) : kernel_(hold(std::move(kernel))) {}

  void call_whole(const eager::OpKernel& k, torch::jit::Stack* stack) override {
    py::gil_scoped_acquire gil;
    auto arguments = torch::jit::pop(*stack, k.options().signature.kinds.size());
    auto [args, kwargs] = to_py(k.op().schema(), arguments);
    py::object out = kernel()(*args, **kwargs);
    push_result(k.op().schema(), stack, out);
  }

  eager::Built build(const eager::OpKernel& k, torch::jit::Stack* stack, const Call& call,
                     const std::shared_ptr<Plan>& cached) override {
    py::gil_scoped_acquire gil;
    size_t n = k.options().signature.kinds.size();
    auto [args, kwargs] = to_py(k.op().schema(), c10::ArrayRef<c10::IValue>(stack->data() + stack->size() - n, n));
    py::object entry = cached ? borrow(cached->entry) : py::none();
    // The key's words after the op's id (which is this process's registration order), for the meta
    // memo that outlives the process (torch_tpu/eager/meta_memo.py); None for a key the cache skips.
    py::object words = py::none();
    if (call.cacheable)
      words = py::bytes(reinterpret_cast<const char*>(call.key.data() + 1), (call.key.size() - 1) * sizeof(int64_t));
    // (result, entry for the plan cache or None, entry to run or None: Python returned the result)
    py::tuple r = kernel().attr("_slow")(args, kwargs, key_of(call), operands_of(call), call.device, entry, words);
    py::object stored = r[1], to_run = r[2];
    eager::Built built;
    if (call.cacheable && !stored.is_none()) built.store = plan_of(k, stored);
    if (to_run.is_none()) {
      torch::jit::drop(*stack, n);
      push_result(k.op().schema(), stack, r[0]);
      built.returned = true;
      return built;
    }
    // A plan already made for the entry to run (fused eager runs one with no program yet).
    bool fused = eager::mode() == eager::Mode::kFused;
    for (const auto& p : {built.store, cached})
      if (p && p->entry.get() == to_run.ptr() && (p->exe || fused)) {
        built.run = p;
        return built;
      }
    built.run = plan_of(k, to_run);
    return built;
  }

  std::shared_ptr<Plan> reread(const eager::OpKernel& k, const Plan& cached) override {
    py::gil_scoped_acquire gil;
    return plan_of(k, borrow(cached.entry));
  }

  void debug_synchronize(const eager::OpKernel&, const Call& call) override {
    py::gil_scoped_acquire gil;
    kernel().attr("_debug_synchronize")(operands_of(call), call.device);
  }

  void unlocked(c10::function_ref<void()> fn) override {
    if (!PyGILState_Check()) return fn();
    py::gil_scoped_release nogil;
    fn();
  }

 private:
  py::handle kernel() const { return static_cast<PyObject*>(kernel_.get()); }
  static py::object borrow(const std::shared_ptr<void>& o) {
    return py::reinterpret_borrow<py::object>(static_cast<PyObject*>(o.get()));
  }
  // The plan of an entry; the op's written arguments and per-call check decide how it runs.
  static std::shared_ptr<Plan> plan_of(const eager::OpKernel& k, const py::object& entry) {
    return plan_of_entry(entry, !k.facts().written.empty(), k.options().has_check);
  }

  std::shared_ptr<void> kernel_;
};

}  // namespace

void bind_eager(py::module_& m) {
  m.def("register_op_kernel", [](const std::string& qualified, const std::string& overload,
                                 const std::vector<eager::ArgKind>& arg_kinds, bool host_inputs, bool default_generator,
                                 bool has_check, bool prepare, bool prepare_only_for_masks, bool index_status,
                                 bool dispatch, py::object kernel) {
    eager::KernelOptions o;
    for (auto k : arg_kinds) o.signature.kinds.push_back(static_cast<char>(k));
    o.signature.host_inputs = host_inputs;
    o.signature.default_generator = default_generator;
    o.signature.index_status = index_status;
    o.has_check = has_check;
    o.whole_first = prepare;
    o.whole_only_for_masks = prepare_only_for_masks;
    return eager::register_op_kernel(qualified, overload, std::move(o), dispatch,
                                     std::make_unique<PyFrontEnd>(std::move(kernel)));
  }, py::arg("qualified"), py::arg("overload"), py::arg("arg_kinds"), py::arg("host_inputs"),
     py::arg("default_generator"), py::arg("has_check"), py::arg("prepare"), py::arg("prepare_only_for_masks"),
     py::arg("index_status"), py::arg("dispatch"), py::arg("kernel"),
     "Registers the tpu kernel of ns::name.overload (qualified: \"ns::name\") with `kernel` (torch_tpu/eager/"
     "kernel.py) as its front end: C++ keys each call and runs cached plans; a miss calls kernel._slow, and "
     "with `prepare` kernel(*args) runs first (only for a mask or CPU index with prepare_only_for_masks). "
     "arg_kinds: an ArgKind per schema argument; index_status: the device's index-error status is the last "
     "operand; dispatch=False registers nothing with the dispatcher (run_op_kernel only). Returns the "
     "kernel's id (csrc/eager/op_kernel.h).");
  m.def("run_op_kernel", [](int64_t id, py::list vals) -> py::object {
    eager::OpKernel& k = eager::op_kernel(id);
    const auto& args = k.op().schema().arguments();
    TORCH_CHECK(vals.size() == args.size(), "run_op_kernel: ", vals.size(), " values for ", args.size(), " arguments");
    torch::jit::Stack stack;
    for (size_t i = 0; i < args.size(); ++i) stack.push_back(torch::jit::toIValue(vals[i], args[i].real_type()));
    {
      py::gil_scoped_release nogil;
      k.run(&stack, true);
    }
    return torch::jit::createPyObjectForStack(std::move(stack));
  }, "Runs kernel `id` on argument values in schema order (the Python kernel's own entry: after its "
     "prepare, and for direct calls such as copy_'s device-side copy).");
  m.def("register_index_error", &eager::register_index_error,
        "The id of an index error found on the device: (op, IndexError (else RuntimeError), CPU's message with "
        "{value} for the bad index and {size} for the size it was checked against).");
  m.def("index_status", &eager::index_status, py::arg("device"),
        "The index-error status tensor of tpu device `device` (int64[3]: error id, first bad index, "
        "the size it was checked against), "
        "which programs with device-side index checks update in place.");
  m.def("raise_index_errors", [](int device) {
    py::gil_scoped_release nogil;
    eager::raise_index_errors(device);
  }, "Raises the first index error found on the device (-1: any) since the last call, and clears it.");
  m.def("register_copy_ops", &eager::register_copy_ops,
        "Registers the C++ tpu kernels of copy_, _copy_from, _copy_from_and_resize and _local_scalar_dense, "
        "whose device-side copy is op kernel `copy_kernel`.");
  m.attr("COMPLEX32_ERROR") = eager::kComplex32Error;
  m.def("scalar_operand_dtype",
      [](const py::object& v, bool wide) {
        c10::Scalar s;
        if (py::isinstance<py::bool_>(v)) {
          s = c10::Scalar(v.cast<bool>());
        } else if (py::isinstance<py::int_>(v)) {
          s = c10::Scalar(v.cast<int64_t>());
        } else if (PyComplex_Check(v.ptr())) {
          auto c = v.cast<std::complex<double>>();
          s = c10::Scalar(c10::complex<double>(c.real(), c.imag()));
        } else {
          s = c10::Scalar(v.cast<double>());
        }
        return dtype_obj(eager::scalar_operand_dtype(s, wide));
      },
      py::arg("value"), py::arg("wide"),
      "The dtype a python number takes as a Scalar operand of a program (eager keys and compiled "
      "graphs alike): bool, int64, or float32/complex64 (float64/complex128 when `wide`).");
  m.def("plan_cache_stats", [] {
    auto s = eager::plan_cache().stats();
    py::dict d;
    d["entries"] = s.entries;
    d["hits"] = s.hits;
    d["misses"] = s.misses;
    d["fast_runs"] = eager::plan_fast_runs().load();
    return d;
  }, "The eager plan cache: entries, hits, misses, and calls run in C++ with no Python (fast_runs).");
  m.def("plan_cache_clear", [] { eager::plan_cache().clear(); });
  m.def("plan_cache_reset_stats", [] {
    eager::plan_cache().reset_stats();
    eager::plan_fast_runs() = 0;
  });
  py::enum_<eager::ArgKind>(m, "ArgKind",
                            "How a schema argument enters an eager call's key, from its type (csrc/eager/call.h).")
      .value("tensor", eager::ArgKind::kTensor, "Tensor, Tensor?")
      .value("tensor_list", eager::ArgKind::kTensorList, "Tensor[], Tensor?[]")
      .value("scalar", eager::ArgKind::kScalar, "Scalar, Scalar? (and a lowering's float operands)")
      .value("scalar_list", eager::ArgKind::kScalarList, "Scalar[]")
      .value("generator", eager::ArgKind::kGenerator, "Generator?")
      .value("value", eager::ArgKind::kValue, "anything else, keyed by value");
  py::enum_<KeyPart::Tag>(m, "KeyPartKind", "What one key part of an eager call describes (csrc/eager/call.h).")
      .value("none", KeyPart::kNone, "an absent optional tensor")
      .value("host", KeyPart::kHost, "a CPU tensor operand")
      .value("device", KeyPart::kDevice, "a tpu tensor")
      .value("baked", KeyPart::kBaked, "a Scalar baked into the program (0, 1, -1 of integer and bool type)")
      .value("scalar", KeyPart::kScalar, "a Scalar operand")
      .value("length", KeyPart::kLength, "a list's length (its elements' parts follow)")
      .value("generator", KeyPart::kGenerator, "a Generator operand")
      .value("value", KeyPart::kValue, "an argument keyed by value");
  auto optional_dtype = [](c10::ScalarType t) -> py::object {
    return t == c10::ScalarType::Undefined ? py::none() : dtype_obj(t);
  };
  py::class_<KeyPart>(m, "KeyPart",
                      "One part of an eager call's key as the slow path reads it (csrc/eager/call.h KeyPart): "
                      "read-only; fields a kind does not use hold their defaults.")
      .def_readonly("kind", &KeyPart::tag)
      .def_property_readonly("dtype", [optional_dtype](const KeyPart& p) { return optional_dtype(p.dtype); },
                             "torch.dtype of a tensor or Scalar (None where not used)")
      .def_property_readonly("sizes", [](const KeyPart& p) { return ints(p.sizes); })
      .def_property_readonly("strides", [](const KeyPart& p) { return ints(p.strides); })
      .def_readonly("offset", &KeyPart::offset,
                    "device: the storage offset in elements, baked (offset_position -1), or added to that operand")
      .def_readonly("offset_position", &KeyPart::offset_position,
                    "device: operand position of the int64 offset the program takes at run time, or -1")
      .def_readonly("slot", &KeyPart::slot, "device: which storage of the call (its operand position)")
      .def_readonly("position", &KeyPart::position, "host, scalar, generator: operand position")
      .def_readonly("length", &KeyPart::length, "length: the list's element count")
      .def_readonly("bits", &KeyPart::bits, "device: lazy conj (1) and neg (2) bits")
      .def_readonly("first", &KeyPart::first, "device: first use of its slot")
      .def_property_readonly("storage_dtype", [optional_dtype](const KeyPart& p) { return optional_dtype(p.storage_dtype); })
      .def_property_readonly("storage_dims", [](const KeyPart& p) { return ints(p.storage_dims); })
      .def_property_readonly("baked", [](const KeyPart& p) -> py::object {
        return p.tag == KeyPart::kBaked ? torch::jit::toPyObject(c10::IValue(p.baked)) : py::none();
      }, "baked: the Scalar's value")
      .def("__repr__", [](const KeyPart& p) {
        return "KeyPart(" + std::string(py::str(py::cast(p.tag))) + ")";
      });
  py::enum_<eager::Mode>(m, "Mode", "The eager modes (csrc/eager/mode.h; torch_tpu/eager/modes.py names them).")
      .value("debug", eager::Mode::kDebug)
      .value("strict", eager::Mode::kStrict)
      .value("fused", eager::Mode::kFused);
  m.def("mode", &eager::mode, "This thread's eager mode.");
  m.def("set_default_mode", &eager::set_default_mode, "Sets the process's default eager mode.");
  m.def("fused_flush", [] {
    py::gil_scoped_release nogil;
    eager::fused().flush();
  }, "Runs what fused eager recorded (if anything) as one program.");
  m.def("fused_pending", [] { return eager::fused().pending(); });
  m.def("fused_max_ops", [] { return eager::kMaxOps; });
  m.def("fused_stats", [] {
    auto s = eager::fused().stats();
    py::dict d;
    d["fused_ops"] = s.ops;
    d["fused_flushes"] = s.flushes;
    d["fused_compiles"] = s.compiles;
    return d;
  });
  m.def("fused_reset_stats", [] { eager::fused().reset_stats(); });
  py::class_<eager::Sink>(m, "PlanSink",
                          "Where an eager program's output goes: fresh result tensor `index` (fresh=True) "
                          "or the storage of operand `index` (csrc/eager/plan.h).")
      .def(py::init([](bool fresh, int index) { return eager::Sink{fresh, index}; }), py::arg("fresh"),
           py::arg("index"))
      .def_readonly("fresh", &eager::Sink::fresh)
      .def_readonly("index", &eager::Sink::index);
  py::class_<aten::FreshSpec>(m, "FreshSpec",
                               "A fresh result tensor an eager op or a compiled graph makes: its sizes, dtype "
                               "and strides (None: row-major; else a dense permutation, e.g. channels_last) "
                               "(csrc/eager/plan.h).")
      .def(py::init([](std::vector<int64_t> sizes, py::handle dtype, std::optional<std::vector<int64_t>> strides) {
             aten::FreshSpec s;
             s.sizes = std::move(sizes);
             s.dtype = python::dtype_of(dtype);
             if (strides) {
               TORCH_CHECK(strides->size() == s.sizes.size(), "FreshSpec: ", strides->size(), " strides for ",
                           s.sizes.size(), " sizes");
               s.strides = std::move(*strides);
             }
             return s;
           }),
           py::arg("sizes"), py::arg("dtype"), py::arg("strides") = py::none())
      .def_property_readonly("sizes", [](const aten::FreshSpec& s) { return ints(s.sizes); })
      .def_property_readonly("dtype", [](const aten::FreshSpec& s) { return dtype_obj(s.dtype); })
      .def_property_readonly("strides", [](const aten::FreshSpec& s) -> py::object {
        if (s.strides.empty()) return py::none();
        return ints(s.strides);
      })
      .def("__repr__", [](const aten::FreshSpec& s) {
        return "FreshSpec(sizes=" + py::repr(ints(s.sizes)).cast<std::string>() + ", dtype=" +
               py::repr(dtype_obj(s.dtype)).cast<std::string>() +
               (s.strides.empty() ? std::string() : ", strides=" + py::repr(ints(s.strides)).cast<std::string>()) + ")";
      });
  py::enum_<Plan::Structure>(m, "ResultStructure",
                             "How an op's results are returned: one tensor, a tuple, a list, or its written "
                             "arguments (csrc/eager/plan.h).")
      .value("one", Plan::kOne)
      .value("tuple", Plan::kTuple)
      .value("list", Plan::kList)
      .value("written", Plan::kWritten);
  py::class_<eager::PlanSpec, std::shared_ptr<eager::PlanSpec>>(
      m, "PlanSpec",
      "What an op's front end builds for a call key on a miss (csrc/eager/plan.h): the executable (None until "
      "built), its operand positions in program argument order, the FreshSpec of each new result, a PlanSink "
      "per program output, the ResultStructure, `fixed` (position, None or int) results the program does not "
      "compute, the rng draws, the op's name, and `host` (the key runs on the CPU fallback). kernel.py's "
      "_Entry derives from it; C++ caches and runs it with no attribute read by name.")
      .def(py::init([](py::object exe, std::vector<int> order, std::vector<aten::FreshSpec> fresh,
                       std::vector<eager::Sink> sinks, Plan::Structure structure, py::sequence fixed,
                       uint64_t rng_draws, std::string name, bool host) {
             auto s = std::make_shared<eager::PlanSpec>();
             if (!exe.is_none()) s->exe = exe.cast<std::shared_ptr<pjrt::Executable>>();
             s->order = std::move(order);
             s->fresh = std::move(fresh);
             s->sinks = std::move(sinks);
             s->structure = structure;
             for (auto h : fixed) {
               auto f = h.cast<py::tuple>();
               TORCH_CHECK(f.size() == 2, "PlanSpec: fixed results are (position, None or int) pairs");
               s->fixed.emplace_back(f[0].cast<int>(),
                                     f[1].is_none() ? c10::IValue(at::Tensor()) : c10::IValue(f[1].cast<int64_t>()));
             }
             s->rng_draws = rng_draws;
             s->name = std::move(name);
             s->host = host;
             return s;
           }),
           py::arg("exe") = py::none(), py::arg("order") = std::vector<int>{},
           py::arg("fresh") = std::vector<aten::FreshSpec>{}, py::arg("sinks") = std::vector<eager::Sink>{},
           py::arg("structure") = Plan::kOne, py::arg("fixed") = py::tuple(), py::arg("rng_draws") = 0,
           py::arg("name") = "", py::arg("host") = false)
      .def_property("exe", [](const eager::PlanSpec& s) { return s.exe; },
                    [](eager::PlanSpec& s, std::shared_ptr<pjrt::Executable> e) { s.exe = std::move(e); })
      .def_readonly("order", &eager::PlanSpec::order)
      .def_readonly("fresh", &eager::PlanSpec::fresh)
      .def_readonly("sinks", &eager::PlanSpec::sinks)
      .def_readonly("structure", &eager::PlanSpec::structure)
      .def_property_readonly("fixed", [](const eager::PlanSpec& s) {
        py::list out;
        for (const auto& [i, v] : s.fixed)
          out.append(py::make_tuple(i, v.isInt() ? py::object(py::int_(v.toInt())) : py::object(py::none())));
        return py::tuple(out);
      })
      .def_readonly("rng_draws", &eager::PlanSpec::rng_draws)
      .def_readonly("uid", &eager::PlanSpec::uid)
      .def_readonly("name", &eager::PlanSpec::name)
      .def_readonly("host", &eager::PlanSpec::host);
  py::class_<eager::Wire>(m, "FusedWire",
                          "Where a fused program's argument comes from: local storage `index` of the run "
                          "(local=True) or host operand `index` (csrc/eager/fused.h).")
      .def(py::init([](bool local, int index) { return eager::Wire{local, index}; }), py::arg("local"),
           py::arg("index"))
      .def_readonly("local", &eager::Wire::local)
      .def_readonly("index", &eager::Wire::index)
      .def("__repr__", [](const eager::Wire& w) {
        return std::string(w.local ? "FusedWire(local " : "FusedWire(host ") + std::to_string(w.index) + ")";
      });
  m.def("fused_install", [](py::object build, py::object op_executable) {
    auto b = std::make_shared<py::object>(std::move(build));
    auto e = std::make_shared<py::object>(std::move(op_executable));
    eager::fused().set_builder(
        [b](const std::vector<eager::Record>& records, const std::vector<int>& outputs) {
          py::gil_scoped_acquire gil;
          py::list recs;
          for (const auto& r : records) {
            py::list wiring;
            for (const auto& w : r.wiring) wiring.append(py::cast(w));
            recs.append(py::make_tuple(py::reinterpret_borrow<py::object>(static_cast<PyObject*>(r.plan->entry.get())),
                                       py::tuple(wiring), py::tuple(py::cast(r.outs))));
          }
          py::tuple got = (*b)(recs, py::cast(outputs));
          eager::FusedProgram p;
          p.exe = got[0].cast<std::shared_ptr<pjrt::Executable>>();
          for (auto h : got[1]) p.args.push_back(h.cast<eager::Wire>());
          return p;
        },
        [e](const Plan& plan) -> std::shared_ptr<const pjrt::Executable> {
          py::gil_scoped_acquire gil;
          return (*e)(py::reinterpret_borrow<py::object>(static_cast<PyObject*>(plan.entry.get())))
              .cast<std::shared_ptr<pjrt::Executable>>();
        });
    runtime::Runtime::get().set_host_read_hook([] { eager::fused().flush(); });
  }, "Installs fused eager: build(records, outputs) -> (executable, per @main argument its FusedWire) on a "
     "new run signature (records: (entry, FusedWire per op argument, output locals)); "
     "op_executable(entry) -> one op's executable (replay); and the runtime's host-read hook (every "
     "host read flushes the recorded ops first).");
  m.def("push_mode", &eager::push_thread_mode,
        "Enters an eager_mode block on this thread.");
  m.def("pop_mode", [] { eager::pop_thread_mode(); }, "Leaves this thread's innermost eager_mode block.");
}

}  // namespace torch_tpu::python
