"""The eager tpu kernels' Python half: a cache miss's meta, lowering and program assembly
(kernel.py), an entry's executable and debug eager's wait (launch.py), fused programs' text
(fused.py), and the registration of every lowering and of the fallback chain (register.py). Every
op program runs from C++ (csrc/eager, csrc/python/op_kernel.cc), as do the host <-> tpu copies
(copies.cc).

A real package, not a namespace folder: setuptools' find_packages skips folders without an
`__init__.py`, and a wheel without this subpackage fails at `import torch_tpu`. Importing it loads
nothing: torch_tpu imports the modules it needs.
"""
