"""Checkpoint I/O of the loop: what trainer_state.json holds, writing a checkpoint so that a kill
at any moment leaves the previous ones whole, finding the newest whole one on resume, and the
best step's weights. accelerate's save_state/load_state write and read the tensors and RNG
states; the loop's bookkeeping and the manifest are the toolkit's."""

from __future__ import annotations

import functools
import hashlib
import math
import os
import platform
import shutil
import subprocess
import sys
from dataclasses import dataclass
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import Any

import torch
from accelerate import Accelerator

from toolkit import devices, provenance, runs, sharding, versions
from toolkit.errors import UserError
from toolkit.recipe_data import safe_yaml


@dataclass
class State:
    """What trainer_state.json holds: the data position and the bookkeeping beside the weights."""

    step: int = 0
    epoch: int = 0
    batch_in_epoch: int = 0  # micro-batches of `epoch` already consumed
    best_metric: float | None = None
    best_step: int | None = None
    best_loss: float | None = None  # eval loss at best_step: breaks ties on the metric
    bad_evals: int = 0
    samples: int = 0
    train_time: float = 0.0
    last_eval: dict | None = None
    peak_memory_mb: float = 0.0  # of training itself: checkpoint writing is not counted
    skipped_nonfinite: int = 0  # optimizer steps skipped for a non-finite loss or gradient
    skipped_nonfinite_micro_batches: int = 0  # the micro-batches those steps accumulated (grad_accum each)
    empty_steps: int = 0  # steps whose batches held no loss unit: no update made (not non-finite)
    eval_runtime_s: float = 0.0  # of the latest evaluation (every eval split)
    base: dict | None = None  # a lean checkpoint's frozen base folder, file by file (base_files)
    hub_data: dict | None = None  # each Hub data set's splits as loaded (Task.hub_data): their revision
    code: dict | None = None  # the toolkit's code and the libraries that trained it (code_versions)
    resumed_under_other_code: list | None = None  # each resume under other code: step and what changed
    compute: dict | None = None  # what the latest steps ran on beside the code (compute): threads, instruction set, GPU
    resumed_on_other_compute: list | None = None  # each resume on other compute: step and what changed
    # the finite steps' losses since the last logged step, [sum, count] (None: none): the next logged
    # loss is their mean, and a resumed run logs what the uninterrupted one does
    log_window: list | None = None
    # the finite steps' losses since step 1, [sum, count]: metrics.json's train_loss is their mean,
    # Trainer's run-mean loss (None: resumed from a checkpoint written before it was recorded)
    run_loss: list | None = None
    # the base's files as the run started on it (run_metrics.start_weights; main process): what
    # metrics.json's base_weights records, taken at the end it was of the base as it was then (a
    # base folder trained again during a long run recorded as the new one; None: a checkpoint from before)
    start_weights: dict | None = None
    # the step of the last line written to log.jsonl before this checkpoint (None: a checkpoint from
    # before it was recorded): a resume needs the log up to there (runs.check_log)
    logged: int | None = None




