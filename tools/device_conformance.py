"""PyTorch's own device-generic tests on tpu against CPU: what fails on tpu only, by kind.

    python tools/device_conformance.py PYTORCH_TEST_DIR [--files test_torch.py,test_nn.py]
        [--sample N] [--timeout S] [--seed K] [--json report.json] [-k EXPR]

PYTORCH_TEST_DIR is a directory holding PyTorch's test files (its `test/` folder) of the version
torch_tpu pins (torch 2.13.0): the test files are not part of torch_tpu and are never copied into it.
Each file's device-type tests (`instantiate_device_type_tests`) are collected for tpu
(PYTORCH_TESTING_DEVICE_ONLY_FOR=privateuse1; torch_tpu is loaded by PyTorch's device autoload) and
for CPU (=cpu); the tests both devices have (named alike but for the device: test_x_tpu_float32 and
test_x_cpu_float32) are run on each, or a deterministic sample of N of them (--sample, --seed).
Each test has --timeout seconds (SIGALRM; one that Python cannot interrupt is ended by a watchdog
at twice that, recorded as a timeout, and the file goes on with the tests after it).

Printed per file: tests run, passed / failed / timeouts / skipped on each device, and the failures
on tpu only (failed or timed out on tpu, passed on CPU) grouped by kind: the exception and the
first line of its message, with numbers left out, most frequent first, with one example test each.
--json writes every test's outcomes and kinds. Runs files one after another, each test process on
the whole machine; expect minutes per hundred tests (tpu compiles each new shape's programs).
"""
from __future__ import annotations

import argparse
import collections
import json
import os
import random
import re
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
DEFAULT_FILES = ["test_torch.py", "test_nn.py", "test_autograd.py", "test_binary_ufuncs.py", "test_unary_ufuncs.py",
                 "test_reductions.py", "test_type_promotion.py", "test_sort_and_select.py",
                 "test_tensor_creation_ops.py", "test_view_ops.py", "test_indexing.py", "test_shape_ops.py",
                 "test_ops.py"]
DEVICE_ENV = {"tpu": "privateuse1", "cpu": "cpu"}
# A device-type test's name carries its device: the class ends in TPU / PRIVATEUSE1 / CPU, the test
# name has _tpu / _privateuse1 / _cpu before its dtype suffix or at its end.
_CLASS_DEV = re.compile(r"(TPU|PRIVATEUSE1|CPU)(?=::)")
_TEST_DEV = re.compile(r"_(tpu|privateuse1|cpu)(?=_|$|\[)")


def device_free(node_id: str) -> str | None:
    """The test's id with its device left out (None for a test that is not device-type)."""
    if not _TEST_DEV.search(node_id) or not _CLASS_DEV.search(node_id):
        return None
    return _TEST_DEV.sub("_DEV", _CLASS_DEV.sub("DEV", node_id))


def kind_of(message: str) -> str:
    """A failure's kind: its first line with numbers, quoted names of tests' values and addresses
    left out, so that one cause read at many shapes or dtypes is one kind."""
    line = message.strip().splitlines()[0] if message.strip() else "?"
    line = re.sub(r"0x[0-9a-f]+", "ADDR", line)
    line = re.sub(r"\d+(\.\d+)?(e[-+]?\d+)?", "N", line)
    return line[:160]


def _env(device: str, out: str, timeout: float) -> dict:
    env = dict(os.environ, PYTORCH_TESTING_DEVICE_ONLY_FOR=DEVICE_ENV[device], CONFORMANCE_OUT=out,
               CONFORMANCE_TIMEOUT=str(timeout), TORCH_TPU_RECOMPILE_WARN="0")
    env["PYTHONPATH"] = os.pathsep.join([HERE] + ([env["PYTHONPATH"]] if env.get("PYTHONPATH") else []))
    return env


