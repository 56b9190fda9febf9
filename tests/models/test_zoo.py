"""The model zoo's CI slice: one row per architecture kind that the whole table
(`python -m tests.models.report`) covers, each trained on tpu and compared with CPU (runner.py).

GPT-2 in all three modes (attention, layer norm, tied embeddings; fused eager; one compiled
graph), Llama strict (rotary embeddings, grouped-query attention, RMSNorm), ResNet-18 strict
(convolutions, batch norm's running statistics), and GPT-2's generate() with its KV cache in eager
and with a static cache compiled.
"""
import pytest

transformers = pytest.importorskip("transformers")
pytest.importorskip("timm")

from models import runner, zoo  # noqa: E402

_references = {}


def _reference(name):
    if name not in _references:
        _references[name] = runner.cpu_reference(zoo.BY_NAME[name], timed_steps=0)
    return _references[name]


def _assert_pass(result):
    assert result.status == "pass", f"{result.model} {result.mode}: {result.status}: {result.detail}"


@pytest.mark.parametrize("name,mode", [("gpt2", "strict"), ("gpt2", "fused"), ("gpt2", "compiled"),
                                       ("llama", "strict"), ("resnet18", "strict")])
@pytest.mark.multiprocess
@pytest.mark.slow
def test_training_matches_cpu(name, mode):
    _assert_pass(runner.run(zoo.BY_NAME[name], mode, _reference(name), timed_steps=0))


@pytest.mark.parametrize("compiled", [False, True], ids=["kv_cache_eager", "static_cache_compiled"])
@pytest.mark.multiprocess
def test_generate_matches_cpu(compiled):
    base, inputs = _reference("gpt2")[:2]
    _assert_pass(runner.generate(zoo.BY_NAME["gpt2"], base, inputs, compiled))