def save(acc: Accelerator, out: Path, state: State, save_total_limit: int | None, keep: int | None,
         stop: bool = False) -> None:
    """Written under a temporary name, with a manifest of every file's size and hash, and
    renamed when whole: a kill at any moment leaves the previous checkpoints intact. `keep`:
    a step pruning must spare (the best so far). `stop`: the checkpoint of `--stop-after N` at
    a step the run's schedule saves no checkpoint at, marked so (STOP): the next checkpoint, once
    whole, removes it (stopped_here)."""
    name = runs.step_name(state.step)
    folder, tmp = out / "checkpoints" / name, out / "checkpoints" / f"tmp-{name}"
    state.peak_memory_mb = max(state.peak_memory_mb, devices.run_peak_memory_mb(acc.device) or 0.0)
    state.code = state.code or code_versions()  # the first checkpoint records what started the run
    state.compute = state.compute or compute(acc.device)
    if acc.is_main_process and tmp.exists():
        shutil.rmtree(tmp)
    acc.wait_for_everyone()
    acc.save_state(str(tmp))
    if acc.device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(acc.device)
    acc.wait_for_everyone()  # every rank's RNG file is in
    if acc.is_main_process:
        runs.follow_umask(tmp)  # accelerate's model.safetensors is 0600 whatever the umask
        runs.sync_tree(tmp)  # on disk, not in the page cache only, before any older one goes
        if (out / "log.jsonl").is_file():  # and the log lines it goes on from (runs.check_log)
            runs.fsync(out / "log.jsonl")
        fields = {**state.__dict__, "run": out.name, **({STOP: True} if stop else {})}  # run: the run id,
        # what a resume checks it belongs to
        runs.write_json(tmp / "trainer_state.json", {**fields, "manifest": runs.manifest(tmp),
                                                     "state_sha256": runs.state_digest(fields)})
        runs.fsync(tmp / "trainer_state.json")
        runs.sync_tree(tmp, files=False)
        if folder.exists():
            shutil.rmtree(folder)
        os.replace(tmp, folder)
        runs.sync_tree(folder.parent, files=False)  # the rename itself
        for earlier in runs.checkpoints(out):  # before rotation, which counted them among the newest
            if runs.step_of(earlier) < state.step and stopped_here(earlier):
                shutil.rmtree(earlier, ignore_errors=True)
        runs.prune(out, save_total_limit, keep, upto=state.step)
    acc.wait_for_everyone()


# trainer_state.json's mark of a checkpoint `--stop-after N` wrote at a step its schedule saves
# none at. It was kept as a step checkpoint: a run stopped at step 3 and resumed kept step-3 beside
# step-2 and step-4 (train.keep_checkpoints, save_total_limit 3), or step-3 and step-4 where the
# uninterrupted run kept step-2 and step-4 (its step-2 rotated out), not the uninterrupted run's
# folder. The next checkpoint, once whole, removes it.
STOP = "stop"


def stopped_here(folder: Path) -> bool:
    """Whether the checkpoint `folder` is one `--stop-after` wrote off the run's schedule (STOP)."""
    try:
        return runs.read_json(folder / "trainer_state.json").get(STOP) is True
    except (ValueError, OSError, AttributeError):
        return False


def restore(acc: Accelerator, out: Path, total_steps: int, check: Any = None) -> State:
    """The state of the newest checkpoint that is whole (loaded into what `acc` prepared); a
    truncated or corrupt one is said and the one before is tried (the same run, an earlier step:
    the result is the same). Checkpoints there but none usable is one line (UserError): the run
    used to start again from step 0 without a word, exit 0. A fresh State when there is none.
    `check(state)` refuses a resume (what it goes on from is not what the checkpoint was made on)
    before anything says the run resumes."""
    found, problems = runs.checkpoints(out), []
    for folder in reversed(found):
        problem = runs.check_manifest(folder) or _other_run(folder, out)
        if problem is None:
            sharding.check_resume(acc, folder)  # another strategy or process count: one line
            problem = _load(acc, folder)
        if problem is not None:
            problems.append(f"{folder.name}: {problem}")
            if folder != found[0]:
                acc.print(f"checkpoint {folder} is unusable ({problem}); trying the one before")
            continue
        state = _state(folder)
        if check is not None:
            check(state)
        if acc.is_main_process:
            runs.check_log(out, state.step, state.logged)
            evaluated = (state.last_eval or {}).get("step") == state.step
            runs.truncate_log(out, state.step, evaluated)
            acc.print(f"resuming from {folder} (step {state.step} of {total_steps})")
        note_other_code(acc, out, state)
        note_other_compute(acc, out, state)
        return state
    if found:
        raise UserError(f"{out}: none of its {len(found)} checkpoint(s) is usable ({'; '.join(problems)}), so "
                        "the run cannot go on from where it stopped; --force starts it again from step 0 "
                        "(or put back an intact copy of that folder)")
    if acc.is_main_process:
        runs.truncate_log(out, 0)
    return State()


def _other_run(folder: Path, out: Path) -> str | None:
    """A checkpoint records the run that wrote it (its folder's name, the run id): one copied in
    from another run (another seed, learning rate or data) was resumed as this run's, and the
    result, under this run's id, was a mix of the two, exit 0. Unrecorded (older checkpoints): taken."""
    try:
        written_by = runs.read_json(folder / "trainer_state.json").get("run")
    except (ValueError, OSError, AttributeError):
        return None  # check_manifest said it
    if written_by is None or written_by == out.name:
        return None
    return f"written by run {written_by}, not this one ({out.name}): a checkpoint of another run"


