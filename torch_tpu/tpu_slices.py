"""Cloud TPU slices by name: accelerator types ("v5litepod-16"), topology names ("v5e:4x4"), chip grids.

One table for the facts torch_tpu needs about TPU generations, shared by the compile-only targets
(torch_tpu.aot) and the per-process environment of a TPU VM job (torch_tpu.distributed.tpu_env):
- An accelerator type is "<prefix>-<N>", where N counts chips (v5e, v6e) or TensorCores (v2-v4,
  v5p, tpu7x: two per chip), as Cloud TPU names them.
- devices per chip: what one chip shows a framework as devices: 1 (v4 and v5p run their two cores as
  one megacore device), 2 on tpu7x (and on v2/v3, whose cores are separate devices).
- A slice's chip grid: Cloud TPU's default shape for a chip count (2D for v5e/v6e, 3D tori for v4,
  v5p, tpu7x); a VM's TPU_TOPOLOGY (e.g. "4x4", "2x2x2") overrides it.
"""
from __future__ import annotations

import dataclasses
import math
import re


@dataclasses.dataclass(frozen=True)
class Generation:
    """topology: the name libtpu's topologies use ("v5e"); prefix: the accelerator type's ("v5litepod");
    cores_per_chip: what N of "<prefix>-<N>" counts per chip; devices_per_chip: devices a chip shows;
    dims: 2 or 3 (the chip grid's rank)."""
    topology: str
    prefix: str
    cores_per_chip: int
    devices_per_chip: int
    dims: int


GENERATIONS = {g.topology: g for g in (
    Generation("v2", "v2", 2, 2, 2), Generation("v3", "v3", 2, 2, 2), Generation("v4", "v4", 2, 1, 3),
    Generation("v5e", "v5litepod", 1, 1, 2), Generation("v5p", "v5p", 2, 1, 3), Generation("v6e", "v6e", 1, 1, 2),
    Generation("tpu7x", "tpu7x", 2, 2, 3))}
# Other spellings of accelerator-type prefixes seen on VMs.
_PREFIXES = {g.prefix: g for g in GENERATIONS.values()} | {"v5e": GENERATIONS["v5e"], "v6litepod": GENERATIONS["v6e"],
                                                            "v7x": GENERATIONS["tpu7x"]}


def accelerator_type(generation: str, chips: int) -> str:
    """Cloud TPU's accelerator type of `chips` chips of `generation` ("v5e", 16 -> "v5litepod-16")."""
    g = GENERATIONS.get(generation)
    return f"{g.prefix}-{chips * g.cores_per_chip}" if g else f"{generation}-{chips}"


def parse_accelerator_type(name: str) -> tuple[Generation, int]:
    """(generation, chips) of an accelerator type ("v5litepod-16" -> v5e, 16; "v4-8" -> v4, 4).
    Raises ValueError naming the known prefixes."""
    m = re.fullmatch(r"\s*([a-z0-9]+)-(\d+)\s*", name or "")
    g = _PREFIXES.get(m.group(1)) if m else None
    if g is None or int(m.group(2)) % g.cores_per_chip:
        raise ValueError(f"unknown TPU accelerator type {name!r}: expected '<type>-<count>' with type one of "
                         f"{sorted(_PREFIXES)} (e.g. 'v5litepod-16', 'v4-8', 'v5p-8', 'v6e-8', 'tpu7x-8')")
    return g, max(1, int(m.group(2)) // g.cores_per_chip)


def chip_grid(generation: Generation, chips: int, topology: str | None = None) -> tuple[int, int, int]:
    """The slice's chip grid as (x, y, z): `topology` ("4x4", "2x2x2") where given, else Cloud TPU's
    default shape for that many chips (the most square grid, the longer axes last, unit axes at the
    end: 8 chips of v5e are 2x4, 4 of v4 2x2x1, 16 of v4 2x2x4). Raises ValueError when `topology` does not hold `chips` chips."""
    if topology:
        dims = tuple(int(d) for d in re.findall(r"\d+", topology))
        if not dims or len(dims) > 3 or math.prod(dims) != chips:
            raise ValueError(f"TPU topology {topology!r} does not describe {chips} chips of {generation.topology}")
        return tuple(dims) + (1,) * (3 - len(dims))
    dims = [1] * generation.dims
    left, axis = chips, 0
    while left > 1:  # double the axes in turn from the first: 2x2x1, 2x2x2, 2x2x4, 2x4x4, 4x4x4 ...
        if left % 2:
            raise ValueError(f"{chips} chips of {generation.topology} have no default grid: set TPU_TOPOLOGY "
                             f"(e.g. '2x2x1')")
        dims[axis % generation.dims] *= 2
        left //= 2
        axis += 1
    grown = sorted(d for d in dims if d > 1)  # ascending, the unit axes last: 2x2x1, 2x4
    return tuple(grown) + (1,) * (3 - len(grown))