def collect(test_dir: str, path: str, device: str, k: str | None) -> list[str]:
    """The node ids pytest collects from `path` for `device`."""
    cmd = [sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider", path]
    if k:
        cmd += ["-k", k]
    r = subprocess.run(cmd, cwd=test_dir, env=_env(device, os.devnull, 60), capture_output=True, text=True,
                       timeout=1800)
    return [line.strip() for line in r.stdout.splitlines() if "::" in line and not line.startswith(" ")]


def run(test_dir: str, ids: list[str], device: str, timeout: float) -> dict:
    """Runs the node ids on `device`; {id: {"outcome", "kind", "seconds"}}. A process ended by the
    watchdog is started again for the tests it had not reached."""
    results: dict = {}
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "results.jsonl")
        todo = list(ids)
        while todo:
            args = os.path.join(tmp, "ids.txt")
            with open(args, "w") as f:
                f.write("\n".join(todo))
            cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "_conformance_plugin",
                   f"@{args}"]
            subprocess.run(cmd, cwd=test_dir, env=_env(device, out, timeout), capture_output=True, text=True,
                           timeout=max(600, 4 * timeout * len(todo)))
            if os.path.exists(out):
                with open(out) as f:
                    for line in f:
                        r = json.loads(line)
                        results[r["id"]] = r
            left = [i for i in todo if i not in results]
            if len(left) == len(todo):  # nothing ran (a collection error): say so for each
                for i in left:
                    results[i] = {"id": i, "outcome": "failed", "kind": "not run (collection or start-up failed)",
                                  "seconds": 0.0}
                break
            todo = left
    return results


def compare(tpu: dict, cpu: dict, pairs: list[tuple[str, str]]) -> dict:
    counts = {d: collections.Counter(r[i]["outcome"] for i in ids)
              for d, r, ids in (("tpu", tpu, [p[0] for p in pairs]), ("cpu", cpu, [p[1] for p in pairs]))}
    only = collections.defaultdict(list)
    for t, c in pairs:
        if tpu[t]["outcome"] in ("failed", "timeout") and cpu[c]["outcome"] == "passed":
            only[kind_of(tpu[t]["kind"])].append(t)
    return {"counts": counts, "tpu_only": only}


def report_file(name: str, pairs: list, result: dict) -> None:
    c = result["counts"]

    def line(d):
        n = c[d]
        return (f"{d}: {n['passed']} passed, {n['failed']} failed, {n['timeout']} timeouts, "
                f"{n['skipped'] + n['xfail']} skipped/expected failures")
    only = result["tpu_only"]
    print(f"\n{name}: {len(pairs)} tests\n  {line('tpu')}\n  {line('cpu')}")
    print(f"  tpu-only failures: {sum(len(v) for v in only.values())}")
    for kind, ids in sorted(only.items(), key=lambda kv: -len(kv[1])):
        print(f"    {len(ids):4d}  {kind}\n          e.g. {ids[0].split('::')[-1]}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("test_dir", help="a directory holding PyTorch's test files (of torch 2.13.0)")
    ap.add_argument("--files", default=",".join(DEFAULT_FILES))
    ap.add_argument("--sample", type=int, default=0, help="run N tests per file, drawn with --seed (0: all)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--timeout", type=float, default=60.0, help="seconds per test")
    ap.add_argument("-k", help="pytest's -k expression, applied to both devices")
    ap.add_argument("--json", help="write every test's outcome on both devices here")
    a = ap.parse_args()
    everything = {}
    for name in a.files.split(","):
        path = os.path.join(a.test_dir, name)
        if not os.path.exists(path):
            print(f"\n{name}: not in {a.test_dir}")
            continue
        tpu_ids = {device_free(i): i for i in collect(a.test_dir, name, "tpu", a.k) if device_free(i)}
        cpu_ids = {device_free(i): i for i in collect(a.test_dir, name, "cpu", a.k) if device_free(i)}
        common = sorted(set(tpu_ids) & set(cpu_ids))
        if a.sample and len(common) > a.sample:
            common = sorted(random.Random(a.seed).sample(common, a.sample))
        pairs = [(tpu_ids[k], cpu_ids[k]) for k in common]
        if not pairs:
            print(f"\n{name}: no device-type tests collected for both tpu and cpu")
            continue
        tpu = run(a.test_dir, [p[0] for p in pairs], "tpu", a.timeout)
        cpu = run(a.test_dir, [p[1] for p in pairs], "cpu", a.timeout)
        result = compare(tpu, cpu, pairs)
        report_file(name, pairs, result)
        everything[name] = {"pairs": pairs, "tpu": tpu, "cpu": cpu,
                            "tpu_only": {k: v for k, v in result["tpu_only"].items()}}
    if a.json:
        with open(a.json, "w") as f:
            json.dump(everything, f, indent=1)


if __name__ == "__main__":
    main()
