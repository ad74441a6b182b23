"""Whether the Hugging Face Hub may be reached: one reading of HF_HUB_OFFLINE (as huggingface_hub
reads it: 1/true/yes/on) for the models, the tasks and export, without importing huggingface_hub;
and `settle`, which makes a machine that cannot reach the Hub work off-line instead of waiting."""

from __future__ import annotations

import os
import socket
import sys
from contextlib import contextmanager
from typing import Iterator
from urllib.parse import urlparse

PROXIES = ("HTTPS_PROXY", "https_proxy", "HTTP_PROXY", "http_proxy", "ALL_PROXY", "all_proxy")
_settled = False
_unreachable = ""  # the Hub's host, where settle found it does not resolve


def offline() -> bool:
    return os.environ.get("HF_HUB_OFFLINE", "0").lower() in ("1", "true", "yes", "on")


def settle() -> None:
    """Once per process, as the Hub's libraries load: where the Hub's host name does not resolve
    (no network or no DNS here) and nothing else says how to reach it, work off-line and say so
    in one line. huggingface_hub would otherwise retry each request with back-off before failing
    or falling back: 46 s of sleep for one `--smoke` run of a Hub-named recipe on a machine
    without network. Nothing changes where HF_HUB_OFFLINE (or TRANSFORMERS_OFFLINE) is set either
    way, or a proxy is configured (it resolves names itself). Checked once: a later call (the
    next one of the Python API, whose `as_found` put the variable back) works off-line again
    without a second look-up or note."""
    global _settled, _unreachable
    if "HF_HUB_OFFLINE" in os.environ or "TRANSFORMERS_OFFLINE" in os.environ or any(
            os.environ.get(p) for p in PROXIES):
        _settled = True
        return
    if _settled:
        if _unreachable:
            _work_offline()
        return
    _settled = True
    host = urlparse(os.environ.get("HF_ENDPOINT") or "https://huggingface.co").hostname or "huggingface.co"
    try:
        socket.getaddrinfo(host, 443)
        return
    except OSError:
        pass
    _unreachable = host
    _work_offline()
    if os.environ.get("RANK", "0") == "0":  # once for a launch of several processes
        print(f"note: {host} does not resolve here: working off-line (local and cached models only); "
              "HF_HUB_OFFLINE=1 says so and skips this check", file=sys.stderr)


def _work_offline() -> None:
    os.environ["HF_HUB_OFFLINE"] = "1"
    constants = sys.modules.get("huggingface_hub.constants")
    if constants is not None:  # already imported: it read the variable then
        constants.HF_HUB_OFFLINE = True


@contextmanager
def as_found() -> Iterator[None]:
    """HF_HUB_OFFLINE (and huggingface_hub's reading of it) as the caller had it, after a call of
    the Python API: settle's off-line stayed set, so a notebook's own Hugging Face calls after
    `toolkit.run` on a machine whose DNS failed once stayed off-line for the rest of the process."""
    kept = os.environ.get("HF_HUB_OFFLINE")
    constants = sys.modules.get("huggingface_hub.constants")
    reading = constants.HF_HUB_OFFLINE if constants is not None else None
    try:
        yield
    finally:
        if kept is None:
            os.environ.pop("HF_HUB_OFFLINE", None)
        else:
            os.environ["HF_HUB_OFFLINE"] = kept
        constants = sys.modules.get("huggingface_hub.constants")
        if constants is not None and reading is not None:
            constants.HF_HUB_OFFLINE = reading
        elif constants is not None:  # first imported during the call: what its import reads now
            constants.HF_HUB_OFFLINE = (os.environ.get("HF_HUB_OFFLINE") or os.environ.get("TRANSFORMERS_OFFLINE")
                                        or "0").upper() in ("1", "ON", "YES", "TRUE")
