#include "python/op_kernel.h"

#include <ATen/core/dispatch/Dispatcher.h>
#include <torch/csrc/DynamicTypes.h>
#include <torch/csrc/utils/tensor_memoryformats.h>
#include <torch/csrc/autograd/python_variable.h>
#include <torch/csrc/jit/python/pybind_utils.h>
#include <pybind11/complex.h>
#include <torch/library.h>

#include <atomic>
#include <complex>
#include <initializer_list>
#include <map>
#include <memory>
#include <optional>
#include <mutex>
#include <vector>

#include "eager/call.h"
#include "eager/fused.h"
#include "eager/index_errors.h"
#include "eager/mode.h"
#include "eager/plan.h"
#include "eager/range_out.h"
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

// The key parts as the Python front-end reads them (kernel.py's _build): _C.KeyPart objects.
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

// The plan of a front-end entry (kernel.py's _Entry, or the CPU-fallback marker). written: the op
// returns its written arguments; has_check: a per-call check must run in Python first.
std::shared_ptr<Plan> plan_of_entry(const py::object& entry, bool written, bool has_check) {
  auto p = std::make_shared<Plan>();
  p->entry = hold(entry);
  if (!py::hasattr(entry, "exe")) return p;  // the CPU-fallback marker
  py::object uid = entry.attr("uid");
  if (uid.is_none()) {
    uid = py::int_(g_next_uid++);
    entry.attr("uid") = uid;
  }
  p->uid = uid.cast<uint64_t>();
  p->name = entry.attr("name").cast<std::string>();
  py::object exe = entry.attr("exe");
  if (!exe.is_none()) p->exe = exe.cast<std::shared_ptr<pjrt::Executable>>();
  for (auto h : entry.attr("plan")) p->order.push_back(h.cast<int>());
  for (auto h : entry.attr("new_outputs")) p->fresh.push_back(h.cast<eager::FreshSpec>());
  for (auto h : entry.attr("sinks")) p->sinks.push_back(h.cast<eager::Sink>());
  p->structure = written ? Plan::kWritten : entry.attr("structure").cast<Plan::Structure>();
  for (auto h : entry.attr("fixed")) {
    auto f = h.cast<py::tuple>();
    p->fixed.emplace_back(f[0].cast<int>(), f[1].is_none() ? c10::IValue(at::Tensor()) : c10::IValue(f[1].cast<int64_t>()));
  }
  p->rng_draws = entry.attr("rng_draws").cast<uint64_t>();
  p->fast = !has_check && py::len(entry.attr("resize")) == 0;
  return p;
}

class OpKernel final : public c10::OperatorKernel {
 public:
  OpKernel(int64_t id, c10::OperatorHandle op, eager::Signature sig, eager::OpFacts facts, bool has_check,
           bool python_first, bool prepare_only_for_masks, py::object py_kernel)
      : id_(id), op_(std::move(op)), sig_(std::move(sig)), facts_(std::move(facts)), has_check_(has_check),
        python_first_(python_first), masks_only_(prepare_only_for_masks), range_out_(eager::range_out_of(facts_.name)),
        py_kernel_(hold(std::move(py_kernel))) {}

  void operator()(const c10::OperatorHandle& op, c10::DispatchKeySet, torch::jit::Stack* stack) {
    run(stack, false);
  }

  // entered: called from the Python kernel itself (after its `prepare`), not by the dispatcher.
  void run(torch::jit::Stack* stack, bool entered) {
    size_t n = sig_.kinds.size();
    c10::ArrayRef<c10::IValue> args(stack->data() + stack->size() - n, n);
    eager::size_range_out(range_out_, args);
    if (python_first_ && !entered && (!masks_only_ || has_mask(args))) return call_python(stack);
    Call call;
    eager::describe_call(id_, sig_, facts_.name, args, false, call);
    std::shared_ptr<Plan> plan = call.cacheable ? eager::plan_cache().find(call.key) : nullptr;
    if (plan && plan->fast) {
      auto mode = eager::mode();
      if (mode == eager::Mode::kStrict && plan->exe) {
        eager::run_plan(plan, facts_, call, stack, false);
        eager::plan_fast_runs()++;
        return;
      }
      if (mode == eager::Mode::kFused) {
        // A flush may build a program in Python: never wait for the recorder's lock holding the GIL.
        std::optional<py::gil_scoped_release> nogil;
        if (PyGILState_Check()) nogil.emplace();
        eager::run_plan(plan, facts_, call, stack, true);
        eager::plan_fast_runs()++;
        return;
      }
    }
    slow(stack, std::move(call), std::move(plan));
  }

  const c10::OperatorHandle& op() const { return op_; }

