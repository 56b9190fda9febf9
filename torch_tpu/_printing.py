"""Printing tpu tensors: format a host copy.

PyTorch moves xla/lazy/ipu/mtia tensors to the CPU before formatting them (torch/_tensor_str.py);
without the same for tpu, printing one tensor would compile and run a few dozen tiny programs
(masked_select, abs, max, ...) on the device.
"""
import torch._tensor_str as _tensor_str

_format = _tensor_str._tensor_str


def _tensor_str_on_host(self, indent):
    if self.device.type == "tpu":
        self = self.cpu()
    return _format(self, indent)


_tensor_str._tensor_str = _tensor_str_on_host
