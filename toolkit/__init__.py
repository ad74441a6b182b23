"""Declarative fine-tuning on Hugging Face: one loop for encoder, decoder and encoder-decoder models.

The Python API (toolkit/api.py): `toolkit.run`, `evaluate`, `predict`, `export`, `sweep`,
`report`, `validate`, the `Run` they return and `UserError`. `import toolkit` imports none of torch,
transformers or datasets; the first call of a function does.
"""

from toolkit.api import Run, evaluate, export, predict, report, run, sweep, validate
from toolkit.errors import UserError

__version__ = "0.1.0"
__all__ = ["Run", "UserError", "evaluate", "export", "predict", "report", "run", "sweep", "validate"]
