"""Installing torch_tpu: every subpackage is a real package (a wheel holds only those), and PyTorch's
device-backend autoloading never lets a broken torch_tpu take `import torch` down with it.

The autoload tests run `import torch` in a subprocess whose PYTHONPATH starts with a temp dir that
holds torch_tpu's metadata as pyproject.toml declares it (shadowing the installed one, which may
predate a change until reinstalled) and, for the broken case, a fake torch_tpu package that raises.
The wheel as users install it is checked end to end by .ci/check_wheel.sh.
"""
from __future__ import annotations

import os
import subprocess
import sys
import tomllib

import pytest

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), ".."))
AUTOLOAD_WARNING = "torch_tpu is installed but could not be loaded"


def test_every_folder_of_torch_tpu_is_a_package():
    """find_packages (setup.py) leaves out a folder without __init__.py, and so does the wheel."""
    from setuptools import find_packages

    folders = []
    for d, subdirs, _ in os.walk(os.path.join(ROOT, "torch_tpu")):
        subdirs[:] = [s for s in subdirs if s != "__pycache__"]
        folders.append(os.path.relpath(d, ROOT).replace(os.sep, "."))
    missing = [f for f in folders if not os.path.exists(os.path.join(ROOT, *f.split("."), "__init__.py"))]
    assert not missing, f"folders without __init__.py (left out of the wheel): {missing}"
    assert sorted(find_packages(ROOT, include=["torch_tpu", "torch_tpu.*"])) == sorted(folders)


def _metadata(tmp_path):
    """torch_tpu's dist-info as pyproject.toml declares it: importlib.metadata takes the first one
    on sys.path, so this one decides which entry points `import torch` runs."""
    eps = tomllib.load(open(os.path.join(ROOT, "pyproject.toml"), "rb"))["project"]["entry-points"]
    assert eps["torch.backends"]["torch_tpu"].startswith("_torch_tpu_autoload:")
    dist = tmp_path / "torch_tpu-0.1.0.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: torch_tpu\nVersion: 0.1.0\n")
    (dist / "entry_points.txt").write_text("".join(
        f"[{group}]\n" + "".join(f"{k} = {v}\n" for k, v in items.items()) for group, items in eps.items()))


def _run(prog, tmp_path):
    env = {k: v for k, v in os.environ.items() if k != "TORCH_DEVICE_BACKEND_AUTOLOAD"}  # on: the default
    env["PYTHONPATH"] = os.pathsep.join([str(tmp_path), ROOT])  # ROOT: this checkout's _torch_tpu_autoload
    return subprocess.run([sys.executable, "-c", prog], capture_output=True, text=True, env=env,
                          cwd=str(tmp_path), timeout=300)


BROKEN = {
    # as in the wheel without torch_tpu/eager: torch_tpu's own `import torch` done, a later line fails
    "after_import_torch": "import torch\nraise ImportError('simulated: no torch_tpu.eager')\n",
    "before_import_torch": "raise RuntimeError('simulated broken install')\n",
}


def _broken(tmp_path, kind):
    _metadata(tmp_path)
    pkg = tmp_path / "torch_tpu"
    pkg.mkdir()
    (pkg / "__init__.py").write_text(BROKEN[kind])


@pytest.mark.parametrize("kind", sorted(BROKEN))
@pytest.mark.multiprocess
def test_broken_torch_tpu_leaves_import_torch_working(tmp_path, kind):
    _broken(tmp_path, kind)
    r = _run("import torch\nprint((torch.ones(2) + 1).tolist())\n", tmp_path)
    assert r.returncode == 0, r.stderr[-3000:]
    assert r.stdout.strip().splitlines()[-1] == "[2.0, 2.0]"
    assert AUTOLOAD_WARNING in r.stderr  # names the cause and what to do
    cause = "ImportError: simulated: no torch_tpu.eager" if kind == "after_import_torch" \
        else "RuntimeError: simulated broken install"
    assert cause in r.stderr and "TORCH_DEVICE_BACKEND_AUTOLOAD=0" in r.stderr and "reinstall" in r.stderr


