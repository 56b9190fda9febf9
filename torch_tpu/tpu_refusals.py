"""What TPU's compiler cannot build, found in a program's StableHLO text before libtpu sees it.

One check at the compile boundary, for every front-end (eager ops, fused runs, compiled graphs,
kernels): on a TPU (runtime.compile), for a compile-only TPU target (torch_tpu.aot) and in shadow
mode; the TPU entry of the plugin table (plugins.py, `refusal`) names it. Two kinds of program are refused:
- ops TPU's compiler rejects, with a message naming the op and dtype and what to do instead (libtpu's
  own message is terse: "Unexpected operand type for FFT: c128"): 64-bit FFTs, and matrix products
  (dot_general, convolution) of int64 (found by shadow mode over the test suite), dots with the
  explicit algorithm F32_F32_F32, and collective_broadcast (libtpu: "not implemented on TPU");
- collectives whose replica groups name devices the program does not have: libtpu answers with an
  internal check ("RET_CHECK failure ... device_id < kMaxDeviceCount", libtpu 0.0.52 on an
  all_reduce) or aborts (a failed CHECK, "id < CoreCount"), naming no op of the user's. Every
  program is compiled for one replica and one partition (pjrt::default_compile_options), so any
  device id above 0 is out of range.
"""
from __future__ import annotations

import re

# stablehlo.fft with a 64-bit operand or result: XLA's TPU backend has FFTs of complex64 only
# (libtpu 0.0.51/0.0.52: "Unexpected operand type for FFT: c128"; float64 RFFT produces complex128).
_FFT = re.compile(r'"stablehlo\.fft"\(.*?\{.*?fft_type = #stablehlo<fft_type (\w+)>.*?\} : \((.*)$', re.M)
# Matrix products of 64-bit integers: libtpu 0.0.52 rejects them ("While rewriting computation to not
# contain X64 element types, XLA encountered an HLO for which this rewriting is not implemented").
_INT64_PRODUCT = re.compile(r'"stablehlo\.(dot_general|dot|convolution)".* : \(([^)]*)\) ->', re.M)
_INT64 = re.compile(r"(?:tensor<(?:\d+x)*u?i64>)")
# A dot with the explicit algorithm F32_F32_F32 (float32 operands, one pass, float32 accumulation):
# libtpu 0.0.52 has none ("Dot algorithm ALG_DOT_F32_F32_F32 is not supported"). Tokamax's XLA
# attention asks for it on float32 inputs, lowered for any platform (found by shadow mode).
_F32_DOT_ALGORITHM = re.compile(r"algorithm = (?:#stablehlo\.dot_algorithm)?<lhs_precision_type = f32, "
                                r"rhs_precision_type = f32, accumulation_type = f32, lhs_component_count = 1, "
                                r"rhs_component_count = 1, num_primitive_operations = 1")
_COLLECTIVE = re.compile(r'"stablehlo\.(all_reduce|all_gather|reduce_scatter|all_to_all|collective_permute|'
                         r'collective_broadcast)"')
# A collective's groups follow its name, after its reduction region where it has one (several lines).
_GROUPS = re.compile(r"(?:replica_groups|source_target_pairs) = dense<([^>]*)>")


def refusal(text: str, num_devices: int = 1) -> str | None:
    """Why TPU's compiler must not be given `text` (StableHLO, generic syntax as the builder prints
    it, one op per line), or None. `num_devices` is the replicas x partitions it is compiled for."""
    for m in _FFT.finditer(text):
        kind, types = m.group(1), m.group(2)
        if "complex<f64>" in types or "xf64>" in types or "tensor<f64>" in types:
            dtype = "complex128" if kind != "RFFT" else "float64 (its result is complex128)"
            return (f"stablehlo.fft ({kind}) on {dtype} cannot run on TPU: TPU's FFT computes complex64 only. "
                    "Transform in complex64/float32 (x.to(torch.complex64)), or run this FFT on the CPU (x.cpu()).")
    for m in _INT64_PRODUCT.finditer(text):
        if _INT64.search(m.group(2)):
            return (f"stablehlo.{m.group(1)} on int64 cannot run on TPU: TPU's compiler has no 64-bit integer "
                    "matrix products. Multiply in int32 (x.int()) or float32, or on the CPU (x.cpu()).")
    if _F32_DOT_ALGORITHM.search(text):
        return ("stablehlo.dot_general with dot algorithm F32_F32_F32 (float32 operands, float32 accumulation) cannot "
                "run on TPU (libtpu: \"ALG_DOT_F32_F32_F32 is not supported\"). It comes from a JAX kernel (Tokamax's "
                "XLA attention on float32 inputs asks for it): give its dots precision=jax.lax.Precision.HIGHEST or an "
                "algorithm TPU has (BF16_BF16_F32_X6: float32 accuracy) instead.")
    if '"stablehlo.collective_broadcast"' in text:
        return ("stablehlo.collective_broadcast cannot run on TPU (libtpu 0.0.52: \"HLO collective-broadcast is "
                "not implemented on TPU\"): broadcast as an all_reduce (sum) of the source's value and zeros "
                "on the other devices.")
    for g in _GROUPS.finditer(text):
        ids = [int(v) for v in re.findall(r"-?\d+", g.group(1))]
        bad = [i for i in ids if i >= num_devices]
        if bad:
            ops = _COLLECTIVE.findall(text, 0, g.start())
            op = ops[-1] if ops else "collective"
            return (f"stablehlo.{op} names device {bad[0]} in its replica groups, but the program is "
                    f"compiled for {num_devices} device(s): TPU's compiler cannot build it. Run "
                    "collectives through torch.distributed (tpu_dist) instead of inside a kernel.")
    return None