def _state(folder: Path) -> State:
    """The loop's State as a checkpoint saved it; fields this toolkit's State lacks (a checkpoint
    of another version) are one line, not a TypeError traceback."""
    saved = runs.read_json(folder / "trainer_state.json")
    for key in ("manifest", "state_sha256", "run", STOP):
        saved.pop(key, None)
    unknown = sorted(set(saved) - set(State.__dataclass_fields__))
    if unknown:
        raise UserError(f"{folder}: its trainer_state.json holds {', '.join(unknown)}, which this version of the "
                        "toolkit does not know (written by another version); resume under the version that "
                        "wrote it, or --force to start again")
    if isinstance(saved.get("last_eval"), dict):
        # a score the data left undefined is NaN in the loop and null in the file (strict JSON): read
        # back as the loop held it, so a run resumed after its last evaluation finishes with what the
        # uninterrupted run did (its final line's `f"{v:.4f}"` of a null was a TypeError traceback)
        saved["last_eval"] = {k: math.nan if v is None else v for k, v in saved["last_eval"].items()}
    return State(**saved)


def _load(acc: Accelerator, folder: Path) -> str | None:
    """Loads a checkpoint whose files are as written; what makes it unusable, else None. A
    checkpoint from before manifests that fails to load is damage; one with a manifest that fails
    is not damage: under other library versions it is said in one line, otherwise it is a bug."""
    try:
        acc.load_state(str(folder), **_load_kwargs(acc))
    except Exception as exc:
        saved = runs.read_json(folder / "trainer_state.json")
        if not saved.get("manifest"):
            return f"{type(exc).__name__} while loading it"  # written before manifests
        changed = code_changes(saved.get("code"), code_versions())
        if changed:
            raise UserError(f"{folder}: written under {changed}, it cannot be read under these ({type(exc).__name__}: "
                            f"{str(exc).splitlines()[0][:120] if str(exc) else ''}); resume under the versions it "
                            "was written with, or --force to start again") from None
        raise  # every file is as it was written: failing to read it is a bug, not damage
    return None


# --- the code a run trains under -----------------------------------------------------------
@functools.lru_cache(maxsize=1)
def code_versions() -> dict[str, str | None]:
    """The toolkit's code (git commit, plus a hash of uncommitted changes; its package version
    outside a checkout) and the versions of the libraries a step's numbers depend on, and those a
    task's scores are computed by (versions.SCORING, recorded since 2026-11-28): what a checkpoint
    and metrics.json record, and what a resume compares. Once per process."""
    record: dict[str, str | None] = {"toolkit": _toolkit_code(), "python": platform.python_version()}
    for name in versions.TRACKED + versions.SCORING:
        try:
            record[name] = version(name)
        except PackageNotFoundError:
            record[name] = None
    return record


def _toolkit_code(here: Path | None = None) -> str | None:
    here = here or Path(__file__).resolve().parent
    commit = provenance.git_commit() if here == Path(__file__).resolve().parent else _head(here)
    if commit is None:
        try:
            return f"version {version('toolkit')}"
        except PackageNotFoundError:
            return None
    return commit[:12] + (f" + uncommitted changes {hashlib.sha256(diff).hexdigest()[:8]}" if (diff := _changes(here)) else "")


def _head(here: Path) -> str | None:
    done = subprocess.run(["git", "-C", str(here), "rev-parse", "HEAD"], capture_output=True, text=True, timeout=10,
                          check=False)
    return done.stdout.strip() if done.returncode == 0 else None


