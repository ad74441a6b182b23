"""Quiet by default: what the libraries print that is not about the user's run is silenced, by
name, once they are imported; `toolkit -v` (TOOLKIT_VERBOSE=1) shows it all.

Each silenced message is listed in NOISE with why it is noise; tests/test_quiet.py makes each
one happen and fails when it comes back (or when `-v` would not show it)."""

from __future__ import annotations

import logging
import os
import re
import sys
import warnings
from contextlib import contextmanager
from typing import Iterator

from toolkit import hub

VERBOSE = "TOOLKIT_VERBOSE"

# (warning category, message pattern, the library module that warns ("" any of LIBRARIES), why
# it is not the user's business). tests/test_quiet.py makes each happen and checks it is silenced.
NOISE: list[tuple[type[Warning], str, str, str]] = [
    (FutureWarning, "", "", "a library's notice of its own future changes"),
    (DeprecationWarning, "", "", "a library calling another's deprecated API"),
    (UserWarning, r".*fan_in_fan_out is set to False", "peft", "PEFT correcting its own default for GPT-2's Conv1D"),
    (UserWarning, r".*Removed shared tensor", "", "safetensors de-duplicating tied weights on save"),
    (UserWarning, r"Could not find a config file in", "peft", "PEFT looking the base model up on the Hub while "
     "saving an adapter off-line: the export is written from local files either way"),
    (UserWarning, r"Unable to fetch remote file", "peft", "the same look-up, failing on the network"),
]
# Log records of a library's own logger, dropped by message (logger name, pattern, why).
LOG_NOISE: list[tuple[str, str, str]] = [
    ("accelerate.utils.other", r"Removed shared tensor", "accelerate de-duplicating tied weights when a "
     "checkpoint is saved (a model with tied embeddings, MiniLM2MiniLM's say); exact resume is tested"),
    ("DeepSpeed", r"Setting accelerator to CPU", "DeepSpeed on a machine without GPUs, where the launch "
     "runs CPU processes as `make run` says (metrics.json records the device)"),
]


# Lines a library call says once (quiet.once): once per command, and once per call of the Python
# API (as_found starts each call with none said, as a fresh process).
_SAID: set[str] = set()


def once(line: str) -> bool:
    """True the first time `line` is to be said in this command or API call."""
    if line in _SAID:
        return False
    _SAID.add(line)
    return True


class _Drop(logging.Filter):
    """Drops the records whose message matches one of LOG_NOISE's patterns."""

    def __init__(self, pattern: str) -> None:
        super().__init__()
        self.pattern = re.compile(pattern)

    def filter(self, record: logging.LogRecord) -> bool:
        return not self.pattern.search(record.getMessage())


def _log_filters() -> None:
    """LOG_NOISE's filters on (removed again under -v, so a process can switch)."""
    for name, pattern, _ in LOG_NOISE:
        logger = logging.getLogger(name)
        for old in [f for f in logger.filters if isinstance(f, _Drop)]:
            logger.removeFilter(old)
        if not verbose():
            logger.addFilter(_Drop(pattern))


# Not warnings but log records, silenced by the libraries' own verbosity (libraries() below):
# transformers' load report ("... MISSING ... newly initialized") when a run's trained model is
# loaded with its head from the run; datasets' and transformers' progress bars.
LIBRARIES = ("transformers", "peft", "accelerate", "datasets", "torch", "huggingface_hub")


def verbose() -> bool:
    return os.environ.get(VERBOSE, "") not in ("", "0")


def warnings_off() -> None:
    """The NOISE warnings ignored, raised from the libraries' modules only: the user's own
    warnings (and the toolkit's) still show."""
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    if verbose():
        return
    for category, message, module, _ in NOISE:
        for name in [module] if module else LIBRARIES:
            warnings.filterwarnings("ignore", message=message, category=category, module=name + r"(\..*)?$")


def libraries() -> None:
    """The libraries' progress bars and load reports off (they import datasets and transformers:
    called once the checks that need neither have passed). First, a machine that cannot reach
    the Hub is made to work off-line rather than wait on it (toolkit.hub.settle)."""
    hub.settle()
    warnings_off()
    _log_filters()
    if verbose():
        return
    import datasets
    import transformers

    datasets.disable_progress_bars()
    transformers.logging.set_verbosity_error()
    transformers.utils.logging.disable_progress_bar()
    logging.getLogger("peft").setLevel(logging.ERROR)


# Each library's progress-bar switch: (module, is it on, turn it on, turn it off), read by name.
BARS = [("huggingface_hub.utils", "are_progress_bars_disabled", "enable_progress_bars", "disable_progress_bars"),
        ("datasets.utils.logging", "is_progress_bar_enabled", "enable_progress_bar", "disable_progress_bar"),
        ("transformers.utils.logging", "is_progress_bar_enabled", "enable_progress_bar", "disable_progress_bar")]


def _bars() -> dict[str, bool]:
    """Which libraries' progress bars are on, of those imported."""
    on = {}
    for module, ask, _, _ in BARS:
        if module in sys.modules:
            value = getattr(sys.modules[module], ask)()
            on[module] = not value if ask.startswith("are_") else bool(value)
    return on


@contextmanager
def as_found() -> Iterator[None]:
    """What quiet sets for a call of the Python API is put back after it: the warning filters,
    the libraries' log levels and filters, their progress bars and TOKENIZERS_PARALLELISM. They
    stayed set, so a notebook's own transformers / datasets work after `toolkit.run` showed no
    warning and no progress bar. A library first imported during the call gets its defaults.
    The call starts with no line said (`once`): a warning an earlier call had said (a score
    recorded as null because the labels do not vary) was not said by the next call, exit 0."""
    filters, parallel = list(warnings.filters), os.environ.get("TOKENIZERS_PARALLELISM")
    said = set(_SAID)
    _SAID.clear()
    names = (*LIBRARIES, *(name for name, _, _ in LOG_NOISE))
    loggers = {name: (logging.getLogger(name).level, list(logging.getLogger(name).filters)) for name in names}
    bars = _bars()
    try:
        yield
    finally:
        _SAID.clear()
        _SAID.update(said)
        warnings.filters[:] = filters
        warnings._filters_mutated()  # type: ignore[attr-defined]  # the caches of `warn` forget the old filters
        if parallel is None:
            os.environ.pop("TOKENIZERS_PARALLELISM", None)
        for name, (level, kept) in loggers.items():
            logger = logging.getLogger(name)
            logger.setLevel(level)
            logger.filters[:] = kept
        for module, _, enable, disable in BARS:
            if module in sys.modules and _bars().get(module) != bars.get(module, True):
                getattr(sys.modules[module], enable if bars.get(module, True) else disable)()
