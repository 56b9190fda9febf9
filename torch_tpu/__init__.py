"""TorchTPU: a native PyTorch backend for TPUs on the OpenXLA PJRT C API.

`import torch_tpu` makes `torch.device("tpu")` an ordinary device (PyTorch's PrivateUse1 backend,
renamed), adds `torch.tpu`, and registers the tpu kernels. It starts nothing: the PJRT client is
created on first use. Without a TPU, the device runs on OpenXLA's CPU plugin (see
`torch_tpu.runtime`).
"""
from __future__ import annotations


def _autoload():
    """The autoload entry point of installs made before it moved to `_torch_tpu_autoload` (their
    metadata still names this until reinstalled; removing it would break their `import torch`).

    Defined before `import torch`: when `import torch_tpu` comes first, torch's own import runs the
    autoload entry point, which finds this partially imported module and calls this."""


import atexit  # noqa: E402
import os as _os  # noqa: E402

import torch  # noqa: E402

# An import that failed part way (its error raised then; under PyTorch's autoload, the RuntimeWarning
# of `import torch`) leaves the device half-registered, and running this module again would fail on
# the half, hiding the cause.
if getattr(torch, "_torch_tpu_import_started", False):
    raise ImportError("torch_tpu: its first import in this process failed part way; the error raised then "
                      "(with PyTorch's device autoload: the RuntimeWarning of `import torch`) is the cause. "
                      "Fix that and start a new process.")
torch._torch_tpu_import_started = True

from . import _C  # noqa: F401  (registers the allocator, guard, hooks and metadata kernels)
from . import compile_cache, runtime
from . import settings as _settings

runtime.configure()
compile_cache.configure()
# A child forked after a PJRT plugin was loaded ends without the plugin's exit handlers, which wait on
# threads that did not survive the fork (libtpu's log flush hung forked children forever).
_os.register_at_fork(after_in_child=_C.runtime.end_child_without_exit_handlers)


def _finish_launches() -> None:
    """Launches are issued by a runtime thread: let them finish before the interpreter tears down
    (not in a child forked after the runtime started, which has no launches and no device)."""
    if not _C.runtime.in_bad_fork():
        _C.runtime.synchronize(-1)
        _C.runtime.finish_warm_start()  # the next run of this command starts warm (compile_cache.configure)
        _C.runtime.wait_compiles()  # the compile pool's threads must not outlive the plugin


atexit.register(_finish_launches)
# Registered after it, so it runs before it: the autograd engine's tpu device threads may still be
# releasing the last backward's graph task, which takes the GIL; one that waits for it when
# finalization starts is ended with std::terminate.
atexit.register(_C.device.drain_autograd_threads)
# Runs first: an async collective nobody waited for writes its results back through launches, and
# holds the caller's tensors until it ends, which must be while Python can still release them.
atexit.register(_C.distributed.drain_collectives)
torch.utils.rename_privateuse1_backend("tpu")
# torch.autocast("tpu") without a dtype computes in bfloat16, the TPU's native low precision (Google
# TorchTPU's default; PyTorch's for a PrivateUse1 device is float16). PyTorch keeps the setting per
# thread: a thread started later begins at float16 unless it passes dtype= or sets it.
torch.set_autocast_dtype("tpu", torch.bfloat16)

from . import tpu as _tpu_module  # noqa: E402

torch._register_device_module("tpu", _tpu_module)
torch.utils.generate_methods_for_privateuse1_backend(for_tensor=True, for_module=True, for_storage=True,
                                                     for_packed_sequence=True)

from . import lowering as _lowering  # noqa: E402,F401  (fills the registry)
from .eager import executables as _executables, register as _register  # noqa: E402

_register.register_lowerings()
_register.register_decompositions()
_executables.install_fused()

from . import _printing  # noqa: E402,F401
from .eager import eager_mode, get_eager_mode, set_eager_mode  # noqa: E402,F401
from . import metrics  # noqa: E402,F401
from . import dynamo  # noqa: E402,F401  (registers torch.compile(backend="tpu"))
from . import distributed  # noqa: E402

distributed.register()  # init_process_group("tpu_dist")

from . import integrations as _integrations  # noqa: E402

_integrations.install()  # accelerate picks tpu, torchvision imports beside a CPU torch (integrations/)

if _settings.get("TORCH_TPU_SHADOW_TOPOLOGY"):  # every program also compiled for a TPU (torch_tpu.aot)
    from .aot import shadow as _shadow
    _shadow.from_environment()

__version__ = "0.1.0"
__all__ = ["runtime", "metrics", "distributed", "set_eager_mode", "get_eager_mode", "eager_mode"]
