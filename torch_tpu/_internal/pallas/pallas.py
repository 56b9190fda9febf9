"""`torch_tpu._internal.pallas.pallas`: the names Helion's Pallas launcher and Tokamax's torch ops
import (JaxCallable, jax_placeholder, jax_op, custom_jax_kernel), over torch_tpu.pallas.

The shape hooks `get_global_shape` / `get_local_shape` (a tensor's shape across / within a device
mesh) are identities here, where one process drives one device; distributed code may replace them,
as Google's TorchTPU lets it."""
from __future__ import annotations

import torch

from ...pallas import _jax
from ...pallas.ops import JaxOp, custom_jax_kernel, jax_op

__all__ = ["JaxCallable", "custom_jax_kernel", "get_global_shape", "get_local_shape", "jax_op", "jax_placeholder"]


def jax_placeholder(t: torch.Tensor):
    """jax.ShapeDtypeStruct of tensor t's shape and dtype (what `pallas_call`'s out_shape takes)."""
    return _jax.spec(t)


def get_global_shape(local_shape, mesh=None, partition_spec=None):
    """The global shape of a tensor of `local_shape`: the same with one device per process."""
    return tuple(local_shape)


def get_local_shape(global_shape, mesh=None, partition_spec=None):
    """The per-device shape of a tensor of `global_shape`: the same with one device per process."""
    return tuple(global_shape)


class JaxCallable:
    """A jitted JAX function (typically a `pallas_call`) callable on tpu tensors.

    name: the kernel's name (the operator is torch_tpu_jax::<name>_<n>); jit_fn: the JAX function;
    trace_key: the caller's cache key (informational: tracing is cached per argument signature
    anyway); input_output_aliases: {input position: output position}; each such input is updated in
    place with that output (its buffer donated), as Helion's launcher expects. Calling it with the
    tensors returns the outputs (one tensor, or a tuple)."""

    def __init__(self, name: str, jit_fn, trace_key=None, input_output_aliases=None, mesh=None,
                 input_partition_specs=None, static_argnums=(), donate_argnums=(), **jit_kwargs):
        self.name = name
        self.trace_key = trace_key
        self.input_output_aliases = dict(input_output_aliases or {})
        self.mesh = mesh  # one device per process: a mesh of one, nothing to shard
        self.input_partition_specs = input_partition_specs
        self.static_argnums = tuple(static_argnums)
        self.donate_argnums = tuple(donate_argnums) or tuple(self.input_output_aliases)
        # Google's per-signature output cache, which Helion's launcher reads to build its own direct
        # calls; kept empty: every call goes through this object (and our C++ plan cache).
        self.output_shapes: dict = {}
        self.kernel_key_to_mlir_fingerprint: dict = {}
        self._op: JaxOp = custom_jax_kernel(jit_fn, name=None, input_output_aliases=self.input_output_aliases,
                                            **jit_kwargs)

    def __call__(self, *tensors):
        return self._op(*tensors)
