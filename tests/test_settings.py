"""torch_tpu/settings.py declares every environment variable torch_tpu reads; the code reads no
other TORCH_TPU_ variable, Python reads them only through settings, and the README's table lists
every one."""
import glob
import os
import re

from torch_tpu import settings

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
DECLARED = {s.name for s in settings.SETTINGS}


def _files(*patterns):
    for pattern in patterns:
        for p in glob.glob(os.path.join(ROOT, pattern), recursive=True):
            with open(p) as f:
                yield os.path.relpath(p, ROOT), f.read()


def test_every_torch_tpu_variable_named_in_the_code_is_declared():
    named = {}
    for path, text in _files("torch_tpu/**/*.py", "csrc/**/*.cc", "csrc/**/*.h"):
        for name in re.findall(r"\bTORCH_TPU_[A-Z0-9_]*[A-Z0-9]\b", text):
            named.setdefault(name, path)
    assert {n: p for n, p in named.items() if n not in DECLARED} == {}


def test_python_reads_variables_only_through_settings():
    names = r"[\"'](TORCH_TPU_\w+|TPU_LIBRARY_PATH|XLA_FLAGS|LIBTPU_INIT_ARGS|TPU_LAUNCH_BLOCKING)[\"']"
    # environ.get(...), getenv(...), environ[...] read (not assigned: the runtime sets XLA_FLAGS)
    reads = re.compile(r"(?:environ\.get\(|getenv\()\s*" + names + r"|environ\[\s*" + names + r"\s*\](?!\s*=[^=])")
    found = [(path, m) for path, text in _files("torch_tpu/**/*.py") if not path.endswith("settings.py")
             for m in reads.finditer(text)]
    assert found == []


def test_cpp_reads_the_variables_declared_as_read_by_cpp_with_the_same_defaults():
    from torch_tpu import _C
    cpp = {s.name: s.default for s in settings.SETTINGS if s.read_by == "C++"}
    assert dict(_C.runtime.cpp_settings()) == cpp  # csrc/runtime/settings.h's table
    # C++ reads them through its reader only: no getenv of a TORCH_TPU_ variable
    assert [(p, m) for p, text in _files("csrc/**/*.cc") for m in re.findall(r'getenv\("(TORCH_TPU_\w+)"\)', text)] == []
    read = {m for _, text in _files("csrc/**/*.cc")
            for m in re.findall(r'settings::(?:get|enabled|integer)\("(TORCH_TPU_\w+)"\)', text)}
    assert read == set(cpp)


def test_the_readme_table_lists_every_variable():
    with open(os.path.join(ROOT, "README.md")) as f:
        readme = f.read()
    section = readme.split("## Choosing the plugin and the mode", 1)[1].split("\n## ", 1)[0]
    rows = [line for line in section.splitlines() if line.startswith("| `")]
    listed = {m for row in rows for m in re.findall(r"`([A-Z][A-Z0-9_]+)(?:=[^`]*)?`", row.split(" | ")[0])}
    assert listed == DECLARED, (DECLARED - listed, listed - DECLARED)


def test_get_falls_back_to_the_declared_default_and_refuses_undeclared_names(monkeypatch):
    monkeypatch.delenv("TORCH_TPU_EAGER_MODE", raising=False)
    assert settings.get("TORCH_TPU_EAGER_MODE") == "strict"
    monkeypatch.setenv("TORCH_TPU_EAGER_MODE", "fused")
    assert settings.get("TORCH_TPU_EAGER_MODE") == "fused"
    try:
        settings.get("TORCH_TPU_NOT_A_SETTING")
    except KeyError:
        pass
    else:
        raise AssertionError("an undeclared variable must be a KeyError")
