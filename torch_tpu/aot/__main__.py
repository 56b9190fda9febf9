"""python -m torch_tpu.aot <file>: the shadow-mode reports that processes appended to <file>
(TORCH_TPU_SHADOW_REPORT), added up and printed (shadow.summarize)."""
import sys

from .shadow import summarize

if len(sys.argv) != 2:
    sys.exit("usage: python -m torch_tpu.aot <file written through TORCH_TPU_SHADOW_REPORT>")
print(summarize(sys.argv[1]))