def _changes(here: Path) -> bytes:
    """The code below `here` that its commit does not hold: the diff of tracked files, and each file
    git does not track nor ignore (a new plug-in module not yet added) by its name and contents.
    Untracked files were left out: runs of a new method's file before and after an edit recorded one
    code, and a report pooled them as seeds of one code, exit 0."""
    try:
        diff = subprocess.run(["git", "-C", str(here), "diff", "HEAD", "--", "."], capture_output=True,
                              timeout=20, check=False).stdout
        new = subprocess.run(["git", "-C", str(here), "ls-files", "--others", "--exclude-standard", "-z", "--", "."],
                             capture_output=True, timeout=20, check=False).stdout
    except (OSError, subprocess.SubprocessError):
        return b""
    for name in sorted(n for n in new.split(b"\0") if n):
        try:
            diff += b"\0untracked " + name + b"\0" + (here / name.decode(errors="surrogateescape")).read_bytes()
        except OSError:
            diff += b"\0untracked " + name
    return diff


def code_changes(then: dict | None, now: dict) -> str:
    """'torch 2.1.0 (now 2.2.0); toolkit 0123abcd4567 (now ...)': what differs; '' when nothing
    does or the earlier record is unknown (a checkpoint written before records existed). A library
    the earlier record does not hold (written before it was recorded: versions.SCORING) is not a
    change it can tell."""
    if not then:
        return ""
    return "; ".join(f"{k} {then.get(k)} (now {now.get(k)})" for k in sorted(then) if then.get(k) != now.get(k))


def note_other_code(acc: Accelerator, out: Path, state: State) -> None:
    """A resume under other library versions or another toolkit commit than the checkpoint's goes
    on, as transformers' Trainer does (a long run is not thrown away for an upgrade), but it is no
    longer the exact resume the run would claim: one line on stderr, and the change goes into every
    later checkpoint and metrics.json (`resumed_under_other_code`), which a report marks."""
    _note_resumed_otherwise(acc, state, "code", code_versions(), "resumed_under_other_code", lambda changed: (
        f"note: {out} resumes step {state.step} under other code than its checkpoint was written "
        f"with: {changed}; its result may differ from an uninterrupted run's, and metrics.json "
        "records it (resumed_under_other_code)"))


def compute(device: torch.device) -> dict[str, Any]:
    """What a step's numbers depend on beside the code and the recipe: on a CPU, torch's intra-op
    thread count (a sum over a large tensor is taken in one chunk per thread: between 1 and 2
    threads the gradient norm and the weights differ in their last bits) and the instruction set
    its kernels were chosen for (torch.backends.cpu.get_cpu_capability); on a GPU, its name."""
    if device.type == "cpu":
        return {"device": "cpu", "instruction set": torch.backends.cpu.get_cpu_capability(),
                "torch threads": torch.get_num_threads()}
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else device.type
    return {"device": name}


def note_other_compute(acc: Accelerator, out: Path, state: State) -> None:
    """A resume with another thread count, instruction set or GPU than the checkpoint was written
    with goes on, but is no longer the exact resume the run would claim: the same steps are summed
    in other chunks, and the result differs from the uninterrupted run's, exit 0 and no word (a
    run started with OMP_NUM_THREADS=1 and resumed without it on a 2-core machine). One line on
    stderr, and the change goes into every later checkpoint and metrics.json
    (`resumed_on_other_compute`). Not part of the run id: a run moved to another machine is the
    same run, resumed. Checkpoints written before the record are not judged (the next one
    records this launch's)."""
    if state.compute is None:
        return
    now = compute(acc.device)
    hint = (f"OMP_NUM_THREADS={state.compute['torch threads']} resumes it exactly on this machine"
            if set(_changed_keys(state.compute, now)) == {"torch threads"}
            else "resume it where it was written for an exact resume")
    _note_resumed_otherwise(acc, state, "compute", now, "resumed_on_other_compute", lambda changed: (
        f"note: {out} resumes step {state.step} on other compute than its checkpoint was written on: "
        f"{changed}; its result may differ from an uninterrupted run's in the last bits ({hint}), "
        "and metrics.json records it (resumed_on_other_compute)"))


def _note_resumed_otherwise(acc: Accelerator, state: State, field: str, now: dict, records: str,
                            line: Any) -> None:
    """What the checkpoint recorded in `state.<field>` against `now`: where they differ, `line(changes)`
    said by the main process and the change appended to `state.<records>`; the record is `now` after."""
    then = getattr(state, field)
    changed = code_changes(then, now)
    if changed:
        if acc.is_main_process:
            print(line(changed), file=sys.stderr)
        setattr(state, records, [*(getattr(state, records) or []), {"step": state.step, "was": then, "now": now}])
    setattr(state, field, now)


