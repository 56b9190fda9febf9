"""Building blocks that several lowering modules share, under public names, so that no lowering
module imports another's private helpers:

- `checks`: what reproducing CPU's checks needs (dtype names as PyTorch's errors spell them,
  `not_implemented`, `meta_result`);
- `matrix`: batched-matrix pieces of the decompositions and eigen solvers;
- `points`: element-wise gathers/scatters and scatter's combiners (indexing, embedding bags);
- `host_tables`: host index/weight tables as programs (resampling, adaptive pooling);
- `arith`: integer floor division and addmm's scaled sum.

Helpers import only the builder and each other, never a lowering module that registers ops (except
`matrix`, which builds on linalg's `dot`).
"""
