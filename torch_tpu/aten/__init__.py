"""The eager tpu kernels' Python half: a cache miss's meta, lowering and program assembly
(kernel.py), launching and fused programs' text (launch.py,
fused.py), and the registration of every lowering and of the fallback chain (register.py). The hot
path and the host <-> tpu copies are C++ (csrc/eager, csrc/python/op_kernel.cc, copies.cc).

A real package, not a namespace folder: setuptools' find_packages skips folders without an
`__init__.py`, and a wheel without this subpackage fails at `import torch_tpu`. Importing it loads
nothing: torch_tpu imports the modules it needs.
"""
