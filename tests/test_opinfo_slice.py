"""A fixed, representative slice of PyTorch's OpInfo database run through the conformance harness
(tests/opinfo): each (op, dtype) must pass, without the CPU fallback. The whole database is
`python -m tests.opinfo.report` (see docs/development.md)."""
from __future__ import annotations

import pytest
import torch

from opinfo import harness

SLICE = [
    "add", "sub", "mul", "div.no_rounding_mode", "div.floor_rounding", "div.trunc_rounding", "remainder",
    "pow", "maximum", "eq", "lt", "where", "clamp", "abs", "neg", "exp", "log", "tanh", "sigmoid", "rsqrt",
    "sum", "mean", "prod", "amax", "amin", "max.reduction_with_dim", "max.reduction_no_dim",
    "min.reduction_with_dim", "argmax", "any", "all", "var", "std", "cumsum", "cummax",
    "matmul", "mm", "bmm", "addmm", "softmax", "log_softmax", "nn.functional.relu", "nn.functional.gelu",
    "nn.functional.layer_norm", "nn.functional.embedding", "cat", "stack", "index_select", "gather",
    "scatter_add", "masked_fill", "flip", "tril", "sort", "topk", "transpose", "expand",
]
DTYPES = [torch.float32, torch.bfloat16, torch.int64]
# a few more (op, dtype) pairs whose lowerings had dtype-specific faults
EXTRA = [("abs", torch.complex64), ("sgn", torch.complex64), ("var", torch.complex64),
         ("linalg.vector_norm", torch.complex64), ("lerp", torch.complex64), ("cummin", torch.float16),
         ("sign", torch.float32), ("nn.functional.scaled_dot_product_attention", torch.float32)]

# (op, dtype) -> why it is known not to pass yet.
EXPECTED_FAILURES: dict[tuple[str, str], str] = {}

_OPS = {harness.op_key(o): o for o in harness.select_ops(SLICE + [n for n, _ in EXTRA])}


def _cases():
    for name in SLICE:
        for dt in DTYPES:
            yield pytest.param(name, dt, id=f"{name}-{str(dt).replace('torch.', '')}")
    for name, dt in EXTRA:
        yield pytest.param(name, dt, id=f"{name}-{str(dt).replace('torch.', '')}")


def test_slice_names_exist():
    assert sorted(set(SLICE + [n for n, _ in EXTRA]) - set(_OPS)) == []


@pytest.mark.parametrize("name,dtype", list(_cases()))
def test_opinfo(name, dtype):
    op = _OPS[name]
    if dtype not in op.supported_dtypes("cpu"):
        pytest.skip("dtype not supported by the op on CPU")
    (res,) = harness.run_op(op, [dtype], max_samples=2, timeout_s=60)
    key = (name, str(dtype).replace("torch.", ""))
    if key in EXPECTED_FAILURES:
        assert res["result"] != "pass", f"{key} passes now: remove it from EXPECTED_FAILURES"
        pytest.xfail(EXPECTED_FAILURES[key])
    if res["result"] == "skip":
        pytest.skip(res["reason"])
    assert res["result"] == "pass", f"{res['result']}: {res.get('reason')}"
