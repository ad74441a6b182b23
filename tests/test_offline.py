"""A machine that cannot reach the Hub (no network, no DNS) works off-line at once and says so
in one line, instead of waiting on huggingface_hub's retries (46 s of back-off for one --smoke run
of a Hub-named recipe here); where the user said how to reach the Hub (HF_HUB_OFFLINE either way,
a proxy), nothing changes."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import ROOT
from toolkit import hub


def test_a_hub_that_does_not_resolve_means_off_line_said_once(tmp_path: Path) -> None:
    """HF_ENDPOINT under .invalid (a name that never resolves, RFC 2606): the same here and on a
    machine with network."""
    env = {k: v for k, v in os.environ.items() if k not in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE", *hub.PROXIES)}
    env.update(HF_ENDPOINT="https://hub.invalid", PYTHONPATH=str(ROOT))
    proc = subprocess.run([sys.executable, "-m", "toolkit.cli", "run", "glue/sst2/bert-base-uncased-full", "--smoke",
                           "--runs-dir", str(tmp_path)], cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    notes = [line for line in proc.stderr.splitlines() if line.startswith("note: hub.invalid does not resolve")]
    assert len(notes) == 1, proc.stderr[-2000:]
    assert "thrown while requesting" not in proc.stderr  # huggingface_hub's retries never ran
    assert list(tmp_path.rglob("metrics.json"))


@pytest.mark.parametrize("env", [{"HF_HUB_OFFLINE": "0"}, {"HTTPS_PROXY": "http://proxy.example:3128"}])
def test_what_the_user_said_of_the_network_stands(monkeypatch: pytest.MonkeyPatch, env: dict) -> None:
    def unresolvable(*args, **kwargs):
        raise socket.gaierror(-2, "Name or service not known")

    for key in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE", *hub.PROXIES):
        monkeypatch.delenv(key, raising=False)
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    monkeypatch.setattr(socket, "getaddrinfo", unresolvable)
    monkeypatch.setattr(hub, "_settled", False)
    hub.settle()
    assert os.environ.get("HF_HUB_OFFLINE") == env.get("HF_HUB_OFFLINE")


@pytest.mark.parametrize("before", [None, "0"])
def test_the_api_leaves_the_network_setting_as_found(monkeypatch: pytest.MonkeyPatch, before: str | None) -> None:
    """settle's off-line is for the toolkit's own call: after a call of the Python API on a machine
    whose DNS failed, the caller's own Hugging Face calls read HF_HUB_OFFLINE as they had it; the
    next call works off-line again without a second look-up."""
    import huggingface_hub.constants as constants

    from toolkit import api, quiet

    looked: list = []

    def unresolvable(*args, **kwargs):
        looked.append(args)
        raise socket.gaierror(-2, "Name or service not known")

    for key in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE", *hub.PROXIES):
        monkeypatch.delenv(key, raising=False)
    monkeypatch.setattr(socket, "getaddrinfo", unresolvable)
    monkeypatch.setattr(hub, "_settled", False)
    monkeypatch.setattr(hub, "_unreachable", "")
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
    seen = []

    @api._one_line
    def call() -> None:  # what every API function that loads the libraries does first
        quiet.libraries()
        seen.append((os.environ.get("HF_HUB_OFFLINE"), constants.HF_HUB_OFFLINE))

    if before is None:
        call()
        call()
        assert seen == [("1", True), ("1", True)] and len(looked) == 1  # off-line inside, checked once
        assert "HF_HUB_OFFLINE" not in os.environ and constants.HF_HUB_OFFLINE is False
    else:  # the user's own setting: no look-up, nothing changed
        monkeypatch.setenv("HF_HUB_OFFLINE", before)
        call()
        assert seen == [("0", False)] and not looked and os.environ["HF_HUB_OFFLINE"] == "0"