@pytest.mark.multiprocess
def test_broken_torch_tpu_imported_first_raises_its_own_error(tmp_path):
    """`import torch_tpu` first: torch's autoload finds the partial torch_tpu and leaves it alone (no
    recursion, no second warning); the user's own import then raises torch_tpu's real error."""
    _broken(tmp_path, "after_import_torch")
    r = _run("import torch_tpu\n", tmp_path)
    assert r.returncode == 1
    assert "ImportError: simulated: no torch_tpu.eager" in r.stderr
    assert "Recursion" not in r.stderr and "Failed to load the backend extension" not in r.stderr
    assert AUTOLOAD_WARNING not in r.stderr


@pytest.mark.multiprocess
def test_an_import_that_failed_part_way_is_named_on_the_next_import():
    """This checkout's torch_tpu failing past the device's registration (a bad TORCH_TPU_EAGER_MODE):
    importing it again raises an ImportError that points at the first error, not PyTorch's "already
    registered" about the half that the first import left."""
    env = dict(os.environ, TORCH_TPU_EAGER_MODE="bogus", TORCH_DEVICE_BACKEND_AUTOLOAD="0", PYTHONPATH=ROOT)
    prog = ("import torch\nfor i in range(2):\n    try:\n        import torch_tpu\n"
            "    except Exception as e:\n        print(i, type(e).__name__, e)\n")
    r = subprocess.run([sys.executable, "-c", prog], capture_output=True, text=True, env=env, timeout=300)
    first, second = r.stdout.strip().splitlines()
    assert first.startswith("0 ValueError TORCH_TPU_EAGER_MODE='bogus'"), r.stdout
    assert second.startswith("1 ImportError torch_tpu: its first import in this process failed part way"), r.stdout
    assert "already been registered" not in r.stdout + r.stderr


@pytest.mark.parametrize("first", ["torch", "torch_tpu"])
@pytest.mark.multiprocess
def test_import_torch_autoloads_torch_tpu(tmp_path, first):
    """Either import order gives a usable tpu device, through this checkout's entry point."""
    _metadata(tmp_path)
    prog = (f"import sys\nimport {first}\nimport torch\n"
            "assert 'torch_tpu' in sys.modules, 'not autoloaded'\n"
            "import os; entry = sys.modules['_torch_tpu_autoload']  # loaded by torch's autoload\n"
            f"assert os.path.dirname(entry.__file__) == {ROOT!r}, entry.__file__\n"
            "print((torch.ones(3, device='tpu') * 2).cpu().tolist())\n")
    r = _run(prog, tmp_path)
    assert r.returncode == 0, r.stderr[-3000:]
    assert r.stdout.strip().splitlines()[-1] == "[2.0, 2.0, 2.0]"
    assert AUTOLOAD_WARNING not in r.stderr


@pytest.mark.multiprocess
@pytest.mark.slow
def test_the_model_libraries_import_as_a_user_imports_them():
    """A user's script, with nothing of the tests' around it: `import torch` loads torch_tpu, whose
    torchvision integration lets torchvision's Python modules import where its compiled ops cannot
    load (PyPI's torchvision for this CPU torch is CUDA-built); timm and transformers' model classes
    then import and build (torch_tpu/integrations/torchvision.py)."""
    pytest.importorskip("torchvision")
    pytest.importorskip("timm")
    pytest.importorskip("transformers")
    code = ("import torch\n"
            "import torchvision, timm\n"
            "from transformers import GPT2Config, GPT2LMHeadModel\n"
            "m = timm.create_model('resnet18', pretrained=False).eval().to('tpu')\n"
            "y = m(torch.randn(1, 3, 32, 32, device='tpu'))\n"
            "g = GPT2LMHeadModel(GPT2Config(n_layer=1, n_embd=32, n_head=2, vocab_size=64))\n"
            "print(tuple(y.shape), type(g).__name__)\n")
    r = subprocess.run([sys.executable, "-W", "ignore", "-c", code], capture_output=True, text=True, timeout=300,
                       cwd=os.path.join(ROOT, "examples"))
    assert r.returncode == 0, r.stderr[-3000:]
    assert r.stdout.strip().splitlines()[-1] == "(1, 1000) GPT2LMHeadModel"
    # torchvision (or transformers) first: torch, and with it torch_tpu, loads inside torchvision's import
    for first in ("import torchvision", "import transformers, torchvision"):
        r = subprocess.run([sys.executable, "-W", "ignore", "-c", first + "; import timm; print('imported')"],
                           capture_output=True, text=True, timeout=300, cwd=os.path.join(ROOT, "examples"))
        assert r.returncode == 0 and r.stdout.strip().endswith("imported"), (first, r.stderr[-3000:])
