// torch_tpu._C.graph: the binding of compiled graphs' per-call runner (csrc/graph/graph_runner.h).
#include "python/bindings.h"

#include <torch/csrc/autograd/python_variable.h>

#include <optional>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "graph/graph_runner.h"

namespace torch_tpu::python {
namespace {

using graph::ArgKind;
using graph::GraphArg;
using graph::GraphRunner;

std::vector<int64_t> ints_or_empty(const std::optional<std::vector<int64_t>>& v) { return v ? *v : std::vector<int64_t>{}; }

// The tensors of a Python list by position (undefined where an item is not a tensor).
std::vector<at::Tensor> tensors_of(const py::list& items) {
  std::vector<at::Tensor> out(items.size());
  for (size_t i = 0; i < out.size(); ++i) {
    PyObject* o = PyList_GET_ITEM(items.ptr(), i);
    if (THPVariable_Check(o)) out[i] = THPVariable_Unpack(o);
  }
  return out;
}

}  // namespace

void bind_graph(py::module_& m) {
  py::enum_<ArgKind>(m, "ArgKind", "Where a compiled graph's program argument comes from, per call.")
      .value("tpu_input", ArgKind::kTpuInput, "graph input `index`, a tpu tensor (its storage's buffer, or a copy)")
      .value("cpu_input", ArgKind::kCpuInput, "graph input `index`, a CPU tensor (uploaded)")
      .value("rng_state", ArgKind::kRngState, "the default generator's (seed, offset), advanced per call")
      .value("host_pack", ArgKind::kHostPack, "host pack `index` (the graph's host values, packed per dtype)")
      .value("constant", ArgKind::kConstant, "a tensor the graph holds (`constant`)");
  py::class_<GraphArg>(m, "GraphArg", "One program argument of a compiled graph's plan (csrc/graph/graph_runner.h).")
      .def(py::init([](ArgKind kind, int64_t index, std::optional<at::Tensor> constant,
                       std::optional<std::vector<int64_t>> strides, std::optional<std::vector<int64_t>> dims) {
             GraphArg a;
             a.kind = kind;
             a.index = index;
             if (constant) a.constant = *constant;
             TORCH_CHECK(kind != ArgKind::kConstant || a.constant.defined(), "GraphArg: a constant needs its tensor");
             a.strides = ints_or_empty(strides);
             a.dims = ints_or_empty(dims);
             return a;
           }),
           py::arg("kind"), py::arg("index") = -1, py::arg("constant") = py::none(), py::arg("strides") = py::none(),
           py::arg("dims") = py::none(),
           "strides: the layout a tpu input is read in (None: contiguous); dims: its buffer's dims.")
      .def_readonly("kind", &GraphArg::kind)
      .def_readonly("index", &GraphArg::index)
      .def("__repr__", [](const GraphArg& a) {
        return "GraphArg(" + std::string(py::str(py::cast(a.kind))) + ", " + std::to_string(a.index) + ")";
      });
  py::class_<GraphRunner>(m, "GraphRunner", "The per-call work of one compiled graph (csrc/graph/graph_runner.h).")
      .def(py::init([](std::shared_ptr<pjrt::Executable> exe, std::vector<GraphArg> plan,
                       const std::vector<int64_t>& donated, std::vector<std::pair<int64_t, int64_t>> sink_plan,
                       std::vector<aten::FreshSpec> specs, std::string producer, uint64_t rng_draws,
                       std::optional<std::tuple<std::string, std::vector<int>, int64_t>> meet) {
             std::optional<graph::Meet> m;
             if (meet) m = graph::Meet{std::get<0>(*meet), std::get<1>(*meet), std::get<2>(*meet)};
             return std::make_unique<GraphRunner>(std::move(exe), std::move(plan), donated, std::move(sink_plan),
                                                  std::move(specs), std::move(producer), rng_draws, std::move(m));
           }),
           py::arg("exe"), py::arg("plan"), py::arg("donated"), py::arg("sink_plan"), py::arg("specs"),
           py::arg("producer"), py::arg("rng_draws"), py::arg("meet") = py::none(),
           "plan: a GraphArg per program argument; donated: the inputs whose buffers the program may reuse; "
           "sink_plan: (result, input) pairs of results written into an input's storage; specs: a FreshSpec per "
           "program output; meet: (place, local device per replica or -1, timeout in ms) for a graph over "
           "several devices.")
      .def("__call__", [](const GraphRunner& r, const py::list& inputs, const py::list& packs) {
        std::vector<at::Tensor> in = tensors_of(inputs), host = tensors_of(packs);
        graph::GraphResults res;
        {
          py::gil_scoped_release nogil;  // the other ranks' threads may need the GIL to arrive
          res = r.run(in, host);
        }
        py::list results(res.tensors.size());
        for (size_t k = 0; k < res.tensors.size(); ++k)  // an input's own Python object where it is one
          results[k] = py::reinterpret_steal<py::object>(THPVariable_Wrap(std::move(res.tensors[k])));
        return py::make_tuple(results, py::cast(res.copied));
      }, py::arg("inputs"), py::arg("packs"),
      "(results, copied): runs the program on `inputs` (the graph's inputs) and `packs` (host packs' CPU "
      "tensors); results per program output, and the inputs passed as copies (write their results back).");
}

}  // namespace torch_tpu::python
