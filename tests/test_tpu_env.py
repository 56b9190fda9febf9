"""libtpu's per-process environment on a TPU VM from torchrun's (torch_tpu.distributed.tpu_env), and the
Cloud TPU slice table it stands on (torch_tpu.tpu_slices)."""
from __future__ import annotations

import os
import subprocess
import sys

import pytest

from torch_tpu import plugins
from torch_tpu.distributed import tpu_env, tpu_process_env
from torch_tpu.tpu_slices import chip_grid, parse_accelerator_type


def _addresses(hosts, n):
    return ",".join(f"{h}:{8476 + i}" for h in hosts for i in range(n))


# (accelerator type, hosts, LOCAL_WORLD_SIZE, LOCAL_RANK, RANK, keyword arguments) ->
# (TPU_PROCESS_BOUNDS, CLOUD_TPU_TASK_ID, TPU_PROCESS_PORT, TPU_PROCESS_ADDRESSES, TPU_VISIBLE_CHIPS).
# Each follows PyTorch/XLA's configure_topology: bounds = the chip grid (tpu7x: ",2" appended), task id =
# worker id * LOCAL_WORLD_SIZE + LOCAL_RANK, ports from 8476, the addresses host by host.
LAYOUTS = [
    # PyTorch/XLA's own test case: a 4-chip v5e host, process 0.
    ("v5litepod-4", None, 4, 0, 0, {}, ("2,2,1", "0", "8476", _addresses(["localhost"], 4), "0")),
    ("v5litepod-8", None, 8, 5, 5, {}, ("2,4,1", "5", "8481", _addresses(["localhost"], 8), "5")),
    ("v5litepod-16", ["10.0.0.1", "10.0.0.2"], 8, 2, 10, {},
     ("4,4,1", "10", "8478", _addresses(["10.0.0.1", "10.0.0.2"], 8), "2")),
    ("v5litepod-8", None, 8, 1, 1, {"topology": "4x2"}, ("4,2,1", "1", "8477", _addresses(["localhost"], 8), "1")),
    # v4 and v5p count TensorCores: v4-8 is 4 chips, one megacore device each.
    ("v4-8", None, 4, 3, 3, {}, ("2,2,1", "3", "8479", _addresses(["localhost"], 4), "3")),
    ("v4-16", "h0,h1", 4, 1, 5, {}, ("2,2,2", "5", "8477", _addresses(["h0", "h1"], 4), "1")),
    ("v4-32", "a,b,c,d", 4, 0, 12, {}, ("2,2,4", "12", "8476", _addresses(["a", "b", "c", "d"], 4), "0")),
    # The TPU worker id, where torchrun's node rank differs from it, names the process's slot.
    ("v4-16", "h0,h1", 4, 1, 1, {"worker_id": 1}, ("2,2,2", "5", "8477", _addresses(["h0", "h1"], 4), "1")),
    ("v5p-8", None, 4, 2, 2, {}, ("2,2,1", "2", "8478", _addresses(["localhost"], 4), "2")),
    ("v6e-8", None, 8, 7, 7, {}, ("2,4,1", "7", "8483", _addresses(["localhost"], 8), "7")),
    ("v6e-1", None, 1, 0, 0, {}, ("1,1,1", "0", "8476", "localhost:8476", "0")),
    # tpu7x: two devices per chip, so 8 processes on a 4-chip host, and a trailing ",2".
    ("tpu7x-8", None, 8, 5, 5, {}, ("2,2,1,2", "5", "8481", _addresses(["localhost"], 8), "5")),
]


@pytest.mark.parametrize("acc,hosts,lws,local,rank,kw,want", LAYOUTS,
                         ids=[f"{layout[0]}-{layout[4]}{'-' + '-'.join(layout[5]) if layout[5] else ''}"
                              for layout in LAYOUTS])
def test_process_environment_per_generation_and_layout(acc, hosts, lws, local, rank, kw, want):
    nhosts = len(hosts.split(",") if isinstance(hosts, str) else hosts or [None])
    env = tpu_process_env(local, lws, rank, lws * nhosts, acc, hosts, **kw)
    assert env == {"TPU_CHIPS_PER_PROCESS_BOUNDS": "1,1,1", "TPU_PROCESS_BOUNDS": want[0], "CLOUD_TPU_TASK_ID": want[1],
                   "TPU_PROCESS_PORT": want[2], "TPU_PROCESS_ADDRESSES": want[3], "TPU_VISIBLE_CHIPS": want[4]}


def test_slice_table():
    assert [chip_grid(*parse_accelerator_type(a)) for a in ("v5litepod-16", "v4-256", "v5p-16", "tpu7x-16")] == \
        [(4, 4, 1), (4, 4, 8), (2, 2, 2), (2, 2, 2)]
    with pytest.raises(ValueError, match="unknown TPU accelerator type 'v9-8'"):
        parse_accelerator_type("v9-8")
    with pytest.raises(ValueError, match="does not describe 8 chips"):
        chip_grid(*parse_accelerator_type("v6e-8"), topology="4x4")


