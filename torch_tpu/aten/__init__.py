"""The eager tpu kernel: cache key, meta, program assembly (kernel.py), view reads and writes
(views.py), copies (copy.py), launching (launch.py, fused.py) and the registration of every
lowering and of the fallback chain (register.py).

A real package, not a namespace folder: setuptools' find_packages skips folders without an
`__init__.py`, and a wheel without this subpackage fails at `import torch_tpu`. Importing it loads
nothing: torch_tpu imports the modules it needs.
"""
