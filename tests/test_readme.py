"""Every Python snippet of README.md runs as a user copies it, in the environment the README's test
command installs (issue 52: a snippet used an undefined name and one's cache path made a folder at the
filesystem root).

Snippets are read from the README itself, so an edited snippet is tested as edited. A snippet that
continues the reader's own code (`model = torch.compile(model, ...)`) gets the least context that makes
it run, from CONTEXT below, keyed by its first line; any other snippet runs exactly as written. Each
runs in a fresh interpreter in an empty temporary directory (relative paths stay there)."""
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

README = Path(__file__).resolve().parents[1] / "README.md"

_MODEL = """\
import torch, torch_tpu
import torch.nn.functional as F
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 4)).to("tpu")
opt = torch.optim.SGD(model.parameters(), lr=0.1)
x, y = torch.randn(8, 16, device="tpu"), torch.randint(0, 4, (8,), device="tpu")
"""

_ONE_PROCESS_GROUP = """\
import os, torch, torch_tpu
import torch.distributed as dist
os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(29500 + os.getpid() % 2000), RANK="0", WORLD_SIZE="1")
"""

# first line of a snippet -> (code before it, code after it that checks what it did, one run per line?)
CONTEXT = {
    'model = torch.compile(model, backend="tpu")': (
        _MODEL, "out = model(x)\nassert out.shape == (8, 4) and out.device.type == 'tpu'\n", False),
    "torch._dynamo.config.trace_autograd_ops = True": (
        _MODEL,
        "first = train_step(x, y).item()\nfor _ in range(3):\n    last = train_step(x, y).item()\n"
        "assert last < first, (first, last)\n", False),
    "from torch.profiler import profile, ProfilerActivity": (
        _MODEL, "import os\nassert os.path.getsize('trace.json') > 0\n", False),
    # Two alternatives, one per line: each is run on its own.
    'dist.init_process_group("tpu_dist")': (
        _ONE_PROCESS_GROUP,
        "t = torch.ones(3, device='tpu')\ndist.all_reduce(t)\nassert t.cpu().tolist() == [1.0, 1.0, 1.0]\n"
        "dist.destroy_process_group()\n", True),
    "import torch.distributed as dist": (
        "import torch\nfrom torch_tpu import aot\n", "assert report.programs[0].replicas == 4\n", False),
}


def python_snippets():
    """(first line number, code) of each ```python block of the README, dedented."""
    lines = README.read_text().splitlines()
    out, start = [], None
    for i, line in enumerate(lines, 1):
        fence = line.strip()
        if start is None and fence == "```python":
            start = i
        elif start is not None and fence == "```":
            out.append((start + 1, textwrap.dedent("\n".join(lines[start:i - 1])) + "\n"))
            start = None
    return out


def programs():
    """(test id, program) for every run: a snippet with its context, or one line of an alternatives snippet."""
    runs = []
    for line_no, code in python_snippets():
        first = code.strip().splitlines()[0]
        key = next((k for k in CONTEXT if first.startswith(k)), None)
        before, after, per_line = CONTEXT.get(key, ("", "", False))
        parts = [ln for ln in code.splitlines() if ln.strip() and not ln.lstrip().startswith("#")] if per_line else [code]
        for k, part in enumerate(parts):
            runs.append((f"README.md:{line_no}" + (f"+{k}" if per_line else ""), before + part + "\n" + after))
    return runs


RUNS = programs()


def test_every_snippet_is_found():
    # The README holds these; a snippet that disappears (or a fence this reader misses) fails here.
    firsts = [code.strip().splitlines()[0] for _, code in python_snippets()]
    assert len(firsts) >= 9, firsts
    for key in CONTEXT:  # a context whose snippet is gone is stale
        assert any(f.startswith(key) for f in firsts), key


@pytest.mark.parametrize("name,program", RUNS, ids=[r[0] for r in RUNS])
@pytest.mark.multiprocess
@pytest.mark.slow
def test_snippet_runs(name, program, tmp_path):
    env = {k: v for k, v in os.environ.items() if not k.startswith(("RANK", "WORLD_SIZE", "MASTER_", "LOCAL_"))}
    r = subprocess.run([sys.executable, "-c", program], cwd=tmp_path, env=env, capture_output=True, text=True,
                       timeout=600)
    assert r.returncode == 0, f"{name} failed:\n--- program\n{program}\n--- stderr\n{r.stderr[-4000:]}"
    # Quiet on a host without a TPU: libtpu, which JAX loads for the kernels snippet, probes for one.
    for noise in ("Failed to find host bounds", "INVALID_ARGUMENT", "Logging before InitGoogle"):
        assert noise not in r.stderr, f"{name} printed libtpu's probing:\n{r.stderr[-4000:]}"
