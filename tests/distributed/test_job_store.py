"""A torchrun job's PJRT client gets the job's store behind its key-value callbacks (the CPU plugin
ignores them; libtpu's and the CUDA plugin's processes find each other through them)."""
from __future__ import annotations

import textwrap

import pytest
from torch_tpu import _C

from .runner import run_torchrun

pytestmark = pytest.mark.multiprocess  # every test here starts processes

JOB = textwrap.dedent("""
    import os, torch, torch_tpu
    from torch_tpu import _C

    torch.ones(1, device="tpu").cpu()  # the client starts
    kv = _C.distributed.KeyValueCallbacks.of_runtime()
    assert kv is not None, "torchrun's store is not behind the client's callbacks"
    rank = int(os.environ["RANK"])
    # Through the C callbacks a plugin calls: what one process puts, the other gets (bytes, zeros kept).
    if rank == 0:
        kv.put("greeting", b"from rank 0\\x00with a zero byte")
        assert kv.get("reply", 60000) == b"from rank 1"
    else:
        assert kv.get("greeting", 60000) == b"from rank 0\\x00with a zero byte"
        kv.put("reply", b"from rank 1")
    assert kv.try_get("reply") == b"from rank 1"
    assert kv.try_get("never put") is None
    try:
        kv.get("never put", 300)
        raise SystemExit("get did not time out")
    except RuntimeError as e:
        assert "no value for 'never put' within 300 ms" in str(e), e
    open(os.path.join(os.path.dirname(os.path.abspath(__file__)), f"exchanged{rank}"), "w").close()
""")


@pytest.mark.slow
def test_torchrun_store_backs_the_clients_key_value_callbacks(tmp_path):
    script = tmp_path / "job.py"
    script.write_text(JOB)
    out = run_torchrun(["--nproc_per_node", "2", str(script)], timeout=180)
    assert (tmp_path / "exchanged0").exists() and (tmp_path / "exchanged1").exists(), out[-3000:]


def test_a_single_process_client_has_no_store():
    import torch
    torch.ones(1, device="tpu").cpu()
    assert _C.distributed.KeyValueCallbacks.of_runtime() is None
