"""Names Google's TorchTPU documents under `torch_tpu._internal`, over this package's own machinery,
so that code written for it (Helion's Pallas launcher, Tokamax's torch ops, PyTorch Inductor's tpu
Pallas backend) runs unchanged. Importing it imports nothing heavy (no JAX)."""
