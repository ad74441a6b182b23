"""Whether the Hugging Face Hub may be reached: one reading of HF_HUB_OFFLINE (as huggingface_hub
reads it: 1/true/yes/on) for the models, the tasks and export, without importing huggingface_hub;
and `settle`, which makes a machine that cannot reach the Hub work off-line instead of waiting."""

from __future__ import annotations

import os
import socket
import sys
from urllib.parse import urlparse

PROXIES = ("HTTPS_PROXY", "https_proxy", "HTTP_PROXY", "http_proxy", "ALL_PROXY", "all_proxy")
_settled = False


def offline() -> bool:
    return os.environ.get("HF_HUB_OFFLINE", "0").lower() in ("1", "true", "yes", "on")


def settle() -> None:
    """Once per process, as the Hub's libraries load: where the Hub's host name does not resolve
    (no network or no DNS here) and nothing else says how to reach it, work off-line and say so
    in one line. huggingface_hub would otherwise retry each request with back-off before failing
    or falling back: 46 s of sleep for one `--smoke` run of a Hub-named recipe on a machine
    without network. Nothing changes where HF_HUB_OFFLINE (or TRANSFORMERS_OFFLINE) is set either
    way, or a proxy is configured (it resolves names itself)."""
    global _settled
    if _settled:
        return
    _settled = True
    if "HF_HUB_OFFLINE" in os.environ or "TRANSFORMERS_OFFLINE" in os.environ or any(
            os.environ.get(p) for p in PROXIES):
        return
    host = urlparse(os.environ.get("HF_ENDPOINT") or "https://huggingface.co").hostname or "huggingface.co"
    try:
        socket.getaddrinfo(host, 443)
        return
    except OSError:
        pass
    os.environ["HF_HUB_OFFLINE"] = "1"
    constants = sys.modules.get("huggingface_hub.constants")
    if constants is not None:  # already imported: it read the variable then
        constants.HF_HUB_OFFLINE = True
    if os.environ.get("RANK", "0") == "0":  # once for a launch of several processes
        print(f"note: {host} does not resolve here: working off-line (local and cached models only); "
              "HF_HUB_OFFLINE=1 says so and skips this check", file=sys.stderr)
