"""Heavy libraries imported when first used, not when the toolkit's modules are.

`toolkit ls` and `toolkit validate` import every plug-in (the registries fill on import) and
need none of torch, transformers, peft, accelerate, scipy or sklearn, whose imports cost seconds.
A module that uses torch only inside its functions binds a stand-in instead of the module:

    torch = lazy("torch", globals())                # for `import torch`
    F = lazy("torch.nn.functional", globals())      # for `import torch.nn.functional as F`

The first attribute read imports the real module and puts it in place of the stand-in in that
module's globals, so every later use there is a plain global lookup of the real module: nothing
is added to the training path. Uses at import time (a base class, a decorator, a constant) would
import at once; they are deferred instead (`no_grad` below, classes in their own module).
"""

from __future__ import annotations

import functools
import importlib
from types import ModuleType
from typing import Any, Callable, TypeVar

Fn = TypeVar("Fn", bound=Callable[..., Any])


class LazyModule:
    """Stands for a module until an attribute of it is read (see the module docstring)."""

    __slots__ = ("_name", "_namespace")

    def __init__(self, name: str, namespace: dict[str, Any]) -> None:
        self._name = name
        self._namespace = namespace

    def _load(self) -> ModuleType:
        module = importlib.import_module(self._name)
        for key, value in list(self._namespace.items()):
            if value is self:  # every name the stand-in was bound to now holds the module
                self._namespace[key] = module
        return module

    def __getattr__(self, attr: str) -> Any:
        return getattr(self._load(), attr)

    def __repr__(self) -> str:
        return f"<lazy module '{self._name}'>"


def lazy(name: str, namespace: dict[str, Any]) -> Any:
    """A stand-in for module `name` in `namespace` (the caller's `globals()`)."""
    return LazyModule(name, namespace)


def no_grad(fn: Fn) -> Fn:
    """`@torch.no_grad()` for a module-level function, without importing torch to define it."""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        import torch

        with torch.no_grad():
            return fn(*args, **kwargs)

    return wrapper  # type: ignore[return-value]
