"""Builds torch_tpu._C (the C++ core) with PyTorch's extension builder.

The PJRT C API header is the one the installed `xla-cpu-pjrt` wheel carries
(xla_plugins/xla_cpu_pjrt/include/pjrt_c_api.h): a dependency's header, found here at build time.
Build with `pip install --no-build-isolation .` after installing torch==2.13.0 and xla-cpu-pjrt.
"""
import glob
import importlib.util
import os
import sys
import sysconfig

import torch
from setuptools import find_packages, setup
from torch.utils.cpp_extension import BuildExtension, CppExtension


def pjrt_include_dir():
    spec = importlib.util.find_spec("xla_plugins.xla_cpu_pjrt")
    if spec is None or not spec.submodule_search_locations:
        raise RuntimeError("xla-cpu-pjrt is not installed: `pip install xla-cpu-pjrt` first; torch_tpu "
                           "builds against the PJRT C API header that it carries.")
    inc = os.path.join(list(spec.submodule_search_locations)[0], "include")
    if not os.path.exists(os.path.join(inc, "pjrt_c_api.h")):
        raise RuntimeError(f"xla-cpu-pjrt carries no pjrt_c_api.h under {inc}")
    return inc


def kineto():
    """(include dirs, macros) for csrc/aten/profiler.cc: PyTorch's Kineto headers, and USE_KINETO when this
    PyTorch was built with Kineto (its PrivateUse1 profiler registry exists only then)."""
    inc = os.path.join(os.path.dirname(torch.__file__), "include", "kineto")
    return ([inc], [("USE_KINETO", None)]) if torch.autograd.kineto_available() and os.path.isdir(inc) else ([], [])


class BuildCore(BuildExtension.with_options(use_ninja=True)):
    """PyTorch's extension builder, with its objects always in this tree's build/ folder.

    setuptools gives an editable install (`pip install -e`) a temporary build folder that it deletes
    afterwards, so every editable install (README command 2 after command 1, adding an extra) rebuilt
    all of the core. Kept here, ninja recompiles only what changed (it tracks headers and flags).
    """

    def finalize_options(self):
        super().finalize_options()
        self.build_temp = os.path.join(here, "build", f"temp.{sysconfig.get_platform()}-{sys.implementation.cache_tag}")


here = os.path.dirname(os.path.abspath(__file__))
kineto_include, kineto_macros = kineto()
sources = sorted(os.path.relpath(p, here) for p in glob.glob(os.path.join(here, "csrc", "**", "*.cc"), recursive=True))

setup(
    # Every folder of torch_tpu has an __init__.py: find_packages skips those without one.
    packages=find_packages(include=["torch_tpu", "torch_tpu.*"]),
    py_modules=["_torch_tpu_autoload"],  # the torch.backends entry point (see pyproject.toml)
    ext_modules=[
        CppExtension(
            "torch_tpu._C",
            sources,
            include_dirs=[os.path.join(here, "csrc"), pjrt_include_dir(), *kineto_include],
            define_macros=kineto_macros,
            # PyTorch's extension builder adds -std=c++20, the standard torch's headers are written for
            # (C++17 made each file warn). -g0 undoes Python's own -g: debug information was a quarter
            # of the compile time and 90% of the library's size; symbols stay for backtraces.
            extra_compile_args=["-O2", "-g0", "-fvisibility=hidden", "-Wno-unused-parameter"],
            libraries=["dl"],
        )
    ],
    cmdclass={"build_ext": BuildCore},
)