def _changed_keys(then: dict, now: dict) -> list[str]:
    return [k for k in sorted(set(then) | set(now)) if then.get(k) != now.get(k)]


def record(state: State) -> dict:
    """metrics.json's fields on the code: what trained the run's last steps (or evaluated it) and
    each resume under other code than before (null: none); each resume on other compute."""
    return {"code": state.code or code_versions(), "resumed_under_other_code": state.resumed_under_other_code,
            "resumed_on_other_compute": state.resumed_on_other_compute}


def start(acc: Accelerator, out: Path) -> None:
    """A run from its first step: the log lines of an attempt killed before its first checkpoint
    are dropped (they were kept, and the run's log held every step twice)."""
    if acc.is_main_process:
        runs.truncate_log(out, 0)
    acc.wait_for_everyone()


def clear_partial(acc: Accelerator, out: Path) -> None:
    """Files a kill left half-written in the run folder (metrics.json, the predictions, written
    under `<name>.<pid>.tmp` and renamed when whole) go, and a checkpoint left under `tmp-step-N`
    is settled (runs.settle_checkpoints: whole, it takes step-N's place; else it goes), before
    the run looks for a checkpoint to go on from: nothing cut short is read, and none stays
    beside the finished run's files. Said on stderr."""
    if acc.is_main_process:
        for partial in out.glob("*.tmp"):
            partial.unlink(missing_ok=True)
        # a checkpoint a kill cut short while being written (under sharding, one rank's part
        # missing) is never read: renamed step-N only when whole
        for said in runs.settle_checkpoints(out):
            print(f"note: {said}", file=sys.stderr)
    acc.wait_for_everyone()


def say_other_attempt(out: Path, recipe: Any, processes: int) -> None:
    """Before a run with no checkpoint yet: a note on stderr naming an interrupted run of the
    same recipe under another id, and what differs (`other_attempt`)."""
    note = other_attempt(out, recipe, processes)
    if note:
        print(note, file=sys.stderr)


IDENTITY = "identity.json"  # what the run id hashes, written beside recipe.yaml (train.run)


def identity(recipe: Any, processes: int) -> dict:
    """What the run id hashes (runs.run_id), part by part: the resolved recipe's settings, the
    process count, the launch's strategy (runs.strategy) and each data file's sha256."""
    return {"recipe": _flat(recipe.hashed_dict()), "processes": processes, "strategy": runs.strategy(),
            "data": {str(f): runs.data_fingerprint([Path(f)]) for f in recipe.task.data_files()}}


def _flat(tree: dict, prefix: str = "") -> dict:
    flat: dict = {}
    for key, value in tree.items():
        if isinstance(value, dict) and value:
            flat.update(_flat(value, f"{prefix}{key}."))
        else:
            flat[f"{prefix}{key}"] = value
    return flat


def other_attempt(out: Path, recipe: Any, processes: int) -> str | None:
    """A run starting from step 0 whose recipe has an interrupted run under another id (the
    recipe, its data or the process count changed since): one line naming that run and what
    differs. The changed run is a run of its own; nothing of the other is taken, nor is it
    touched (rerun it unchanged to finish it)."""
    said = other_interrupted(out, recipe, processes)
    if said is None:
        return None
    return (f"note: {said}; this is another run and starts from step 0 (the same settings and data "
            "as that one resume it)")


def other_interrupted(out: Path, recipe: Any, processes: int) -> str | None:
    """'<run> is an interrupted run of this recipe (checkpoint of step N), with <what differs>':
    the newest interrupted run of this recipe under another id than `out` (None: there is none)."""
    others = [p for p in out.parent.iterdir() if p.is_dir() and p != out and _interrupted(p)
              and runs.checkpoints(p)] if out.parent.is_dir() else []
    if not others:
        return None
    other = max(others, key=lambda p: runs.checkpoints(p)[-1].stat().st_mtime)
    now, then = identity(recipe, processes), _saved_identity(other)
    if then is not None and "processes" in then and "strategy" not in then:  # made before the record:
        way = sharding.written_under(runs.checkpoints(other)[-1])[0]  # what its checkpoint's layout says
        then["strategy"] = "none" if way == "no strategy" else way
    if then is None:
        changed = "its recipe, data or process count"
    else:
        changed = "; ".join(_differences(then, now)) or "the toolkit's run id"
    more = f" (and {len(others) - 1} more)" if len(others) > 1 else ""
    return (f"{other} is an interrupted run of this recipe (checkpoint of step {runs.last_step(other)})"
            f"{more}, with {changed}")


