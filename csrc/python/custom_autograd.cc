// The autograd kernel (AutogradPrivateUse1) of a custom kernel's operator (torch_tpu/pallas/ops.py).
// A call that needs no gradient (grad mode off, or no input requiring grad) goes straight to the tpu
// kernel below autograd, in C++; only a call that does calls back into Python, whose
// torch.autograd.Function records the backward. torch.library's own autograd kernel is Python on
// every call, which costs a small op several times its launch.
#include "python/bindings.h"

#include <ATen/core/dispatch/Dispatcher.h>
#include <c10/core/GradMode.h>
#include <torch/csrc/jit/python/pybind_utils.h>
#include <torch/library.h>

#include <map>
#include <memory>
#include <mutex>
#include <string>

namespace torch_tpu::python {
namespace {

namespace py = pybind11;

bool requires_grad(const c10::IValue& v) {
  if (v.isTensor()) return v.toTensor().defined() && v.toTensor().requires_grad();
  if (v.isTensorList()) {
    for (const c10::IValue& e : v.toListRef())  // no copy of the list
      if (e.isTensor() && e.toTensor().defined() && e.toTensor().requires_grad()) return true;
  }
  return false;
}

class AutogradKernel final : public c10::OperatorKernel {
 public:
  explicit AutogradKernel(py::object with_grad) : with_grad_(std::move(with_grad)) {}
  // The dispatcher destroys kernels at process exit, after Python has finalized: the reference is
  // left to the process's end rather than released without an interpreter.
  ~AutogradKernel() override { with_grad_.release(); }

  void operator()(const c10::OperatorHandle& op, c10::DispatchKeySet ks, torch::jit::Stack* stack) {
    const auto& schema = op.schema();
    const size_t n = schema.arguments().size();
    bool grad = false;
    if (c10::GradMode::is_enabled())
      for (size_t i = stack->size() - n; i < stack->size() && !grad; ++i) grad = requires_grad((*stack)[i]);
    if (!grad) {
      op.redispatchBoxed(ks & c10::after_autograd_keyset, stack);
      return;
    }
    auto args = torch::jit::last(*stack, n).vec();
    torch::jit::drop(*stack, n);
    py::gil_scoped_acquire gil;
    py::tuple py_args(n);
    for (size_t i = 0; i < n; ++i) py_args[i] = torch::jit::toPyObject(args[i]);
    py::object result = with_grad_(*py_args);
    const auto& returns = schema.returns();
    TORCH_CHECK(returns.size() == 1, op.schema().name(), ": a custom kernel's operator returns one Tensor[]");
    stack->push_back(torch::jit::toIValue(result, returns[0].real_type()));
  }

 private:
  py::object with_grad_;
};

std::mutex g_mu;

torch::Library& autograd_library(const std::string& ns) {
  static auto* libs = new std::map<std::string, std::unique_ptr<torch::Library>>();
  auto& lib = (*libs)[ns];
  if (!lib)
    lib = std::make_unique<torch::Library>(torch::Library::IMPL, ns, c10::DispatchKey::AutogradPrivateUse1, __FILE__,
                                           __LINE__);
  return *lib;
}

}  // namespace

void bind_custom_autograd(py::module_& m) {
  m.def("register_custom_autograd",
      [](const std::string& qualified, py::object with_grad) {
        auto sep = qualified.find("::");
        TORCH_CHECK(sep != std::string::npos, "register_custom_autograd: expected ns::op, got ", qualified);
        std::lock_guard<std::mutex> g(g_mu);
        autograd_library(qualified.substr(0, sep))
            .impl(qualified.substr(sep + 2).c_str(),
                  torch::CppFunction::makeFromBoxedFunctor(std::make_unique<AutogradKernel>(std::move(with_grad))));
      },
      py::arg("qualified"), py::arg("with_grad"),
      "Registers the AutogradPrivateUse1 kernel of ns::op (one Tensor[] result): calls that need no "
      "gradient redispatch below autograd in C++; the others call with_grad(*args), which returns the "
      "results (a list of tensors) with their autograd graph.");
}

}  // namespace torch_tpu::python
