"""What torch_tpu.aot.compile found: per program and for the whole step.

Sizes are bytes of device memory as libtpu's compiler lays the program out
(PJRT_Executable_GetCompiledMemoryStats); flops, bytes accessed and the time estimate come from its
cost model (PJRT_Executable_GetCostAnalysis), which cannot time some programs (loops, sorts,
convolutions, 64-bit types): their estimate is None.
"""
from __future__ import annotations

import dataclasses

# How libtpu's compiler says a program does not fit in device memory (XLA error E1000).
_OUT_OF_MEMORY = "CompileTimeHbmOom"


@dataclasses.dataclass
class ProgramReport:
    """One program of the step (a forward, backward or inference graph, in the order they ran).

    name: what it is ("forward graph [0/0]", ...). error: None, or why it cannot run on the target
    (the compiler's message naming the op, or torch_tpu's refusal naming op and dtype).
    flops, bytes_accessed: from the cost model (floats; 0 on error).
    estimated_seconds: the cost model's time on one device, None where unknown.
    argument_bytes, output_bytes, alias_bytes (outputs written into donated arguments), temp_bytes,
    code_bytes, peak_bytes (the program's own peak: its arguments, outputs and temporaries).
    live_bytes: other device tensors alive while it ran (parameters, gradients, optimizer state,
    activations saved for later programs), by their logical sizes.
    mosaic_kernels: Pallas (Mosaic) kernels it calls. compile_seconds: libtpu's compile time.
    replicas: the devices it runs across; 1 for one device's program. ranks: for a graph with
    collectives, the global ranks its replicas run (replica k runs rank ranks[k] on the topology's
    device ranks[k]): the world for a mesh's collectives, a stage's ranks for a pipeline stage's.
    key: its executable cache key for the target. text: its StableHLO."""
    name: str
    error: str | None = None
    flops: float = 0.0
    bytes_accessed: float = 0.0
    transcendentals: float = 0.0
    estimated_seconds: float | None = None
    argument_bytes: int = 0
    output_bytes: int = 0
    alias_bytes: int = 0
    temp_bytes: int = 0
    code_bytes: int = 0
    peak_bytes: int = 0
    live_bytes: int = 0
    mosaic_kernels: int = 0
    replicas: int = 1
    ranks: tuple[int, ...] = ()
    compile_seconds: float = 0.0
    key: str = ""
    text: str = dataclasses.field(default="", repr=False)
    serialized: bytes = dataclasses.field(default=b"", repr=False)

    @property
    def ok(self) -> bool:
        return self.error is None

    @property
    def step_bytes(self) -> int:
        """Device memory in use while this program runs: its own peak plus the other live tensors."""
        return self.peak_bytes + self.live_bytes


@dataclasses.dataclass
class Report:
    """The whole step on one device of `topology`.

    programs: ProgramReport per program, in the order the step ran them.
    ok: every program compiles for the target.
    peak_bytes: device memory at the busiest program (its peak plus every other tensor alive then).
    device_memory_bytes: one device's memory (HBM). fits: peak_bytes <= device_memory_bytes, and no
    program refused by libtpu as too big (a failed program counts by its arguments and outputs).
    headroom_bytes: device_memory_bytes - peak_bytes (negative: short by that much).
    cached: where the executables were written (cache tiers or directories), empty if not asked.
    seconds: the whole aot.compile call (trace, lowering, libtpu compiles)."""
    topology: str
    device_kind: str
    device_memory_bytes: int
    programs: list[ProgramReport] = dataclasses.field(default_factory=list)
    cached: list[str] = dataclasses.field(default_factory=list)
    seconds: float = 0.0

    @property
    def ok(self) -> bool:
        return all(p.ok for p in self.programs)

    @property
    def peak_bytes(self) -> int:
        return max((p.step_bytes for p in self.programs), default=0)

    @property
    def fits(self) -> bool:
        """False where the peak exceeds the device's memory or libtpu found a program too big for it
        (CompileTimeHbmOom: that program's peak is then only known from below)."""
        return self.peak_bytes <= self.device_memory_bytes and not any(
            p.error and _OUT_OF_MEMORY in p.error for p in self.programs)

    @property
    def headroom_bytes(self) -> int:
        return self.device_memory_bytes - self.peak_bytes

    @property
    def flops(self) -> float:
        return sum(p.flops for p in self.programs)

    @property
    def bytes_accessed(self) -> float:
        return sum(p.bytes_accessed for p in self.programs)

    @property
    def estimated_seconds(self) -> float | None:
        """Sum over the programs, None when the cost model cannot time one of them."""
        times = [p.estimated_seconds for p in self.programs]
        return None if not times or any(t is None for t in times) else sum(times)

    def __str__(self) -> str:
        rows = [("program", "status", "GFLOP", "MB accessed", "est. ms", "args MB", "out MB", "temp MB",
                 "live MB", "peak MB", "mosaic")]
        for p in self.programs:
            rows.append((p.name, "ok" if p.ok else "FAILED", f"{p.flops / 1e9:.3f}", _mb(p.bytes_accessed),
                         "?" if p.estimated_seconds is None else f"{p.estimated_seconds * 1e3:.3f}",
                         _mb(p.argument_bytes), _mb(p.output_bytes), _mb(p.temp_bytes), _mb(p.live_bytes),
                         _mb(p.step_bytes), str(p.mosaic_kernels)))
        widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
        lines = [f"torch_tpu.aot: {len(self.programs)} program(s) for {self.topology} ({self.device_kind}), "
                 f"{'all compile' if self.ok else 'SOME FAIL'}, {self.seconds:.1f} s"]
        for i, r in enumerate(rows):
            lines.append("  ".join(c.ljust(w) if j == 0 else c.rjust(w) for j, (c, w) in enumerate(zip(r, widths))))
            if i == 0:
                lines.append("  ".join("-" * w for w in widths))
        est = self.estimated_seconds
        verdict = "fits" if self.fits else "DOES NOT FIT"
        lines.append(f"peak {_gib(self.peak_bytes)} of {_gib(self.device_memory_bytes)} per device: {verdict} "
                     f"({'headroom' if self.fits else 'short by'} {_gib(abs(self.headroom_bytes))}); "
                     f"{self.flops / 1e9:.3f} GFLOP, "
                     f"est. {'unknown' if est is None else f'{est * 1e3:.3f} ms'} per step")
        for p in self.programs:
            if p.error:
                lines.append(f"{p.name}: {p.error}")
        if self.cached:
            lines.append("executables written to: " + ", ".join(self.cached))
        return "\n".join(lines)


def _mb(n: float) -> str:
    return f"{n / 1e6:.2f}"


def _gib(n: float) -> str:
    return f"{n / 2**30:.2f} GiB"