 private:
  py::handle kernel() const { return static_cast<PyObject*>(py_kernel_.get()); }

  // The Python kernel's __call__ on the whole call (ops with a `prepare` rewriting arguments).
  void call_python(torch::jit::Stack* stack) {
    py::gil_scoped_acquire gil;
    auto arguments = torch::jit::pop(*stack, sig_.kinds.size());
    auto [args, kwargs] = to_py(op_.schema(), arguments);
    py::object out = kernel()(*args, **kwargs);
    push_result(op_.schema(), stack, out);
  }

  void slow(torch::jit::Stack* stack, Call hashed, std::shared_ptr<Plan> plan) {
    py::gil_scoped_acquire gil;
    size_t n = sig_.kinds.size();
    c10::ArrayRef<c10::IValue> arguments(stack->data() + stack->size() - n, n);
    Call call;
    eager::describe_call(id_, sig_, facts_.name, arguments, true, call);
    auto [args, kwargs] = to_py(op_.schema(), arguments);
    py::object entry = plan ? py::reinterpret_borrow<py::object>(static_cast<PyObject*>(plan->entry.get()))
                            : py::none();
    py::list operands = operands_of(call);
    // The key's words after the op's id (which is this process's registration order), for the meta
    // memo that outlives the process (torch_tpu/eager/meta_memo.py); None for a key the cache skips.
    py::object words = py::none();
    if (call.cacheable)
      words = py::bytes(reinterpret_cast<const char*>(call.key.data() + 1), (call.key.size() - 1) * sizeof(int64_t));
    // (result, entry for the plan cache or None, entry for C++ to run or None: Python returned the result)
    py::tuple r = kernel().attr("_slow")(args, kwargs, key_of(call), operands, call.device, entry, words);
    py::object stored = r[1], to_run = r[2];
    bool written = !facts_.written.empty();
    std::shared_ptr<Plan> built;
    if (call.cacheable && !stored.is_none()) {
      built = plan_of_entry(stored, written, has_check_);
      eager::plan_cache().put(hashed.key, built, eager::plan_bytes(*built));
    } else if (call.cacheable && plan && plan->fast && !plan->exe) {
      auto again = plan_of_entry(entry, written, has_check_);  // built by fused eager, compiled since
      if (again->exe) {
        built = std::move(again);
        eager::plan_cache().put(hashed.key, built, eager::plan_bytes(*built));
      }
    }
    if (to_run.is_none()) {
      torch::jit::drop(*stack, n);
      push_result(op_.schema(), stack, r[0]);
      return;
    }
    run_entry(to_run, {built, plan}, call, stack, operands);
  }

  // The one run of an op's program outside the fast path (the fast path runs the same run_plan):
  // strict queues it, debug queues it and waits (a failure names the op), fused records it. Reuses
  // a plan already made for `entry`.
  void run_entry(const py::object& entry, std::initializer_list<std::shared_ptr<Plan>> made, Call& call,
                 torch::jit::Stack* stack, const py::list& operands) {
    auto mode = eager::mode();
    bool fused = mode == eager::Mode::kFused;
    std::shared_ptr<Plan> plan;
    for (const auto& p : made)
      if (p && p->entry.get() == entry.ptr() && (p->exe || fused)) { plan = p; break; }
    if (!plan) plan = plan_of_entry(entry, !facts_.written.empty(), has_check_);
    TORCH_CHECK(fused || plan->exe, facts_.name, ": the tpu kernel returned an entry with no executable to run");
    if (fused) {
      // A flush may build a program in Python: never wait for the recorder's lock holding the GIL.
      py::gil_scoped_release nogil;
      eager::run_plan(plan, facts_, call, stack, true);
      return;
    }
    eager::run_plan(plan, facts_, call, stack, false);
    if (mode == eager::Mode::kDebug) kernel().attr("_debug_synchronize")(operands, call.device);
  }

  int64_t id_;
  c10::OperatorHandle op_;
  eager::Signature sig_;
  eager::OpFacts facts_;
  // A bool/uint8 mask or a CPU tensor in a tensor-list argument (what advanced indexing's
  // `prepare` rewrites).
  bool has_mask(c10::ArrayRef<c10::IValue> args) const {
    for (size_t i = 0; i < args.size(); ++i) {
      if (static_cast<eager::ArgKind>(sig_.kinds[i]) != eager::ArgKind::kTensorList) continue;
      for (const auto& e : args[i].toListRef()) {
        if (!e.isTensor() || !e.toTensor().defined()) continue;
        const auto& t = e.toTensor();
        if (t.is_cpu() || t.scalar_type() == c10::ScalarType::Bool || t.scalar_type() == c10::ScalarType::Byte)
          return true;
      }
    }
    return false;
  }

