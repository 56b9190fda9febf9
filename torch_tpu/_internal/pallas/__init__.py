"""`torch_tpu._internal.pallas`: Google TorchTPU's spelling of torch_tpu.pallas (jax_op,
custom_jax_kernel); its submodules `pallas` (JaxCallable, jax_placeholder) and `tpu_torch_pallas`
(the serialized-kernel registry PyTorch's Inductor calls)."""
from ...pallas import custom_jax_kernel, jax_op

__all__ = ["custom_jax_kernel", "jax_op"]
