"""Quiet by default: what the libraries print that is not about the user's run is silenced, by
name, once they are imported; `toolkit -v` (TOOLKIT_VERBOSE=1) shows it all.

Each silenced message is listed in NOISE with why it is noise; tests/test_quiet.py makes each
one happen and fails when it comes back (or when `-v` would not show it)."""

from __future__ import annotations

import logging
import os
import warnings

VERBOSE = "TOOLKIT_VERBOSE"

# (warning category, message pattern, why it is not the user's business)
NOISE: list[tuple[type[Warning], str, str]] = [
    (FutureWarning, r"", "a library's notice of its own future changes"),
    (DeprecationWarning, r"", "a library calling another's deprecated API"),
    (UserWarning, r".*fan_in_fan_out is set to False.*", "PEFT correcting its own default for GPT-2's Conv1D"),
    (UserWarning, r".*Removed shared tensor.*", "safetensors de-duplicating tied weights on save"),
    (UserWarning, r".*Unable to fetch remote file.*", "PEFT looking up the base model on the Hub while "
     "exporting off-line: the export is written from local files"),
    (UserWarning, r".*Could not find a config file in.*", "PEFT's same look-up, for the base's config"),
]
LIBRARIES = ("transformers", "peft", "accelerate", "datasets", "torch", "huggingface_hub")


def verbose() -> bool:
    return os.environ.get(VERBOSE, "") not in ("", "0")


def warnings_off() -> None:
    """The NOISE warnings ignored, raised from the libraries' modules only: the user's own
    warnings (and the toolkit's) still show."""
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    if verbose():
        return
    for category, message, _ in NOISE:
        if message:
            warnings.filterwarnings("ignore", category=category, message=message)
        else:
            for module in LIBRARIES:
                warnings.filterwarnings("ignore", category=category, module=module + r"(\..*)?$")


def libraries() -> None:
    """The libraries' progress bars and load reports off (they import datasets and transformers:
    called once the checks that need neither have passed)."""
    warnings_off()
    if verbose():
        return
    import datasets
    import transformers

    datasets.disable_progress_bars()
    transformers.logging.set_verbosity_error()
    transformers.utils.logging.disable_progress_bar()
    logging.getLogger("peft").setLevel(logging.ERROR)
