"""PyTorch's device-backend autoloading entry point for torch_tpu (group "torch.backends").

`import torch` calls every such entry point and turns an exception from one into a failure of
`import torch` itself, in every program of the environment. An entry point inside torch_tpu
(`torch_tpu:f`) cannot guard against a broken torch_tpu: loading it runs torch_tpu/__init__.py
first. So it lives in this separate top-level module, which imports torch_tpu inside try/except
and turns a failure into a warning: CPU programs keep working, and the warning says what to do.
"""
from __future__ import annotations

import sys
import warnings


def _autoload() -> None:
    if "torch_tpu" in sys.modules:
        # `import torch_tpu` came first and its own `import torch` is what runs this: torch_tpu is
        # partially imported and finishes by itself (its errors reach the user's import directly).
        return
    try:
        import torch_tpu  # noqa: F401  (importing registers the tpu device)
    except Exception as err:  # noqa: BLE001  (any failure: torch must still import)
        warnings.warn(
            f"torch_tpu is installed but could not be loaded ({type(err).__name__}: {err}); the 'tpu' "
            "device is unavailable, the rest of torch works. The install is probably broken: reinstall "
            "torch_tpu (from its source: pip install --no-build-isolation .), or uninstall it. "
            "`import torch_tpu` shows the full traceback; TORCH_DEVICE_BACKEND_AUTOLOAD=0 turns "
            "autoloading off.",
            RuntimeWarning,
            stacklevel=2,
        )
