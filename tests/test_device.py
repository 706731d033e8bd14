"""The one precision rule: ``auto`` depends on the kind of device only, never on the CPU model."""

from __future__ import annotations

import pytest
import torch

from elfreg import device
from elfreg.device import PRECISION_ENV, resolve_device, resolve_precision, use_bf16


@pytest.fixture
def no_forcing(monkeypatch):
    monkeypatch.delenv(PRECISION_ENV, raising=False)


@pytest.mark.parametrize("has_bf16", [True, False])
def test_auto_is_fp32_on_every_cpu_and_bf16_on_cuda(no_forcing, monkeypatch, has_bf16):
    monkeypatch.setattr(device, "cpu_has_native_bf16", lambda: has_bf16)
    assert resolve_precision("cpu") == "fp32"
    assert resolve_precision(torch.device("cpu"), "auto") == "fp32"
    assert resolve_precision(torch.device("cuda"), "auto") == "bf16"
    assert use_bf16("cpu", "auto") is False


def test_explicit_precision_wins_over_the_device_and_the_environment(monkeypatch):
    monkeypatch.setenv(PRECISION_ENV, "bf16")
    assert resolve_precision("cpu", "fp32") == "fp32"
    monkeypatch.setenv(PRECISION_ENV, "fp32")
    assert resolve_precision("cpu", "bf16") == "bf16"
    assert resolve_precision("cuda", "bf16") == "bf16"


@pytest.mark.parametrize("forced", ["bf16", "fp32"])
def test_environment_sets_what_auto_means_everywhere(monkeypatch, forced):
    monkeypatch.setenv(PRECISION_ENV, forced)
    assert resolve_precision("cpu") == forced
    assert resolve_precision("cuda") == forced
    assert use_bf16("cpu") is (forced == "bf16")


def test_bad_precision_values_fail_with_one_line(monkeypatch):
    monkeypatch.setenv(PRECISION_ENV, "fp16")
    with pytest.raises(ValueError, match=f"{PRECISION_ENV} must be bf16 or fp32, got 'fp16'"):
        resolve_precision("cpu")
    with pytest.raises(ValueError, match="precision must be one of"):
        resolve_precision("cpu", "half")


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the no-GPU message")
def test_asking_for_cuda_without_a_gpu_fails_clearly():
    with pytest.raises(ValueError, match="no usable CUDA GPU"):
        resolve_device("cuda")
    assert resolve_device("auto").type == "cpu"
