"""Custom kernels on tpu tensors: JAX functions, Pallas kernels and JAX kernel libraries as
PyTorch operators.

    from torch_tpu.pallas import jax_op
    rms = jax_op("mylib::rms", lambda x: x * jax.lax.rsqrt((x * x).mean(-1, keepdims=True)))
    y = rms(torch.randn(8, 128, device="tpu", requires_grad=True))

`jax_op` / `custom_jax_kernel` (ops.py) make an operator whose tpu kernel inlines the function's
StableHLO (program.py) into the calling program: eager (strict, fused, debug), torch.compile and
autograd (JAX's vjp by default) all go through the one lowering registry. JAX is optional (the
`kernels` extra); importing this package does not import it, calling a kernel does.
"""
from .ops import JaxOp, custom_jax_kernel, jax_op

__all__ = ["JaxOp", "custom_jax_kernel", "jax_op"]
