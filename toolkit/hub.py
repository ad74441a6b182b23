"""Whether the Hugging Face Hub may be reached: one reading of HF_HUB_OFFLINE (as huggingface_hub
reads it: 1/true/yes/on) for the models, the tasks and export, without importing huggingface_hub."""

from __future__ import annotations

import os


def offline() -> bool:
    return os.environ.get("HF_HUB_OFFLINE", "0").lower() in ("1", "true", "yes", "on")
