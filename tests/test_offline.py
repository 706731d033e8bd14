"""The suite never reaches the network (tests/network_guard.py, installed by conftest.py): the Hub
libraries run offline, in this process and in the children it starts, another machine cannot be
connected to or even looked up, this machine can, and benchmark rows come from tests/fixtures."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from elfreg.eval import DataUnavailable, get_task
from elfreg.paths import data_dir
from network_guard import OFFLINE_ENV, NetworkRefused

# TEST-NET-1 (RFC 5737): never routed; a real connect there would hang until its timeout
UNREACHABLE = ("192.0.2.1", 80)


def test_connections_and_lookups_of_other_machines_are_refused_at_once():
    with socket.socket() as sock, pytest.raises(NetworkRefused, match=r"192\.0\.2\.1"):
        sock.connect(UNREACHABLE)
    with socket.socket() as sock, pytest.raises(NetworkRefused):
        sock.connect_ex(UNREACHABLE)
    with pytest.raises(NetworkRefused, match="huggingface.co"):
        socket.getaddrinfo("huggingface.co", 443)
    with pytest.raises(NetworkRefused):
        socket.create_connection(("huggingface.co", 443), timeout=30)


def test_this_machine_can_still_be_reached():
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen(1)
        for host in ("127.0.0.1", "localhost"):
            with socket.create_connection((host, server.getsockname()[1]), timeout=30) as client:
                peer, _ = server.accept()
                client.sendall(b"ping")
                assert peer.recv(4) == b"ping"
                peer.close()


def test_the_hub_libraries_are_offline_here_and_in_child_processes(tmp_path):
    import datasets
    import huggingface_hub
    from huggingface_hub.errors import OfflineModeIsEnabled
    from transformers import AutoConfig

    assert {k: os.environ[k] for k in OFFLINE_ENV} == OFFLINE_ENV
    assert huggingface_hub.constants.HF_HUB_OFFLINE and datasets.config.HF_DATASETS_OFFLINE
    with pytest.raises((OfflineModeIsEnabled, huggingface_hub.errors.LocalEntryNotFoundError)):
        huggingface_hub.hf_hub_download("openai-community/gpt2", "config.json", cache_dir=tmp_path)
    with pytest.raises(OSError):
        AutoConfig.from_pretrained("openai-community/gpt2", cache_dir=tmp_path)
    child = "from huggingface_hub import constants; print(constants.HF_HUB_OFFLINE)"
    assert subprocess.run([sys.executable, "-c", child], capture_output=True, text=True,
                          check=True).stdout.strip() == "True"


def test_a_benchmark_without_a_local_copy_fails_in_one_line_instead_of_downloading(tmp_path):
    with pytest.raises(DataUnavailable, match=r"^math500: could not load HuggingFaceH4/MATH-500 from the Hub") as err:
        get_task("math500", data_dir=tmp_path).problems()
    assert "\n" not in str(err.value).strip()


def test_benchmark_rows_come_from_the_fixtures():
    assert data_dir() == Path(__file__).resolve().parent / "fixtures"
    task = get_task("gsm8k")
    assert len(task.problems()) == 40 and task.provenance["origin"] == "local"