def _interrupted(run: Path) -> bool:
    """Not finished. One with a damaged metrics.json is neither: it is said when it is launched
    itself (runs.is_finished), not in the name of another run, which it refused (exit 2, and
    --force of that other run did not help)."""
    try:
        return not runs.is_finished(run)
    except UserError:
        return False


def _saved_identity(run: Path) -> dict | None:
    """What an earlier run hashed: identity.json, else its recipe.yaml alone (runs before it)."""
    try:
        if (run / IDENTITY).is_file():
            return runs.read_json(run / IDENTITY)
        saved = safe_yaml((run / "recipe.yaml").read_text(), str(run / "recipe.yaml"))
        saved.pop("name", None), saved.pop("smoke", None)
        return {"recipe": _flat(saved)}
    except (OSError, ValueError, AttributeError):
        return None


def _differences(then: dict, now: dict) -> list[str]:
    """'train.lr 0.001 (now 0.002)', 'train.csv changed', '2 processes (now 1)'."""
    said = []
    keys = sorted(set(then["recipe"]) | set(now["recipe"]))
    said += [f"{k} {then['recipe'].get(k)!r} (now {now['recipe'].get(k)!r})" for k in keys
             if then["recipe"].get(k) != now["recipe"].get(k) and k != "smoke"]
    if "processes" in then and then["processes"] != now["processes"]:
        said.append(f"{then['processes']} process(es) (now {now['processes']})")
    if "processes" in then:  # identity.json; one from before `strategy` is of one process or DDP
        was = then.get("strategy") or ("ddp" if then["processes"] > 1 else "none")
        if was != now["strategy"] and {was, now["strategy"]} - set(runs.NEUTRAL_STRATEGIES):
            said.append(f"STRATEGY={was} (now {now['strategy']})")
    for f in sorted(set(then.get("data", {})) | set(now["data"])) if "data" in then else []:
        if then["data"].get(f) != now["data"].get(f):
            said.append(f"{f} {'changed' if f in then['data'] and f in now['data'] else 'other files'}")
    return said


def base_files(source: str, model: torch.nn.Module) -> dict | None:
    """The files of a local base folder a resume reads again (runs.base_record): its config and
    tokenizer always (the checkpoint holds weights, not the tokenizer that made the token ids
    nor the config's dropout), and its weights where the checkpoint is lean (a LoRA, adapter or
    prompt run saves what trains, not the frozen base). No run id covers a folder's contents, nor
    which revision of a Hub id the Hub cache holds: a Hub id's cached snapshot is read the same
    way (runs.base_folder)."""
    lean = not all(p.requires_grad for p in model.parameters())
    return runs.base_record(source, runs.BASE_READ + (runs.BASE_WEIGHTS if lean else ()))


def check_base(saved: dict | None, source: str, state: State, smoke: bool = False) -> None:
    """Resuming on a base folder whose weights, config or tokenizer changed since the checkpoint
    would go on training on other weights or other token ids: one line naming the file. A file
    with its size and time as saved is not read again; a copy of the same bytes passes. A smoke
    run's base (`smoke`) is the small random model `--smoke` builds again, which another
    transformers (or toolkit) builds as another model under another cache key: resumed there, a
    LoRA run went on training on other frozen weights, only noted as a resume under other code,
    exit 0; it is refused as eval, predict and export of the run are (inference.base_checkpoint)."""
    changed = runs.base_changed(saved, source)
    step = state.step
    if changed is not None and smoke:
        import transformers

        built = (state.code or {}).get("transformers")
        raise UserError(f"a --smoke run, whose checkpoint of step {step} goes on from the small random model it "
                        f"trained on; this toolkit and transformers {transformers.__version__} build that model "
                        f"otherwise ({changed.name} differs"
                        f"{f'; the checkpoint was written under transformers {built}' if built else ''}), and the "
                        "run would go on training another model: run the recipe again with --smoke --force")
    if changed is not None:
        raise UserError(f"model.checkpoint: {changed} changed since this run's checkpoint of step {step} "
                        "was written; the run goes on from its base folder as it trained (the tokenizer "
                        "and config, and a LoRA, adapter or prompt run's frozen weights, are not in the "
                        "checkpoint): put the base back as it was, or rerun with --force to start "
                        "again on the new one")


