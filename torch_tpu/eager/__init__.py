"""The eager layer's Python half, beside its C++ half (csrc/eager: the call key, the plan cache, the
fused recorder; csrc/eager/op_kernel.h: the dispatcher's entry, which calls in here on a miss):

- modes.py: the eager modes a user picks (torch_tpu.set_eager_mode, eager_mode, get_eager_mode);
- state.py: process-wide counters, the calling thread's mode, run_as_is;
- kernel.py: one Kernel per lowered overload: a cache miss's meta, lowering and program assembly;
- meta_memo.py: result types remembered across processes, so a warm process runs no meta kernel;
- executables.py: an entry's executable, debug eager's wait, fused eager's hooks (install_fused);
- fused.py: fused eager's program text;
- register.py: every lowering, host kernel and the fallback chain registered with the dispatcher.

Every op program runs from C++. A real package, not a namespace folder: setuptools' find_packages
skips folders without an `__init__.py`, and a wheel without this subpackage fails at
`import torch_tpu`. Importing it sets the eager mode from the environment (modes.py) and loads no
kernel: torch_tpu imports the modules it needs.
"""
from .modes import eager_mode, get_eager_mode, set_eager_mode  # noqa: F401
