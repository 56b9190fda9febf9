"""torch_tpu/plugins.py: one entry per PJRT plugin kind, and the choice TORCH_TPU_PJRT_PLUGIN makes
among them (issue 54: adding a plugin is one entry)."""
import os

import pytest

from torch_tpu import compile_cache, plugins


def test_every_kind_is_described_and_found_by_its_name(monkeypatch):
    assert [k.name for k in plugins.KINDS] == ["tpu", "cuda", "cpu"]  # the automatic choice's order
    for k in plugins.KINDS:
        assert k.package and k.platforms and all(f.startswith("--xla_") for f in k.xla_flags)
    monkeypatch.setenv("TORCH_TPU_PJRT_PLUGIN", "cpu")
    path, error = plugins.resolve()
    assert error == "" and path == plugins.CPU.find() and plugins.kind_of(path) is plugins.CPU


def test_a_named_kind_that_is_not_installed_says_what_to_install(monkeypatch):
    monkeypatch.setattr(plugins, "CUDA", plugins.Plugin("cuda", "jax-cuda13-pjrt", lambda: None, lambda: False,
                                                        ("cuda", "gpu")))
    monkeypatch.setattr(plugins, "KINDS", (plugins.TPU, plugins.CUDA, plugins.CPU))
    monkeypatch.setenv("TORCH_TPU_PJRT_PLUGIN", "cuda")
    path, error = plugins.resolve()
    assert path == "" and "pip install jax-cuda13-pjrt" in error and "TORCH_TPU_PJRT_PLUGIN" in error


def test_a_path_is_taken_as_it_is_and_is_no_kind(monkeypatch, tmp_path):
    so = tmp_path / "my_plugin.so"
    monkeypatch.setenv("TORCH_TPU_PJRT_PLUGIN", str(so))
    assert plugins.resolve() == (str(so), "")
    assert plugins.kind_of(str(so)) is None and plugins.kind_of("") is None
    # the CPU plugin is known by its file name wherever it lies
    assert plugins.kind_of(str(tmp_path / "xla_cpu_pjrt.so")) is plugins.CPU


def test_unset_picks_the_first_kind_whose_hardware_and_plugin_are_here(monkeypatch):
    monkeypatch.delenv("TORCH_TPU_PJRT_PLUGIN", raising=False)
    fake_tpu = plugins.Plugin("tpu", "libtpu", lambda: "/opt/libtpu.so", lambda: True, ("tpu",), keyed_by_path=False)
    absent = plugins.Plugin("cuda", "jax-cuda13-pjrt", lambda: "/opt/cuda.so", lambda: False, ("cuda", "gpu"))
    monkeypatch.setattr(plugins, "KINDS", (fake_tpu, absent, plugins.CPU))
    assert plugins.resolve() == ("/opt/libtpu.so", "")
    monkeypatch.setattr(plugins, "KINDS", (absent, plugins.CPU))
    assert plugins.resolve() == (plugins.CPU.find(), "")


def test_platform_names_and_executable_keys():
    assert plugins.for_platform("gpu") is plugins.CUDA and plugins.for_platform("CUDA") is plugins.CUDA
    assert plugins.for_platform("cpu") is plugins.CPU and plugins.for_platform("tpu") is plugins.TPU
    assert plugins.for_platform("metal") is None
    # libtpu's executables are keyed by its version, not its file (aot's keys are the TPU VM's);
    # the others, and unknown platforms, by the plugin's file too
    args = ("v", (0, 90))
    key = compile_cache.target_identity
    assert key("tpu", *args, "/a/libtpu.so") == key("tpu", *args, "/b/libtpu.so")
    for name in ("cpu", "cuda", "metal"):
        assert key(name, *args, "/a/x.so") != key(name, *args, "/b/x.so")


def test_own_xla_flags_are_added_once_kept_out_of_keys_and_a_users_setting_wins(monkeypatch):
    monkeypatch.setenv("XLA_FLAGS", "--xla_cpu_use_xnnpack=true --xla_foo=1")
    assert plugins.CPU.prepare()[0][0] == "cpu_device_count"
    flags = os.environ["XLA_FLAGS"].split()
    assert plugins.CPU_NAN_MIN_MAX in flags and plugins.NO_XNNPACK not in flags  # the user's xnnpack kept
    plugins.CPU.prepare()
    assert os.environ["XLA_FLAGS"].split().count(plugins.CPU_NAN_MIN_MAX) == 1
    assert plugins.keyed_xla_flags() == "--xla_cpu_use_xnnpack=true --xla_foo=1"


def test_a_bad_device_count_makes_the_cpu_plugin_unusable_with_its_message(monkeypatch):
    monkeypatch.setenv("TORCH_TPU_CPU_DEVICE_COUNT", "zero")
    with pytest.raises(ValueError, match="TORCH_TPU_CPU_DEVICE_COUNT must be a positive integer"):
        plugins.CPU.prepare()
