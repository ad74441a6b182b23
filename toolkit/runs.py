"""Run folders: `runs/<recipe>/<hash>/`, finished vs interrupted, atomic writes, checkpoints.

A run is finished when metrics.json exists; that file is written last and atomically, so no
folder that looks finished is ever left behind by a failure.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import math
import os
import secrets
import shutil
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from toolkit.errors import UserError, cache_folder, env_folder, user_path
from toolkit.recipe_data import Recipe


def runs_root(override: str | None = None) -> Path:
    return user_path(override) if override else env_folder("TOOLKIT_RUNS", "runs")


def world_size() -> int:
    """Processes this launch runs (torchrun / accelerate set WORLD_SIZE)."""
    return int(os.environ.get("WORLD_SIZE", "1"))


NEUTRAL_STRATEGIES = ("none", "ddp")  # one process, plain data parallel: not in a run id (as before)


def strategy() -> str:
    """This launch's distributed strategy, one name on CPU and GPU processes: 'fsdp', 'zero<stage>'
    (DeepSpeed), else 'ddp' (several processes) or 'none' (one), read from the environment
    accelerate launch gives its processes (ACCELERATE_USE_FSDP / ACCELERATE_USE_DEEPSPEED, the
    ZeRO stage from ACCELERATE_DEEPSPEED_ZERO_STAGE or the DeepSpeed config file), as accelerate
    reads it, so it is known before the Accelerator is made."""
    if os.environ.get("ACCELERATE_USE_FSDP", "false").lower() == "true":
        return "fsdp"
    if os.environ.get("ACCELERATE_USE_DEEPSPEED", "false").lower() == "true":
        return f"zero{_zero_stage()}"
    return "ddp" if world_size() > 1 else "none"


def run_command(recipe: str, rest: list[str]) -> str:
    """The command line that runs `recipe` with `rest` (overrides, flags) as this launch runs it, for
    a line that names the command to go on with a run: under a launch of several processes or a
    sharded strategy `make run NPROC=N [STRATEGY=S] RECIPE=... ARGS=...`, else `toolkit run`. A run
    id counts the processes and a sharded strategy: interrupted under `make run NPROC=2`, the line
    named `toolkit run ... --resume`, which in one process is another run ('--resume: ... was never
    started'), and without --resume trained that other run from step 0."""
    import shlex

    n, way = world_size(), strategy()
    sharded = [f"STRATEGY={way}"] if way not in NEUTRAL_STRATEGIES else []
    if n > 1 or sharded:
        return shlex.join(["make", "run", f"NPROC={n}", *sharded, "RECIPE=" + recipe, "ARGS=" + shlex.join(rest)])
    return shlex.join(["toolkit", "run", recipe, *rest])


def _zero_stage() -> int:
    """The ZeRO stage of a DeepSpeed launch, where accelerate's plugin takes it: a config file's
    `zero_optimization.stage` (DeepSpeed's default 0 when left out), else the accelerate config's
    `zero_stage` (accelerate's default 2)."""
    path = os.environ.get("ACCELERATE_DEEPSPEED_CONFIG_FILE", "none")
    if path != "none":
        try:
            zero = json.loads(Path(path).read_text(encoding="utf-8")).get("zero_optimization") or {}
            return int(zero.get("stage", 0))
        except (OSError, ValueError, TypeError, AttributeError):
            pass  # not a readable config: accelerate's own error comes at the launch
    try:
        return int(os.environ.get("ACCELERATE_DEEPSPEED_ZERO_STAGE", "2"))
    except ValueError:
        return 2


def recorded_strategy(metrics: dict) -> str:
    """The strategy a finished run ran under, from its metrics.json: `strategy` where recorded,
    else (a run from before 2026-11-28) what its `distributed_type` and `num_processes` say: FSDP
    is 'fsdp', DEEPSPEED 'deepspeed' (the ZeRO stage was not recorded), anything else 'ddp' on
    several processes and 'none' on one."""
    if isinstance(metrics.get("strategy"), str):
        return metrics["strategy"]
    kind = str(metrics.get("distributed_type") or "").upper()
    if kind == "FSDP":
        return "fsdp"
    if kind == "DEEPSPEED":
        return "deepspeed"
    processes = metrics.get("num_processes")
    return "ddp" if isinstance(processes, (int, float)) and processes > 1 else "none"


def rank() -> int:
    """This process's place in the launch (torchrun / accelerate set RANK): 0 is the one that
    holds the run's locks, writes its folder and speaks for the launch."""
    return int(os.environ.get("RANK", "0"))


def left_to_another(holder: str, command: str) -> None:
    """A point of a sweep that another process is running right now. One process leaves it to
    that process and goes on; a launch of several cannot: only rank 0 holds (and so sees) the
    locks, so its processes would go on to different points and each point's processes would
    meet the wrong partners. The launch stops instead (torchrun then stops every process)."""
    if world_size() > 1:
        raise UserError(f"{command}: {holder} right now; a sweep launched on {world_size()} processes cannot "
                        "leave a point to another process (its processes would run different points): "
                        "wait for that run to finish, then run the sweep again")


_FINGERPRINTS: dict[tuple, str] = {}


def data_fingerprint(files: list[Path]) -> str:
    """sha256 over the task's data files (contents, not names or times: a copy is the same data)."""
    digest = hashlib.sha256()
    for path in sorted(files):
        if not path.is_file():  # a missing file is the task's error to name, at load
            continue
        stat = path.stat()
        key = (str(path), stat.st_ino, stat.st_size, stat.st_mtime_ns, stat.st_ctime_ns)  # any rewrite
        if key not in _FINGERPRINTS:
            h = hashlib.sha256()
            with path.open("rb") as handle:
                for block in iter(lambda: handle.read(1 << 20), b""):
                    h.update(block)
            _FINGERPRINTS[key] = h.hexdigest()
        digest.update(_FINGERPRINTS[key].encode())
    return digest.hexdigest()


# A local base folder's files, by what reads them: the weights (what a lean run's result sits
# on), and the config and tokenizer files every load of the folder reads.
BASE_WEIGHTS = ("*.safetensors", "*.bin")
BASE_READ = ("config.json", "tokenizer*.json", "special_tokens_map.json", "added_tokens.json",
             "vocab*", "merges.txt", "*.model")
_OLD_RECORD = ("*.safetensors", "*.bin", "config.json")  # checkpoints written before the record had patterns


def _base_names(folder: Path, patterns: tuple[str, ...] | list[str]) -> list[str]:
    return sorted({p.name for pattern in patterns for p in folder.glob(pattern) if p.is_file()})


def base_folder(source: str) -> Path | None:
    """The folder a base checkpoint is read from: a local folder as named, or the snapshot of a
    Hub id in the Hub cache (which a later download moves to another revision: the id alone
    names no fixed weights); None where neither is here."""
    path = Path(source).expanduser()
    if path.is_dir():
        return path
    try:
        from huggingface_hub import try_to_load_from_cache

        found = try_to_load_from_cache(source, "config.json")
    except Exception:  # not a valid repo id
        return None
    return Path(found).parent if isinstance(found, str) else None


def base_record(source: str, patterns: tuple[str, ...]) -> dict | None:
    """{patterns, files: {name: [size, mtime_ns, sha256]}} of the files matching `patterns` in
    the folder the base `source` is read from (base_folder; None where there is none): no run id
    covers a folder's contents or a Hub id's revision, so a checkpoint or a finished run records
    what it sits on."""
    folder = base_folder(source)
    if folder is None:
        return None
    files = {name: [(folder / name).stat().st_size, (folder / name).stat().st_mtime_ns,
                    _base_digest(folder / name)] for name in _base_names(folder, patterns)}
    return {"patterns": list(patterns), "files": files}


# what transformers writes into a config it saves about itself, not about the model
_WRITER_KEYS = ("transformers_version",)


def _base_digest(path: Path) -> str:
    """A base file's fingerprint: its bytes, except that a config (config.json,
    generation_config.json) is taken as its JSON content without the `transformers_version`
    transformers stamps on every save. The same model saved again by another transformers (a
    --smoke run's small model, rebuilt after an upgrade) is the same model; by its bytes every
    smoke run was refused by eval, predict, export and resume after any upgrade."""
    if path.name.endswith("config.json"):
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            return data_fingerprint([path])
        if isinstance(data, dict):
            data = {k: v for k, v in data.items() if k not in _WRITER_KEYS}
            return "json:" + hashlib.sha256(json.dumps(data, sort_keys=True).encode()).hexdigest()
    return data_fingerprint([path])


def base_changed(saved: dict | None, source: str) -> Path | None:
    """The first file of `saved` (base_record) that changed where `source` is read from now, was
    removed, or was added (the base folder itself where it is gone); None when all are as
    recorded. A file with its size and time as recorded is not read again; the same bytes written
    anew (another time stamp, another snapshot) are unchanged."""
    if not saved:
        return None
    folder = base_folder(source)
    if folder is None:
        return Path(source)
    files, patterns = (saved["files"], saved["patterns"]) if "files" in saved else (saved, _OLD_RECORD)
    names = _base_names(folder, patterns)
    differ = sorted(set(names) ^ set(files))
    if differ:
        return folder / differ[0]
    for name in names:
        stat, (size, mtime, digest) = (folder / name).stat(), files[name]
        if (stat.st_size, stat.st_mtime_ns) != (size, mtime) and digest not in (
                _base_digest(folder / name), data_fingerprint([folder / name])):  # a record made before: bytes
            return folder / name
    return None


def result_record(model: Path) -> dict | None:
    """What a finished run's model/ holds as saved (base_record of every file in it; None where the
    run saved none: an in-context run). A file of it removed, added or changed after the run was
    loaded as the run's result (or a traceback where a weight file went), exit 0."""
    return base_record(str(model), ("*",)) if model.is_dir() else None


def result_changed(run: Path) -> str | None:
    """How the finished run's model/ differs from what its metrics.json records it saved (None: as
    saved, or no record: a run from before it)."""
    try:
        saved = read_json(run / "metrics.json").get("model_files")
    except (OSError, ValueError, AttributeError):
        return None
    if not saved:
        return None
    model = run / "model"
    changed = base_changed(saved, str(model)) if model.is_dir() else model
    if changed is None:
        return None
    if changed == model:
        return f"{model} is gone"
    said = {"gone": "is gone", "changed": "changed since the run saved it", "added": "was added since the run"}
    return f"{changed} {said[change_kind(changed, saved)]}"


def change_kind(changed: Path, saved: dict) -> str:
    """What happened to a file `base_changed` names, against the record `saved` (base_record):
    'gone' (recorded, not there now), 'changed' (recorded, other bytes) or 'added' (not recorded)."""
    return "gone" if not changed.exists() else "changed" if changed.name in saved.get("files", saved) else "added"


def hub_data_changed(saved: dict | None, now: dict | None) -> str | None:
    """The first Hub data set ("<id> <config>") of `saved` (Task.hub_data) whose splits were loaded
    now with other examples; None when all match, or where nothing was recorded (local files, or a
    record from before hub_data). A data set not loaded now (another one named on purpose) is not
    compared. Examples are compared by their content hash where both records hold one (another
    revision with the same rows is the same data: it was refused), else by datasets' fingerprint
    (a record from before the content hash: another revision is other data)."""
    for name, splits in sorted((saved or {}).items()):
        loaded = (now or {}).get(name) or {}
        if any(s in loaded and not same_hub_split(f, loaded[s]) for s, f in splits.items()):
            return name
    return None


def hub_split_parts(value: Any) -> tuple[str, str | None]:
    """(datasets fingerprint, content sha256 or None) of one split's Hub record (Task.hub_data)."""
    fingerprint, _, content = str(value).partition(" ")
    return fingerprint, content or None


def same_hub_split(a: Any, b: Any) -> bool:
    """Two records of a split hold the same examples: equal content hashes where both have one,
    else equal datasets fingerprints (one revision)."""
    (fa, ca), (fb, cb) = hub_split_parts(a), hub_split_parts(b)
    return ca == cb if ca and cb else fa == fb


def run_id(recipe: Recipe, processes: int | None = None, way: str | None = None) -> str:
    """What a run's result depends on: the resolved recipe, the number of processes (the global
    batch), the distributed strategy (`way`, this launch's `strategy()` unless given: FSDP's and
    ZeRO's reductions and, under ZeRO with half precision, its fp32 master weights are another
    computation than DDP's) and the data files' contents. Two launches that differ in any of
    these are two runs. One process and DDP are not hashed (their process counts differ already),
    so their ids are those of the runs made before the strategy was part of the id."""
    return run_id_as(recipe, "now", processes, way)


# the recipe hash and the chained upstream's id of each form of the run id: now, under the first
# canonical forms (Recipe.hash_as_first_forms), and before any (Recipe.hash_as_before)
FORMS = {"now": ("hash", "upstream_id"), "first": ("hash_as_first_forms", "upstream_id_first"),
         "before": ("hash_as_before", "upstream_id_before")}


def run_id_as(recipe: Recipe, form: str, processes: int | None = None, way: str | None = None) -> str:
    """The run id of `recipe` as the toolkit computed it under `form` (FORMS)."""
    digest_of, upstream_of = FORMS[form]
    blob = f"{getattr(recipe, digest_of)}|{processes or world_size()}|{data_fingerprint(recipe.task.data_files())}"
    way = way or strategy()
    if way not in NEUTRAL_STRATEGIES:
        blob += f"|{way}"
    # a chained run is of the run it starts from
    upstream = getattr(recipe, upstream_of, None) or getattr(recipe, "upstream_id", None)
    if upstream:
        blob += f"|{upstream}"
    return hashlib.sha256(blob.encode()).hexdigest()[:12]


def run_ids(recipe: Recipe, processes: int | None = None, way: str | None = None) -> list[str]:
    """The run id, then the ids the same launch had under the first canonical forms of the recipe
    hash (before the data files' one form and NO_EFFECT) and before any (Recipe.hash_as_before: a
    set-like list as written, a derived default written out, a chained run's reference as
    spelled), where those differ: a run made then sits in that folder."""
    ids: list[str] = []
    for form in FORMS:
        found = run_id_as(recipe, form, processes, way)
        if found not in ids:
            ids.append(found)
    return ids


def run_dir(recipe: Recipe, root: Path, processes: int | None = None, way: str | None = None) -> Path:
    """The run's folder: `<root>/<name>/<run id>`, or the folder of its id from before the
    canonical forms where only that one exists (a run made then, finished or to resume, is the
    same computation: it is found, not trained again beside it)."""
    ids = run_ids(recipe, processes, way)
    folders = [root / recipe.name / i for i in ids]
    return next((f for f in folders if f.exists()), folders[0])


@contextmanager
def locked(out: Path, folder: bool = False):
    """One process at a time per run folder. flock is released by the kernel when its holder
    dies, so a killed run never leaves the lock stuck. With `folder`, the run folder itself is
    locked too (made if need be, removed again if left empty): the lock in the cache binds only
    processes that share $TOOLKIT_CACHE, and two launches with different caches (two users, two
    machines on one shared runs folder) trained into one folder at once."""
    if int(os.environ.get("RANK", "0")) != 0:  # rank 0 holds it for the whole launch
        yield
        return
    with _cache_lock(out):
        if not folder:
            yield
            return
        with _folder_lock(out):
            yield


def run_elsewhere(out: Path) -> str | None:
    """Who is running the run `out` right now ("<out> is being run by process N"), None when no
    one is: a sweep leaves such a point to that process and goes on with its next one (two
    sweeps of one grid at once share it out, where the second stopped at the first point the
    other held). Asked by taking the run's locks and letting them go."""
    try:
        with locked(out, folder=True):
            return None
    except Busy as exc:  # any other refusal is no holder: it is raised as itself
        return holder_of(exc)


def holder_of(busy: Busy) -> str:
    """'<out> is being run by process N' of a refusal for a lock held elsewhere, read from the
    refusal's fields (the folder, the lock file's holder), never parsed back out of its message:
    a runs folder whose path held " right now" was cut there, the holder said as part of a path."""
    return f"{busy.folder} is being run by {busy.holder}"


def took_over(busy: Busy, out: Path) -> bool:
    """Whether `busy` is the lock of the run folder `out` itself (not of a chained run's upstream
    it trains first, nor anything else the run holds): only then is the point another process's."""
    try:
        return Path(busy.folder).resolve() == Path(out).resolve()
    except OSError:
        return False


@contextmanager
def reading(out: Path, doing: str):
    """A finished run's folder held while an entry point after training reads or writes it
    (`eval` writes eval-*.json, `predict --glue-test` its files, `export` and `predict` read
    model/): a shared flock on both of the run's locks, so any number of them go side by side,
    while a `run --force` (or a resume) of the same run, which holds them exclusively, is one line
    either way round. Without it an eval during a --force rerun scored the old model (or half of
    it) and wrote eval-*.json into the folder being cleared and trained, exit 0. `doing` names
    the entry point (`eval`), for the line a refused run says."""
    if int(os.environ.get("RANK", "0")) != 0:  # rank 0 holds it for the whole launch
        yield
        return
    handle = _lock_file(out).open("a+")
    try:
        fd = os.open(out, os.O_RDONLY)  # a run folder (the entry points checked it is one)
    except OSError:
        handle.close()
        raise
    try:
        for lock in (handle, fd):
            try:
                fcntl.flock(lock, fcntl.LOCK_SH | fcntl.LOCK_NB)
            except BlockingIOError:
                handle.seek(0)
                holder = handle.read().strip() if lock is handle else ""
                raise UserError(f"{out} is being trained by {holder or 'another process'} right now (a run, a "
                                f"--force rerun or a resume of it); {doing} it once that has finished") from None
        handle.seek(0)
        handle.truncate()
        handle.write(f"process {os.getpid()} ({doing} of the finished run)")
        handle.flush()
        yield
    finally:
        os.close(fd)  # closing releases the flocks
        handle.close()


class Busy(UserError):
    """Another process holds `folder`'s lock right now (a run of it, or an export into it). A
    sweep whose point it is leaves that point to the holder and goes on (`api.sweep`, the CLI's
    sweep through its child's exit code): the sweep's own check that the point is free (its
    `run_elsewhere`) comes before the point's run takes the lock, seconds later where a child
    process imports torch first, and two sweeps started at once both found their first point free;
    the loser's refusal stopped its whole sweep (exit 2)."""

    def __init__(self, message: str, folder: Path, holder: str = "another process") -> None:
        super().__init__(message)
        self.folder = folder
        self.holder = holder  # who holds the lock, as its lock file says ("process N"), for `holder_of`


def flock_held(folder: Path, busy: str) -> int:
    """An open descriptor of `folder` holding its exclusive flock (on the directory itself: no
    file is added to it); the caller unlocks and closes it. `busy`: the Busy (UserError) line where
    another process holds it (which one a directory's flock does not say: "another process")."""
    fd = os.open(folder, os.O_RDONLY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        raise Busy(busy, folder) from None
    return fd


@contextmanager
def _folder_lock(out: Path):
    """flock on the run folder's own directory: no file is added to it."""
    made = [p for p in [out, *out.parents] if not p.exists()]
    out.mkdir(parents=True, exist_ok=True)
    fd = flock_held(out, f"{out} is being run by another process right now (one that uses another "
                         "$TOOLKIT_CACHE); wait for it to finish (or use another --runs-dir)")
    try:
        yield
    finally:
        fcntl.flock(fd, fcntl.LOCK_UN)
        os.close(fd)
        for path in (p for p in made if p.exists()):  # nothing written: the folders this launch made go
            try:
                path.rmdir()
            except OSError:  # not empty: the run wrote there
                break


def check_utf8(path: Path | str, what: str) -> None:
    """A path the libraries read or write (tokenizers saves and loads through Rust, which takes
    UTF-8 only) holding bytes that are not UTF-8 (Python keeps them as lone surrogates): one line
    before anything starts, not a UnicodeEncodeError once a run has trained."""
    try:
        os.fspath(path).encode("utf-8")
    except UnicodeEncodeError:
        raise UserError(f"{what}: {ascii(os.fspath(path))} holds bytes that are not UTF-8, which the "
                        "tokenizers library cannot read or write; rename it or choose another") from None


def _lock_file(out: Path) -> Path:
    """The run's lock file. Locks live in the cache, not the runs folder: a run refused early
    leaves no folder behind."""
    folder = cache_folder("locks")
    return folder / (hashlib.sha256(os.fsencode(out.resolve())).hexdigest()[:24] + ".lock")


@contextmanager
def _cache_lock(out: Path):
    handle = _lock_file(out).open("a+")
    try:
        fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        handle.seek(0)
        holder = handle.read().strip() or "another process"
        handle.close()
        raise Busy(f"{out} is being run by {holder} right now; wait for it to finish (or "
                   "use another --runs-dir)", out, holder) from None
    handle.seek(0)
    handle.truncate()
    handle.write(f"process {os.getpid()}")
    handle.flush()
    try:
        yield
    finally:
        fcntl.flock(handle, fcntl.LOCK_UN)
        handle.close()


def clear(path: Path) -> None:
    """Everything in a run folder (--force), the folder itself kept: a run holds its lock on it.
    metrics.json, the mark of a finished run, goes first: a clearing stopped half-way (Ctrl-C, a
    kill) left it beside a half-removed model/, and the next run said "finished already"."""
    if not (path / "metrics.json").is_dir():  # a folder there (check_checkpoints_folder) goes with the rest
        (path / "metrics.json").unlink(missing_ok=True)
    for child in path.iterdir() if path.is_dir() else []:
        if child.is_dir() and not child.is_symlink():
            shutil.rmtree(child)
        else:
            child.unlink()


def is_finished(path: Path) -> bool:
    """metrics.json is there and reads as a JSON object. A damaged one (a copy cut short, a hand
    edit) is one line: it used to count as finished, so `run` said "finished already" (exit 0),
    a sweep skipped it, and only the report found it."""
    file = path / "metrics.json"
    if not file.is_file():
        return False
    try:
        data = json.loads(file.read_text(encoding="utf-8"))
        reason = None if isinstance(data, dict) else "not a JSON object"
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        reason = exc.msg if isinstance(exc, json.JSONDecodeError) else "not UTF-8"
    if reason:
        raise UserError(f"{file}: damaged ({reason}), so the run is not finished; --force runs it again "
                        "(or remove that folder)")
    return True


def check_run_place(path: Path) -> None:
    """The run folder `path`, or a folder above it, is no file (or link to nowhere): the run said
    `runs/r/<id>: not a directory` (it was `runs/r` that was a file) or `runs/r/<id>: file exists`,
    which name neither the file in the way nor what to do. `--force` does not remove it: it is
    not the run's."""
    place = file_in_the_way(path)
    if place is not None:
        what = "a file" if place.is_file() else "a broken link" if not place.exists() else "no folder"
        goes = "the run's folder goes" if place == path else f"a folder above the run's folder ({path}) goes"
        raise UserError(f"{place}: is {what}, where {goes}; move it away, or use another --runs-dir")


def file_in_the_way(folder: Path) -> Path | None:
    """The nearest of `folder` and the folders above it that is there and no folder (a file, a
    link to nowhere), which making `folder` fails on; None where it is or can be made. The error
    of that making names `folder` ("not a directory", "file exists"), not the file in the way."""
    for place in (folder, *folder.parents):
        if place.is_dir():
            return None
        if place.exists() or place.is_symlink():
            return place
    return None


def check_checkpoints_folder(path: Path) -> None:
    """A run folder whose `checkpoints` is something other than a folder (a file put in its place):
    no checkpoint was found there, so the run started again from step 0 without a word and failed
    at its first save (`checkpoints/tmp-step-N: not a directory`) after training up to it. One
    line naming it, before anything runs."""
    folder = path / "checkpoints"
    if (folder.exists() or folder.is_symlink()) and not folder.is_dir():
        what = "a file" if folder.is_file() else "a broken link" if not folder.exists() else "no folder"
        raise UserError(f"{folder}: is {what}, not the folder of the run's checkpoints; move it away (a run "
                        "keeps its checkpoints there), or --force starts the run again from step 0 and removes it")
    for name in RUN_FOLDERS:  # a file where the run writes a folder: it trained whole, then failed making it
        there = path / name
        if (there.exists() or there.is_symlink()) and not there.is_dir():
            what = "a file" if there.is_file() else "a broken link" if not there.exists() else "no folder"
            raise UserError(f"{there}: is {what}, where the run writes its folder {name}/; move it away (or "
                            "remove it), or --force starts the run again from step 0 and removes it")
    for name in RUN_FILES:  # a folder where the run writes a file: it trained whole, then failed writing it
        if (path / name).is_dir():
            raise UserError(f"{path / name}: is a folder, where the run writes its file {name}; move it away "
                            "(or remove it), or --force starts the run again from step 0 and removes it")


RUN_FILES = ("recipe.yaml", "identity.json", "log.jsonl", "metrics.json")  # what every run writes into its folder
RUN_FOLDERS = ("model", "tracking")  # the folders it makes there (checkpoints/: said above)


def checkpoints(path: Path) -> list[Path]:
    """Step checkpoints, oldest first. A folder is named step-N only once whole (save renames it
    from tmp-step-N), so one without its state file is a damaged checkpoint, not none: it is
    listed, and resume says it is unusable (it was passed over as if never written)."""
    folder = path / "checkpoints"
    if not folder.is_dir():
        return []
    found = [p for p in folder.glob("step-*") if p.is_dir() and p.name.split("-")[1].isdigit()]
    return sorted(found, key=step_of)


def has_checkpoint(path: Path) -> bool:
    """A checkpoint to go on from: a `step-N`, or a whole one a kill left under `tmp-step-N`
    (settle_checkpoints keeps it). Every process of a launch gets the same answer, whether rank 0
    has settled them yet or not."""
    folder = path / "checkpoints"
    return bool(checkpoints(path)) or folder.is_dir() and any(_whole(p) for p in folder.glob("tmp-step-*"))


def settle_checkpoints(path: Path) -> list[str]:
    """What a kill left under `checkpoints/tmp-step-N` (a checkpoint is written there and renamed
    step-N when whole), settled before anything looks for a checkpoint; returns what was done, one
    sentence each. One that is whole (its trainer_state.json, written last, is there and every file
    matches its manifest) is step N's newest state and takes step-N's place: saving a step again
    (`train.save_every` then its evaluation, or a stale newer step) removes the older step-N just
    before the rename, and a kill in between left the only whole copy of the step under the
    temporary name, which was deleted as partial (the run went back to an older checkpoint, or
    with `train.save_total_limit` 1 said none was usable, or started again from step 0). Any
    other is cut short: removed, never read."""
    done = []
    for partial in sorted((path / "checkpoints").glob("tmp-step-*")) if (path / "checkpoints").is_dir() else []:
        folder = partial.with_name(partial.name[len("tmp-"):])
        if _whole(partial) and folder.name.split("-")[1].isdigit():
            if folder.exists():
                shutil.rmtree(folder)  # killed here, the next settle does the same again
            os.replace(partial, folder)
            sync_tree(folder.parent, files=False)
            done.append(f"{partial} is a whole checkpoint a stopped attempt was renaming: kept as {folder.name}")
        else:
            shutil.rmtree(partial, ignore_errors=True)
            done.append(f"{partial} is the checkpoint a stopped attempt was writing, not whole: not used (the "
                        "run goes on from the newest whole checkpoint, if any), removed")
    return done


def _whole(folder: Path) -> bool:
    """Written by this toolkit to the end: a manifest in its state file, and every file as listed."""
    try:
        listed = read_json(folder / "trainer_state.json").get("manifest")
    except (ValueError, OSError, AttributeError):
        return False
    return bool(listed) and check_manifest(folder) is None


def step_of(checkpoint: Path) -> int:
    return int(checkpoint.name.split("-")[1])


def last_step(path: Path) -> int | None:
    """The step of the newest checkpoint, None before the first (what Ctrl-C says was kept)."""
    saved = checkpoints(path)
    return step_of(saved[-1]) if saved else None


def finite(data: Any) -> Any:
    """NaN and infinities as null: strict JSON, which every reader parses."""
    if isinstance(data, float) and not math.isfinite(data):
        return None
    if isinstance(data, dict):
        return {k: finite(v) for k, v in data.items()}
    if isinstance(data, (list, tuple)):
        return [finite(v) for v in data]
    return data


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def manifest(folder: Path) -> dict[str, list]:
    """{relative path: [size, sha256]} of every file in a checkpoint folder."""
    return {str(p.relative_to(folder)): [p.stat().st_size, _sha256(p)]
            for p in sorted(folder.rglob("*")) if p.is_file()}


def state_digest(fields: dict) -> str:
    """sha256 of a checkpoint's trainer_state.json fields beside its manifest and this digest: the
    manifest covers every other file, and an edited state (a step, a best metric, the data
    position) was resumed from as written, exit 0."""
    return hashlib.sha256(json.dumps(finite(fields), sort_keys=True, allow_nan=False).encode()).hexdigest()


def check_manifest(folder: Path) -> str | None:
    """What is wrong with a checkpoint (a missing, truncated or changed file, its state file
    included), or None. Checkpoints written before manifests existed are taken as they are."""
    if not (folder / "trainer_state.json").is_file():
        return "trainer_state.json is missing"
    try:
        saved = read_json(folder / "trainer_state.json")
        listed = saved.get("manifest")
    except (ValueError, OSError, AttributeError) as exc:
        return f"trainer_state.json unreadable: {type(exc).__name__}"
    sealed = saved.get("state_sha256")
    if sealed is not None and state_digest({k: v for k, v in saved.items()
                                            if k not in ("manifest", "state_sha256")}) != sealed:
        return "trainer_state.json changed since it was written"
    # the digest does not cover the manifest: one emptied or dropped by hand (where the digest says
    # the checkpoint was written with one) passed every file unchecked, one of another shape raised
    if (sealed is not None or listed) and not _manifest_shape(listed):
        return "trainer_state.json's manifest is missing or not as written"
    for rel, (size, digest) in (listed or {}).items():
        path = folder / rel
        if not path.is_file():
            return f"{rel} is missing"
        if path.stat().st_size != size:
            return f"{rel} has {path.stat().st_size} bytes, not {size}"
        if _sha256(path) != digest:
            return f"{rel} changed since it was written"
    return None


def _manifest_shape(listed: Any) -> bool:
    """A manifest as `manifest` writes it: {relative path: [size, sha256]}, not empty."""
    return isinstance(listed, dict) and bool(listed) and all(
        isinstance(v, list) and len(v) == 2 and isinstance(v[0], int) and isinstance(v[1], str) for v in listed.values())


def follow_umask(folder: Path) -> None:
    """Every file and folder under `folder` (a run's model/, a checkpoint, an export, as just
    written), `folder` itself included, with the mode a new one of its kind gets there (open's 0666,
    mkdir's 0777, less the umask, or what the folder's default ACL says): safetensors' writer makes
    its files 0600 whatever the umask, so a group sharing a runs folder (umask 002) could not read
    one another's weights (`toolkit eval` of a teammate's run: PermissionError), where every JSON
    beside them was readable; a copied folder (a bottleneck export's, copied from model/) kept the
    mode model/ was made with, not the exporter's. Found by making a file and a folder there, as
    those beside them were made; one made narrower on purpose has no writer here."""
    tag = f".mode-{os.getpid()}-{secrets.token_hex(4)}"
    os.close(os.open(folder / tag, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o666))
    try:
        file_mode = (folder / tag).stat().st_mode & 0o777
    finally:
        (folder / tag).unlink()
    os.mkdir(folder / f"{tag}.d", 0o777)
    try:
        dir_mode = (folder / f"{tag}.d").stat().st_mode & 0o777
    finally:
        (folder / f"{tag}.d").rmdir()
    for path in [folder, *folder.rglob("*")]:
        if path.is_symlink() or not (path.is_file() or path.is_dir()):
            continue
        mode = file_mode if path.is_file() else dir_mode
        if path.stat().st_mode & 0o777 != mode:
            path.chmod(mode)


def write_whole(path: Path, text: str | bytes) -> None:
    """`text` (or bytes) at `path`, whole or not at all: written to a temporary file of this
    call's own beside it (`<name>.<pid>-<random>.tmp`) and renamed over it. A kill leaves the
    old file; two writers at once (two `toolkit eval` of one run, two threads of the API, two
    predicts to one --output) each rename their own whole file, where a temporary name they
    shared was truncated by one while the other renamed it (a cut file, or FileNotFoundError).
    What a killed writer left (its process gone) is removed here."""
    write_all_whole({path: text})


def write_all_whole(files: dict[Path, str | bytes]) -> None:
    """Several files, as `write_whole` writes one, all or none: every one is written to its own
    temporary file first, and only then are they renamed (a full disk at MNLI's second GLUE
    submission file left the first new beside an older submission's second)."""
    for path in files:  # before anything is written: the files are all written or none is
        check_file_place(path)
    temporaries: dict[Path, Path] = {}
    path = next(iter(files), Path("."))
    try:
        for path, text in files.items():
            _remove_stale_temporaries(path)
            tmp = path.with_name(f"{path.name}.{os.getpid()}-{secrets.token_hex(4)}.tmp")  # mode as umask says
            temporaries[path] = tmp
            tmp.write_bytes(text.encode("utf-8") if isinstance(text, str) else text)  # the name is this call's alone
        for path, tmp in temporaries.items():
            os.replace(tmp, path)
    except BaseException as exc:
        for tmp in temporaries.values():
            Path(tmp).unlink(missing_ok=True)
        if isinstance(exc, OSError) and exc.errno is not None:
            # said of the user's file: the temporary (`report.md.123-ab12cd34.tmp`) is a name the
            # user never gave, and a full disk's write() names no file at all ("writing a file")
            raise type(exc)(exc.errno, exc.strerror, os.fspath(path)) from None
        raise


def check_file_place(path: Path) -> None:
    """`path`, a file a writer is about to write whole, is not a folder (or a link to one) put in
    its place: the rename over it failed after the work was done (a whole evaluation, a report's
    plots written beside the last report.md), and the line named the writer's temporary file,
    `report.md.123-ab12cd34.tmp: is a directory`, a name the user never gave."""
    if path.is_dir():
        raise UserError(f"{path}: is a folder, where the file {path.name} is written; move it away "
                        "(or remove it) and run this again")


def _remove_stale_temporaries(path: Path) -> None:
    """`write_whole`'s temporary files beside `path` whose writer process no longer exists."""
    import glob

    for stale in path.parent.glob(f"{glob.escape(path.name)}.*-*.tmp"):
        pid = stale.name[len(path.name) + 1:].split("-")[0]
        if pid.isdigit() and not _alive(int(pid)):
            stale.unlink(missing_ok=True)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process: alive
        return True
    return True


def json_text(data: Any) -> str:
    return json.dumps(finite(data), indent=2, sort_keys=False, allow_nan=False) + "\n"


def write_json(path: Path, data: Any) -> None:
    write_whole(path, json_text(data))


LINE_BREAKS = {"\u0085": "\\u0085", "\u2028": "\\u2028", "\u2029": "\\u2029"}


def jsonl_line(row: dict) -> str:
    """One JSON line, text kept as written (ensure_ascii off), except the characters that
    Python's str.splitlines() and some JSONL readers break a line at besides \\n (NEL, U+2028,
    U+2029: json.dumps leaves them raw), which are escaped: a generated text or a context holding
    one was read back as two broken rows. NaN and infinities are null, as in every JSON file the
    toolkit writes (`finite`): `NaN`/`Infinity` are not JSON, and strict readers refuse the line."""
    line = json.dumps(finite(row), ensure_ascii=False, allow_nan=False)
    for raw, escaped in LINE_BREAKS.items():
        line = line.replace(raw, escaped)
    return line + "\n"


def write_predictions(path: Path, rows: list[dict], files: dict[str, Any], retired: tuple[str, ...] = ()) -> None:
    """predictions.jsonl and, beside it, a task's `prediction_files` as `<stem>.NAME.json`; the
    `retired` names (`Task.retired_prediction_files`) an older run or eval left there go."""
    write_all_whole(prediction_texts(path, rows, files))
    retire_prediction_files(path, files, retired)


def prediction_texts(path: Path, rows: list[dict], files: dict[str, Any]) -> dict[Path, str]:
    """What `write_predictions` writes: {file: its text}, to be written all or none."""
    texts = {path: "".join(jsonl_line(row) for row in rows)}
    for name, content in files.items():
        texts[path.with_name(f"{path.stem}.{name}.json")] = json_text(content)
    return texts


def retire_prediction_files(path: Path, files: dict[str, Any], retired: tuple[str, ...]) -> None:
    for name in retired:
        if name not in files:
            path.with_name(f"{path.stem}.{name}.json").unlink(missing_ok=True)


def read_json(path: Path) -> Any:
    return json.loads(path.read_text())


def prune(path: Path, keep: int, protect: int | None = None, upto: int | None = None) -> None:
    """Keep the newest `keep` step checkpoints up to step `upto` (the one just written), and step
    `protect` (the best model's weights). Called only once the new one is whole and on disk.
    Checkpoints past `upto` are left by an attempt whose newest was unusable (the resume went back
    to an earlier one): they are of no step this run reaches again unwritten, and counted as the
    newest they made rotation delete the checkpoint just written."""
    found = checkpoints(path)
    stale = [p for p in found if upto is not None and step_of(p) > upto]
    ours = [p for p in found if p not in stale]
    for old in stale + ours[:-keep]:
        if protect is None or old.name != step_name(protect):
            shutil.rmtree(old, ignore_errors=True)


def sync_tree(folder: Path, files: bool = True) -> None:
    """fsync every file below `folder` (with `files`), then its folders and `folder` itself: a
    rename of an unsynced folder can survive a power cut or a host crash with files cut short,
    and rotation had by then deleted the older checkpoints."""
    below = sorted(folder.rglob("*")) if files else []
    for path in [p for p in below if p.is_file()] + [p for p in below if p.is_dir()] + [folder]:
        fsync(path)


def fsync(path: Path) -> None:
    """One file or folder to disk. A file system that cannot fsync a folder is let be: the
    files' fsync is what there is."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        if path.is_file():
            raise
        return
    try:
        os.fsync(fd)
    except OSError:
        if path.is_file():
            raise
    finally:
        os.close(fd)


def step_name(step: int) -> str:
    return f"step-{step:06d}"


def append_log(path: Path, entry: dict) -> None:
    with (path / "log.jsonl").open("a") as handle:
        handle.write(json.dumps(finite(entry), allow_nan=False) + "\n")


def check_log(path: Path, step: int, logged: int | None = None) -> None:
    """A run going on from the checkpoint of `step` needs its log of the steps before: every run
    logs its first step (train.py), so a log that is gone (deleted between launches) or holds no
    line of step 1 is one line, as a checkpoint with a file gone is. The resumed run wrote a log
    starting at the checkpoint instead, exit 0: the curve the report and trackers read lacked
    its early steps, the time per step was the resumed part's. `logged`: the step of the last
    line written before the checkpoint (its state's `logged`; None: a checkpoint from before the
    record). A log without it lost its last lines before the checkpoint (a host crash or power cut
    takes the log's unsynced tail, now synced with each checkpoint; a log cut by hand), and the
    resumed run's log had a hole there, exit 0."""
    log = path / "log.jsonl"
    lines = log.read_text(errors="replace").splitlines() if log.is_file() else []
    steps = {_step_of_line(line) for line in lines}
    if step >= 1 and 1 not in steps:
        why = "is gone" if not log.is_file() else "holds no line of step 1 (every run logs it)"
    elif step >= 1 and logged is not None and logged not in steps:
        last = max((s for s in steps if isinstance(s, int)), default=None)
        why = (f"holds no line of step {logged}, the last one written before the checkpoint of step {step} "
               f"(it ends at step {last}: its lines after that were lost)")
    else:
        return
    raise UserError(f"{log}: {why}, so going on from the checkpoint of step {step} would give the run a log "
                    "without its steps before that; put the run's log.jsonl back, or --force starts the "
                    "run again from step 0")


def _step_of_line(line: str) -> Any:
    try:
        return json.loads(line).get("step")
    except (ValueError, AttributeError):  # a line cut short by a kill
        return None


def truncate_log(path: Path, step: int, evaluated: bool = True) -> None:
    """On resume, drop log lines an interrupted run wrote after its last checkpoint: those of
    later steps, and (`evaluated` False) an evaluation of the checkpoint's own step that its state
    does not hold. A step can be saved before it is evaluated (`save_every` at an epoch's end or
    at the last step); killed between the two, the resumed run evaluates that step again, and its
    log held the evaluation twice. The kept lines replace the log whole (`write_whole`): rewritten
    in place, a kill during the rewrite left the log empty or cut, and the run's earlier steps
    were gone from it for good."""
    log = path / "log.jsonl"
    if not log.is_file():
        return
    keep = []
    for line in log.read_text(errors="replace").splitlines():
        try:
            entry = json.loads(line)
            if entry["step"] < step or entry["step"] == step and (evaluated or "eval" not in entry):
                keep.append(line)
        except (ValueError, KeyError, TypeError):  # a line cut short by a kill
            continue
    write_whole(log, "".join(line + "\n" for line in keep))
