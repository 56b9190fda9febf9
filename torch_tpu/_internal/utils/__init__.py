"""`torch_tpu._internal.utils`: Google TorchTPU's utility names that kernel launchers import."""
