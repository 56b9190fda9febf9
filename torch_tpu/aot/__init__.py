"""torch_tpu.aot: check a TPU job, and build its executables, on a machine without a TPU.

libtpu's compiler (the `libtpu` package: pip install 'torch_tpu[tpu]') compiles for real TPU
topologies on any x86-64 Linux host, with no chip (target.py). With it:
- topology(name, num_slices=1): a TPU topology ("v5e:2x2", "v4:2x2x1", ...) with its devices;
- compile(fn, *args, topology=..., cache=None, **kwargs): traces `fn` as torch.compile(fn,
  backend="tpu") would, compiles every graph for the topology, runs nothing, and returns a Report
  (per program: errors, flops, bytes, time estimate, memory; for the step: peak memory and whether
  it fits); `cache` writes the TPU executables where the TPU job's runtime will look for them;
- shadow mode (TORCH_TPU_SHADOW_TOPOLOGY=v5e:1x1): every program compiled here is also compiled for
  that topology, off the hot path; shadow_report() says what would not compile on TPU.
libtpu compiles in worker processes (worker.py): where it crashes, one program fails with
CompilerCrash, and the job goes on.
"""
from __future__ import annotations

from .step import compile
from .report import ProgramReport, Report
from .shadow import ShadowReport, shadow_report
from .target import Device, Topology, topology
from .worker import CompilerCrash

__all__ = ["compile", "topology", "shadow_report", "Report", "ProgramReport", "ShadowReport", "Topology", "Device",
           "CompilerCrash"]
