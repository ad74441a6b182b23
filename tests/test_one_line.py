"""Issue 37 rule 7: one line, never a traceback, for user-caused failures that used to trace back
(the label column read as text is in test_startup.py, said before any import; metrics.json of
the wrong types and `report --out FILE` are in test_report.py)."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

import toolkit
from toolkit import runs


def test_two_exports_to_one_target_at_once(tmp_path: Path, cli) -> None:
    """The second export to a place another export is writing is refused (the run lock)."""
    run = tmp_path / "run"
    run.mkdir()
    (run / "recipe.yaml").write_text("model: {checkpoint: x}\n")
    target = tmp_path / "export"
    with runs.locked(target):  # an export in progress holds this
        code, _, err = cli("export", str(run), str(target))
        assert code == 2 and err.count("\n") == 1
        assert f"export: {target} is being written by another export right now" in err
        with pytest.raises(toolkit.UserError, match="is being written by another export right now"):
            toolkit.export(run, target)
    assert not target.exists()


def test_weights_torch_refuses_are_named(tmp_path: Path, tiny_checkpoint) -> None:
    """A model folder whose pytorch_model.bin pickles more than tensors: one line naming it."""
    import torch

    from toolkit import heads, models

    folder = tmp_path / "model"
    shutil.copytree(tiny_checkpoint("bert"), folder)
    for weights in folder.glob("*.safetensors"):
        weights.unlink()
    torch.save({"bert.embeddings.word_embeddings.weight": _Unpicklable()}, folder / "pytorch_model.bin")
    with pytest.raises(toolkit.UserError, match=rf"^model.checkpoint: {folder}/pytorch_model.bin: torch refuses "
                       r"to load it \(.+\); save the model as safetensors"):
        models.load(str(folder), heads.SEQUENCE_CLASSIFICATION, {"num_labels": 2})


class _Unpicklable:
    """An object torch's weights-only loader will not rebuild."""

    def __reduce__(self):
        return (dict, ())