  bool has_check_, python_first_, masks_only_;
  eager::RangeOut range_out_;  // arange / linspace out=: sized in C++ before keying
  std::shared_ptr<void> py_kernel_;
};

std::mutex g_mu;
std::vector<OpKernel*> g_kernels;  // owned by the dispatcher's registrations (process lifetime)
std::vector<std::unique_ptr<OpKernel>> g_undispatched;  // kernels called from Python only

// The PrivateUse1 IMPL library of an operator namespace ("aten", or a custom kernel's); caller holds g_mu.
torch::Library& library(const std::string& ns) {
  static auto* libs = new std::map<std::string, std::unique_ptr<torch::Library>>();
  auto& lib = (*libs)[ns];
  if (!lib) lib = std::make_unique<torch::Library>(torch::Library::IMPL, ns, c10::DispatchKey::PrivateUse1, __FILE__, __LINE__);
  return *lib;
}

}  // namespace

void run_op_kernel(int64_t id, torch::jit::Stack* stack) {
  OpKernel* k;
  {
    std::lock_guard<std::mutex> g(g_mu);
    k = g_kernels.at(id);
  }
  k->run(stack, true);
}

void bind_op_kernels(py::module& m) {
  m.def("_register_op_kernel", [](const std::string& qualified, const std::string& overload,
                                  const std::vector<eager::ArgKind>& arg_kinds,
                                  bool host_inputs, bool default_generator,
                                  bool has_check, bool python_first, bool prepare_only_for_masks, bool has_bounds,
                                  bool dispatch, py::object py_kernel) {
    auto sep = qualified.find("::");
    TORCH_CHECK(sep != std::string::npos, "_register_op_kernel: expected a qualified name (ns::op), got ", qualified);
    const std::string ns = qualified.substr(0, sep), name = qualified.substr(sep + 2);
    auto op = c10::Dispatcher::singleton().findSchemaOrThrow(qualified.c_str(),
                                                             overload == "default" ? "" : overload.c_str());
    const auto& schema = op.schema();
    std::string kinds;
    for (auto k : arg_kinds) kinds.push_back(static_cast<char>(k));
    TORCH_CHECK(kinds.size() == schema.arguments().size(), qualified, ": ", kinds.size(), " kinds for ",
                schema.arguments().size(), " arguments");
    eager::Signature sig{kinds, host_inputs, default_generator, has_bounds};
    eager::OpFacts facts;
    for (size_t i = 0; i < schema.arguments().size(); ++i) {
      const auto* alias = schema.arguments()[i].alias_info();
      if (alias && alias->isWrite()) facts.written.push_back(static_cast<int>(i));
    }
    facts.num_returns = schema.returns().size();
    facts.name = qualified + (overload.empty() || overload == "default" ? "" : "." + overload);
    std::lock_guard<std::mutex> g(g_mu);
    int64_t id = static_cast<int64_t>(g_kernels.size());
    auto kernel = std::make_unique<OpKernel>(id, op, std::move(sig), std::move(facts), has_check, python_first,
                                             prepare_only_for_masks, std::move(py_kernel));
    g_kernels.push_back(kernel.get());
    if (!dispatch) {
      g_undispatched.push_back(std::move(kernel));
      return id;
    }
    library(ns).impl((name + (overload.empty() || overload == "default" ? "" : "." + overload)).c_str(),
                     torch::CppFunction::makeFromBoxedFunctor(std::move(kernel)));
    return id;
  }, "Registers the tpu kernel of ns::name.overload (qualified: \"ns::name\"): C++ keying and plan cache, calling py_kernel._slow "
     "on a miss (and py_kernel(*args) first when python_first); dispatch=False registers nothing with the "
     "dispatcher (the kernel is run by _run_op_kernel only). arg_kinds: an ArgKind per schema argument "
     "(csrc/eager/call.h). Returns the kernel's id.");
  m.def("_run_op_kernel", [](int64_t id, py::list vals) -> py::object {
    OpKernel* k;
    {
      std::lock_guard<std::mutex> g(g_mu);
      k = g_kernels.at(id);
    }
    const auto& args = k->op().schema().arguments();
    TORCH_CHECK(vals.size() == args.size(), "_run_op_kernel: ", vals.size(), " values for ", args.size(), " arguments");
    torch::jit::Stack stack;
    for (size_t i = 0; i < args.size(); ++i) stack.push_back(torch::jit::toIValue(vals[i], args[i].real_type()));
    {
      py::gil_scoped_release nogil;
      k->run(&stack, true);
    }
    return torch::jit::createPyObjectForStack(std::move(stack));
  }, "Runs kernel `id` on argument values in schema order (the Python kernel's own entry: after its "
     "prepare, and for direct calls such as copy_'s device-side copy).");
  m.def("_register_index_error", &eager::register_index_error,
        "The id of an index error found on the device: (op, IndexError (else RuntimeError), CPU's message with "
        "{value} for the bad index).");
  m.def("_index_status", &eager::index_status, py::arg("device"),
        "The index-error status tensor of tpu device `device` (int64[2]: error id, first bad index), "
        "which programs with device-side index checks update in place.");
  m.def("_raise_index_errors", [](int device) {
    py::gil_scoped_release nogil;
    eager::raise_index_errors(device);
  }, "Raises the first index error found on the device (-1: any) since the last call, and clears it.");
  m.def("_register_copy_ops", &register_copy_ops,
        "Registers the C++ tpu kernels of copy_, _copy_from, _copy_from_and_resize and _local_scalar_dense, "
        "whose device-side copy is op kernel `copy_kernel`.");
  m.attr("COMPLEX32_ERROR") = kComplex32Error;
  m.def(
      "_scalar_operand_dtype",
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
  m.def("_plan_cache_stats", [] {
    auto s = eager::plan_cache().stats();
    py::dict d;
    d["entries"] = s.entries;
    d["hits"] = s.hits;
    d["misses"] = s.misses;
    d["fast_runs"] = eager::plan_fast_runs().load();
    return d;
  }, "The eager plan cache: entries, hits, misses, and calls run in C++ with no Python (fast_runs).");
  m.def("_plan_cache_clear", [] { eager::plan_cache().clear(); });
  m.def("_plan_cache_reset_stats", [] {
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
      .def_readonly("offset", &KeyPart::offset, "device: storage offset, in elements")
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
  py::enum_<eager::Mode>(m, "EagerMode", "The eager modes (csrc/eager/mode.h; torch_tpu/eager/modes.py names them).")
      .value("debug", eager::Mode::kDebug)
      .value("strict", eager::Mode::kStrict)
      .value("fused", eager::Mode::kFused);
  m.def("_eager_mode", &eager::mode, "This thread's eager mode.");
  m.def("_set_default_eager_mode", &eager::set_default_mode, "Sets the process's default eager mode.");
  m.def("_fused_flush", [] {
    py::gil_scoped_release nogil;
    eager::fused().flush();
  }, "Runs what fused eager recorded (if anything) as one program.");
  m.def("_fused_pending", [] { return eager::fused().pending(); });
  m.def("_fused_max_ops", [] { return eager::kMaxOps; });
  m.def("_fused_stats", [] {
    auto s = eager::fused().stats();
    py::dict d;
    d["fused_ops"] = s.ops;
    d["fused_flushes"] = s.flushes;
    d["fused_compiles"] = s.compiles;
    return d;
  });
  m.def("_fused_reset_stats", [] { eager::fused().reset_stats(); });
  py::class_<eager::Sink>(m, "PlanSink",
                          "Where an eager program's output goes: fresh result tensor `index` (fresh=True) "
                          "or the storage of operand `index` (csrc/eager/plan.h).")
      .def(py::init([](bool fresh, int index) { return eager::Sink{fresh, index}; }), py::arg("fresh"),
           py::arg("index"))
      .def_readonly("fresh", &eager::Sink::fresh)
      .def_readonly("index", &eager::Sink::index);
  py::class_<eager::FreshSpec>(m, "FreshSpec",
                               "A fresh result tensor an eager op or a compiled graph makes: its sizes, dtype "
                               "and strides (None: row-major; else a dense permutation, e.g. channels_last) "
                               "(csrc/eager/plan.h).")
      .def(py::init([](std::vector<int64_t> sizes, py::handle dtype, std::optional<std::vector<int64_t>> strides) {
             eager::FreshSpec s;
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
      .def_property_readonly("sizes", [](const eager::FreshSpec& s) { return ints(s.sizes); })
      .def_property_readonly("dtype", [](const eager::FreshSpec& s) { return dtype_obj(s.dtype); })
      .def_property_readonly("strides", [](const eager::FreshSpec& s) -> py::object {
        if (s.strides.empty()) return py::none();
        return ints(s.strides);
      })
      .def("__repr__", [](const eager::FreshSpec& s) {
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
  m.def("_fused_install", [](py::object build, py::object op_executable) {
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
  m.def("_push_eager_mode", &eager::push_thread_mode,
        "Enters an eager_mode block on this thread.");
  m.def("_pop_eager_mode", [] { eager::pop_thread_mode(); }, "Leaves this thread's innermost eager_mode block.");
}

}  // namespace torch_tpu::python
