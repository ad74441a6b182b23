"""Finding a transformers model's attention layers by what they carry, not by class name: the
attention modules, prefix tuning and the fast dropout all walk the same layers. A leaf module
(nothing of the toolkit below it), so each of them can import it."""

from __future__ import annotations

from typing import Any


def attention_layers(model: Any) -> list[tuple[str, Any]]:
    """Modules that call ALL_ATTENTION_FUNCTIONS: they carry `is_causal` and q/k/v projections."""
    found = []
    for path, module in model.named_modules():
        if hasattr(module, "is_causal") and any(hasattr(module, p) for p in ("query", "q_proj", "q", "c_attn")):
            found.append((path, module))
    return found