def check_hub_data(saved: dict | None, task: Any, step: int) -> None:
    """Resuming on a Hub data set the datasets cache now holds at another revision would go on
    training on other examples (the run id names the data set, not its revision): one line."""
    changed = runs.hub_data_changed(saved, task.hub_data())
    if changed is not None:
        raise UserError(f"task: the Hub data set '{changed}' is not the revision this run's checkpoint of step "
                        f"{step} was made on (its examples differ: the cache holds another revision "
                        "now; one with the same examples goes on); the run goes on only on the data it trained on: load that revision "
                        "again, or rerun with --force to start again on the new one")


def _load_kwargs(acc: Accelerator) -> dict:
    """Not strict: a lean checkpoint holds the trainable weights only. DeepSpeed's engine saves
    its whole module and takes no such argument."""
    return {} if acc.distributed_type.value == "DEEPSPEED" else {"strict": False}


class MethodState:
    """A method's own state (Method.state_dict), saved and restored with every checkpoint through
    accelerate's `register_for_checkpointing`, on the unwrapped model."""

    def __init__(self, method: Any, model: torch.nn.Module) -> None:
        self.method, self.model = method, model

    def state_dict(self) -> dict:
        return self.method.state_dict(self.model)

    def load_state_dict(self, state: dict) -> None:
        self.method.load_state_dict(self.model, state)


def lean_weights(models_: list, weights: list, output_dir: str) -> None:
    """accelerate's save_state hook: a checkpoint holds what trains (and the buffers), not the
    frozen base a LoRA, adapter or prompt run leaves untouched; full fine-tuning keeps it all."""
    for model, state in zip(models_, weights):
        keep = {n for n, p in model.named_parameters() if p.requires_grad}
        keep |= {n for n, _ in model.named_buffers()}
        if len(keep) < len(state):
            for name in [k for k in state if k not in keep]:
                del state[name]




def load_best(model: torch.nn.Module, folder: Path, acc: Accelerator) -> None:
    """The weights accelerate's save_state wrote at the best step, into the prepared model, once
    its files are checked against the manifest (a changed byte was loaded as a weight without a
    word). Tied copies are left out of that file, hence strict=False; anything unexpected is a bug. Under
    FSDP the checkpoint is sharded (torch.distributed.checkpoint): accelerate reads it back; under
    DeepSpeed the engine reads its own."""
    from accelerate.utils import SAFE_WEIGHTS_NAME
    from safetensors.torch import load_file

    problem = runs.check_manifest(folder) or _other_run(folder, folder.parent.parent)  # as resume checks it
    if problem is not None:
        raise UserError(f"{folder}: the checkpoint of the best step, whose weights are this run's result "
                        f"(train.keep_best), is unusable ({problem}); --force runs it again")
    if sharding.is_fsdp(acc):
        from accelerate.utils.fsdp_utils import load_fsdp_model

        load_fsdp_model(acc.state.fsdp_plugin, acc, model, str(folder))
        return
    if acc.distributed_type.value == "DEEPSPEED":  # the engine's own checkpoint (weights only)
        model.load_checkpoint(str(folder), "pytorch_model", load_optimizer_states=False,
                              load_lr_scheduler_states=False)
        return
    result = acc.unwrap_model(model).load_state_dict(load_file(folder / SAFE_WEIGHTS_NAME), strict=False)
    if result.unexpected_keys:
        raise RuntimeError(f"{folder}: weights the model does not have: {result.unexpected_keys[:3]}")
