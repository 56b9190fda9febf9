#!/usr/bin/env bash
# CI: torch_tpu as a user installs it, beside the editable install the test suite runs. Builds a
# wheel from a copy of the tree (the editable install's in-tree build/ and _C.so stay out of it),
# checks that it holds every module of the tree, installs it into a fresh venv (torch pinned) and,
# from outside the tree, runs `import torch` (which must autoload torch_tpu) and an op on tpu.
# Usage: .ci/check_wheel.sh [PYTHON] -- PYTHON builds the wheel and must have requirements-build.txt
# installed (default: a temporary venv gets them).
set -euo pipefail
repo="$(cd "$(dirname "$0")/.." && pwd)"
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
start=$SECONDS

# Tracked and untracked-but-not-ignored files: what a clean checkout (plus uncommitted work) holds.
mkdir "$tmp/src"
(cd "$repo" && git ls-files -z --cached --others --exclude-standard \
  | tar --null -T - --ignore-failed-read -cf - 2>/dev/null) | tar -xf - -C "$tmp/src"

py="${1:-}"
if [ -z "$py" ]; then
  python3 -m venv "$tmp/build-venv"
  py="$tmp/build-venv/bin/python"
  "$py" -m pip install -qq -r "$repo/requirements-build.txt"
fi
"$py" -m pip wheel -qq --no-build-isolation --no-deps -w "$tmp/dist" "$tmp/src"
wheel=("$tmp"/dist/torch_tpu-*.whl)
echo "check_wheel: built $(basename "${wheel[0]}") in $((SECONDS - start)) s"

# Every Python module of the source (and the autoload entry point) is in the wheel.
"$py" - "${wheel[0]}" "$tmp/src" <<'EOF'
import os, sys, zipfile
names = set(zipfile.ZipFile(sys.argv[1]).namelist())
src = sys.argv[2]
want = {"_torch_tpu_autoload.py"}
for d, subdirs, files in os.walk(os.path.join(src, "torch_tpu")):
    want |= {os.path.relpath(os.path.join(d, f), src).replace(os.sep, "/") for f in files if f.endswith(".py")}
missing = sorted(want - names)
assert not missing, f"modules missing from the wheel: {missing}"
assert any(n.startswith("torch_tpu/_C.") and n.endswith(".so") for n in names), "no torch_tpu/_C extension in the wheel"
EOF

python3 -m venv "$tmp/venv"
"$tmp/venv/bin/pip" install -qq "${wheel[0]}" "torch==2.13.0"
cd "$tmp"  # not the source tree: what is imported is what the wheel installed
env -u TORCH_DEVICE_BACKEND_AUTOLOAD "$tmp/venv/bin/python" - "$tmp/venv" <<'EOF'
import sys
import torch
assert "torch_tpu" in sys.modules, "import torch did not autoload torch_tpu"
import torch_tpu
assert torch_tpu.__file__.startswith(sys.argv[1]), torch_tpu.__file__
y = (torch.ones(3, device="tpu") * 2).cpu()
assert torch.equal(y, torch.full((3,), 2.0)), y
print(f"check_wheel: torch {torch.__version__}, torch_tpu {torch_tpu.__version__} from the wheel, tpu op ok")
EOF
echo "check_wheel: passed in $((SECONDS - start)) s"
