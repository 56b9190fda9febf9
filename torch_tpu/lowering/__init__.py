"""StableHLO lowerings of ATen ops, grouped by op family; importing fills `registry.REGISTRY`."""
from . import elementwise  # noqa: F401
