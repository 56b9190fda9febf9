// The tpu device has no sparse layouts (XLA's buffers are dense; PyTorch/XLA has none either). An op
// that meets a sparse tensor together with a tpu tensor dispatches to SparsePrivateUse1 /
// SparseCsrPrivateUse1: torch.sparse.mm(cpu_sparse, tpu_dense) (a GNN's adjacency left on the host),
// sparse_coo_tensor(..., device="tpu"), sparse.to("tpu"). PyTorch's own message there ("Could not run
// 'aten::mm' with arguments from the 'Sparsetpu' backend ... Facebook employee") says neither what was
// wrong nor what to do; this one does. NotImplementedError, as PyTorch raises for a missing kernel.
#include <c10/util/Exception.h>
#include <torch/library.h>

namespace torch_tpu::aten {
namespace {

void refuse_sparse(const c10::OperatorHandle& op, torch::jit::Stack* /*stack*/) {
  const auto& name = op.schema().operator_name();
  TORCH_CHECK_NOT_IMPLEMENTED(
      false, name.name, (name.overload_name.empty() ? "" : "." + name.overload_name),
      ": a sparse tensor (torch.sparse_coo / sparse_csr layouts) met the tpu device, which has no "
      "sparse layouts. Keep the sparse operation on CPU (all its tensors there), or make the sparse "
      "tensor dense first (t.to_dense().to('tpu')): a dense matmul on tpu replaces torch.sparse.mm. "
      "nn.Embedding / nn.EmbeddingBag(sparse=True) make sparse gradients: pass sparse=False on tpu.");
}

TORCH_LIBRARY_IMPL(_, SparsePrivateUse1, m) {
  m.fallback(torch::CppFunction::makeFromBoxedFunction<&refuse_sparse>());
}

TORCH_LIBRARY_IMPL(_, SparseCsrPrivateUse1, m) {
  m.fallback(torch::CppFunction::makeFromBoxedFunction<&refuse_sparse>());
}

}  // namespace
}  // namespace torch_tpu::aten