def test_processes_that_do_not_match_the_slice_are_refused_with_the_launch_to_use():
    with pytest.raises(ValueError, match=r"8 chips \(8 devices\) on 1 host.*--nnodes 1 --nproc_per_node 8"):
        tpu_process_env(0, 4, 0, 4, "v5litepod-8", None)
    with pytest.raises(ValueError, match=r"--nnodes 2 --nproc_per_node 4"):
        tpu_process_env(0, 8, 0, 8, "v4-16", "h0,h1")
    with pytest.raises(ValueError, match="out of range"):
        tpu_process_env(4, 4, 4, 4, "v4-8", None)


def _torchrun_env(**more):
    return {"LOCAL_RANK": "1", "LOCAL_WORLD_SIZE": "4", "RANK": "5", "WORLD_SIZE": "8", **more}


def test_configure_process_keeps_what_the_user_set_and_reads_the_vm_metadata():
    env = _torchrun_env(TPU_ACCELERATOR_TYPE="v4-16", TPU_WORKER_HOSTNAMES="h0,h1", TPU_PROCESS_PORT="9000")
    set_now = tpu_env.configure_process(env, fetch=lambda key: pytest.fail(f"asked the metadata server for {key}"))
    assert env["TPU_PROCESS_PORT"] == "9000" and "TPU_PROCESS_PORT" not in set_now
    assert env["CLOUD_TPU_TASK_ID"] == "5" and env["TPU_VISIBLE_CHIPS"] == "1" and env["TPU_PROCESS_BOUNDS"] == "2,2,2"

    # Without the variables, the VM's metadata says the slice (as on a TPU VM).
    answers = {"accelerator-type": "v4-16\n", "worker-network-endpoints": "w-0:uid0:10.0.0.1,w-1:uid1:10.0.0.2",
               "tpu-env": "ACCELERATOR_TYPE: 'v4-16'\nTOPOLOGY: '2x2x2'\nWORKER_ID: '1'\n"}
    env = _torchrun_env()
    tpu_env.configure_process(env, fetch=answers.__getitem__)
    assert env["TPU_PROCESS_ADDRESSES"] == _addresses(["10.0.0.1", "10.0.0.2"], 4)
    assert env["TPU_PROCESS_BOUNDS"] == "2,2,2" and env["CLOUD_TPU_TASK_ID"] == "5"

    def offline(key):
        raise OSError("unreachable")
    with pytest.raises(ValueError, match="set TPU_ACCELERATOR_TYPE"):
        tpu_env.configure_process(_torchrun_env(), fetch=offline)


def test_single_process_and_user_bounds_are_left_alone():
    for env in ({"LOCAL_RANK": "0", "LOCAL_WORLD_SIZE": "1", "RANK": "0", "WORLD_SIZE": "1"},
                _torchrun_env(TPU_PROCESS_BOUNDS="1,1,1", TPU_VISIBLE_CHIPS="0,1"), {}):
        before = dict(env)
        assert tpu_env.configure_process(env, fetch=lambda key: pytest.fail(key)) == {}
        assert env == before


@pytest.mark.skipif(not plugins.TPU.find(), reason="libtpu is not installed (pip install 'torch_tpu[tpu]')")
@pytest.mark.multiprocess
def test_torch_tpu_sets_them_before_libtpu_starts():
    # libtpu as the running plugin, under torchrun's variables: importing torch_tpu sets the process's
    # environment (nothing starts: there is no chip here).
    base = {k: v for k, v in os.environ.items() if not k.startswith(("TPU_", "CLOUD_TPU"))}
    env = {**base, **_torchrun_env(), "TORCH_TPU_PJRT_PLUGIN": "tpu", "TPU_ACCELERATOR_TYPE": "v5litepod-8",
           "TPU_WORKER_HOSTNAMES": "localhost", "TPU_SKIP_MDS_QUERY": "1"}
    code = ("import os, torch, torch_tpu\n"
            "print(os.environ['TPU_VISIBLE_CHIPS'], os.environ['TPU_PROCESS_BOUNDS'], os.environ['CLOUD_TPU_TASK_ID'])")
    r = subprocess.run([sys.executable, "-c", code], env={**env, "LOCAL_WORLD_SIZE": "8", "RANK": "1"},
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0 and r.stdout.split() == ["1", "2,4,1", "1"], r.stderr[-2000:]
    # A job whose processes do not match the slice fails at the device's first use, saying why.
    code = "import torch, torch_tpu\ntorch.empty(1, device='tpu')"
    r = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert r.returncode != 0 and "--nproc_per_node 8" in r.stderr, r.stderr[-2000:]
