"""The README and docs/ link to files and headings that exist (GitHub's heading anchors)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces to hyphens."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def anchors(page: Path) -> set[str]:
    return {slug(m.group(1)) for m in re.finditer(r"^#+\s+(.*)$", page.read_text(), re.M)}


def test_slug_follows_githubs_rule() -> None:
    assert slug("`make bench`: speed against transformers' Trainer") == "make-bench-speed-against-transformers-trainer"
    assert slug("Numbers") == "numbers"


def test_every_relative_link_and_anchor_resolves() -> None:
    broken = []
    for page in PAGES:
        for target in re.findall(r"\]\(([^)\s]+)\)", page.read_text()):
            if re.match(r"[a-z]+:", target):
                continue
            path, _, anchor = target.partition("#")
            dest = (page.parent / path).resolve() if path else page
            if not dest.exists():
                broken.append(f"{page.name}: {target} (no such file)")
            elif anchor and dest.suffix == ".md" and anchor not in anchors(dest):
                broken.append(f"{page.name}: {target} (no such heading)")
    assert not broken, broken


def numbers_rows() -> tuple[list[str], list[list[str]]]:
    """The summary table of docs/numbers.md: its header and rows as cells (`\\|` inside a cell kept)."""
    text = (ROOT / "docs" / "numbers.md").read_text()
    section = text.split("\n## Summary\n", 1)[1].split("\n## ", 1)[0]
    lines = [l for l in section.splitlines() if l.startswith("|") and not l.startswith("|---")]
    cells = [[c.strip() for c in re.split(r"(?<!\\)\|", l)[1:-1]] for l in lines]
    return cells[0], cells[1:]


COMMAND = re.compile(r"`(?:[A-Z_]+=\S+ )*(make|toolkit|python|bash) [^`]*`|`make [a-z-]+`|`(make|toolkit) [^`]+`")


def test_every_figure_in_numbers_names_its_command_and_date() -> None:
    header, rows = numbers_rows()
    assert header == ["what", "result", "command", "measured", "detail"] and len(rows) >= 10
    unnamed = [r[0] for r in rows if not COMMAND.search(r[2])]
    undated = [r[0] for r in rows if re.search(r"\d", r[1]) and not re.search(r"\b20\d\d-\d\d-\d\d\b", r[3])]
    assert not unnamed and not undated, (unnamed, undated)
    assert "see the page" not in " ".join(r[2] for r in rows)


def test_no_test_count_or_suite_time_is_typed_by_hand() -> None:
    """Counts and times of the suite are what `make test` prints, not README text."""
    text = (ROOT / "README.md").read_text()
    assert not re.search(r"\b\d{3,} tests\b|\btests in \d|suite[^.\n]*\d+m\d\ds|about \d+ minutes on 2 cores", text)


def test_readme_is_a_front_door() -> None:
    """The README is read in five minutes: at most about 250 lines; the rest lives in docs/."""
    assert len((ROOT / "README.md").read_text().splitlines()) <= 250


# What the pages name (commands, options, recipes, make targets) is what the toolkit has.

def code_texts(page: Path):
    """Each line of the page's fenced blocks and each inline code span: where a page shows a command."""
    text = page.read_text()
    for block in re.findall(r"```[^\n]*\n(.*?)```", text, re.S):
        yield from block.splitlines()
    yield from re.findall(r"`([^`\n]+)`", re.sub(r"```.*?```", "", text, flags=re.S))


def subcommand_options() -> tuple[dict[str, set[str]], set[str]]:
    from toolkit.cli import _options, _subparsers, parser

    p = parser()
    return {name: set(_options(sub)) - {"--help", "--verbose"} for name, sub in _subparsers(p).items()}, set(_options(p))


def synopses(page: str) -> dict[str, set[str]]:
    """The options each `toolkit SUB ...` line of the page's fenced blocks shows, by subcommand."""
    options, _ = subcommand_options()
    shown: dict[str, set[str]] = {}
    for block in re.findall(r"```[^\n]*\n(.*?)```", (ROOT / "docs" / page).read_text(), re.S):
        for line in block.splitlines():
            m = re.match(r"toolkit (\w+)", line)
            if m and m.group(1) in options:
                shown.setdefault(m.group(1), set()).update(re.findall(r"(?<![\w-])--[a-z][a-z-]*", line.split("#")[0]))
    return shown


@pytest.mark.parametrize("page", ["cli.md", "benchmarks.md"])
def test_a_synopsis_shows_exactly_the_options_of_its_subcommand(page: str) -> None:
    """docs/cli.md's synopsis lists every subcommand and every option it takes (`-v` aside), and so
    do the sweep and report synopses of docs/benchmarks.md: `cp --force` and `sweep --estimate`
    were missing from them."""
    options, _ = subcommand_options()
    shown = synopses(page)
    assert page != "cli.md" or set(shown) == set(options), set(shown) ^ set(options)
    wrong = {name: shown[name] ^ options[name] for name in shown if shown[name] != options[name]}
    assert shown and not wrong, wrong


# Options the pages name as refused, on purpose (the line they get is the point of the example).
REFUSED_IN_DOCS = {("sweep", "--seed")}


def test_every_option_a_page_gives_a_toolkit_command_is_one_it_takes() -> None:
    """`toolkit SUB ... --opt` in any README or docs/ command: --opt is an option of SUB."""
    options, top = subcommand_options()
    command = re.compile(r"\btoolkit(?: -v)? (%s)\b([^;#|]*)" % "|".join(options))
    wrong = set()
    for page in PAGES:
        for code in code_texts(page):
            for sub, rest in command.findall(code):
                wrong |= {(page.name, sub, o) for o in re.findall(r"(?<![\w-])--[a-z][a-z-]*", rest)
                          if o not in options[sub] | top and (sub, o) not in REFUSED_IN_DOCS}
    assert not wrong, sorted(wrong)


def brace_expand(text: str) -> list[str]:
    m = re.search(r"\{([^{}]*)\}", text)
    if not m:
        return [text]
    return [x for alt in m.group(1).split(",") for x in brace_expand(text[:m.start()] + alt + text[m.end():])]


def test_brace_expand() -> None:
    assert brace_expand("a/{b,c}-{x,y}.yaml") == ["a/b-x.yaml", "a/b-y.yaml", "a/c-x.yaml", "a/c-y.yaml"]


def test_every_recipe_a_page_names_is_shipped() -> None:
    """`recipes/glue/{sst2,rte}/` paths (braces and globs expanded) and shipped names given to a
    command (`toolkit run demo/own-data/minilm-lora`) exist under recipes/."""
    recipes = ROOT / "recipes"
    tops = "|".join(p.name for p in recipes.iterdir() if p.is_dir())
    path = re.compile(r"\brecipes/((?:%s|\{)[\w.{},*/-]*)" % tops)
    name = re.compile(r"(?<![\w/.$-])((?:%s)/[\w.{},-]+/[\w{},.-]+)" % tops)
    missing = []
    for page in PAGES:
        text = page.read_text()
        for found in path.findall(text):
            for p in brace_expand(found.rstrip(".,")):
                if not (list(recipes.glob(p)) if "*" in p else (recipes / p).exists()):
                    missing.append(f"{page.name}: recipes/{p}")
        for code in code_texts(page):
            if not re.search(r"\btoolkit (run|cp|validate|sweep)\b|RECIPE=|PRETRAIN=|FINETUNE=", code):
                continue
            for found in name.findall(code):
                for p in brace_expand(found.rstrip(".,").removesuffix(".yaml")):
                    if not (recipes / f"{p}.yaml").exists():
                        missing.append(f"{page.name}: {p}")
    assert not missing, missing


def test_every_make_target_a_page_names_exists_and_make_md_lists_them_all() -> None:
    makefile = (ROOT / "Makefile").read_text()
    targets = set(re.findall(r"^([a-z][\w-]*):", makefile, re.M))
    named = {(page.name, t) for page in PAGES for code in code_texts(page)
             for t in re.findall(r"^make ([a-z][\w-]*)", code.strip())}
    assert {t for _, t in named} and not {(p, t) for p, t in named if t not in targets}
    listed = set(re.findall(r"^\| `make ([a-z][\w-]*)", (ROOT / "docs" / "make.md").read_text(), re.M))
    listed |= set(re.findall(r"`make ([a-z][\w-]*)`", (ROOT / "docs" / "make.md").read_text()))
    assert targets <= listed, targets - listed


# Named as run before benchmarks/bench and benchmarks/parity were split into packages (numbers.md
# says so); "my recipes/r.yaml" is make.md's example of a path with a space.
NOT_FILES = {"benchmarks/bench.py", "benchmarks/parity.py", "recipes/r.yaml"}


def test_every_file_a_page_names_in_the_checkout_exists() -> None:
    """A path under one of the checkout's folders (`toolkit/tasks/_fields.py`, `tests/test_x.py`,
    `docs/parity/cpu-qa-*.json`, `.ci/run`) names a file or folder that is there."""
    tops = sorted(p.name for p in ROOT.iterdir() if p.is_dir() and (p.name == ".ci" or not p.name.startswith("."))
                  and p.name not in {"runs", "build"} and not p.name.endswith(".egg-info"))
    path = re.compile(r"(?<![\w$/.~-])((?:%s)/[\w./*-]*[\w*])" % "|".join(re.escape(t) for t in tops))
    missing = []
    for page in PAGES:
        text = page.read_text()
        for m in path.finditer(text):
            found = m.group(1)
            if text[m.end():m.end() + 1] in ("{", "-") or found in NOT_FILES:  # a brace list: the recipe test's
                continue
            if not (list(ROOT.glob(found)) if "*" in found else (ROOT / found).exists()):
                missing.append(f"{page.name}: {found}")
    assert not missing, missing


def test_every_test_a_page_names_exists() -> None:
    """`test_the_rule_it_checks` (or `tests/test_x.py::test_...`, a prefix where it ends in `...`)
    names a test of tests/ or benchmarks/: benchmarks.md named a test renamed since."""
    source = "\n".join(p.read_text() for p in [*(ROOT / "tests").glob("*.py"), *(ROOT / "benchmarks").rglob("*.py")])
    tests = set(re.findall(r"def (test_\w+)", source))
    missing = []
    for page in PAGES:
        for name, prefix in re.findall(r"(?<![\w.])(test_[a-z]+_[a-z0-9_]+)(\.\.\.)?", page.read_text()):
            if (ROOT / "tests" / f"{name}.py").exists():
                continue
            if not (any(t.startswith(name) for t in tests) if prefix else name in tests):
                missing.append(f"{page.name}: {name}")
    assert not missing, missing


def test_the_recipe_folders_table_covers_every_shipped_recipe() -> None:
    """docs/recipes.md's "Recipe folders" table names every recipe under recipes/ (folder x file
    names, braces expanded, `<module>` any): it listed six folders of the fourteen, and of
    `demo/sst2/` and `demo/own-data/` not dora, adalora, the chained run nor eight own-data recipes."""
    import fnmatch

    text = (ROOT / "docs" / "recipes.md").read_text()
    table = text.split("### Recipe folders\n", 1)[1].split("\n## ", 1)[0]
    covered: list[str] = []
    for line in table.splitlines():
        cells = [c.strip() for c in line.strip("|").split(" | ")]
        if len(cells) != 2 or not cells[0].startswith("`recipes/"):
            continue
        names = [n for span in re.findall(r"`([^`]+\.yaml)`", cells[1]) if "/" not in span
                 for n in brace_expand(re.sub(r"<\w+>", "*", span))]
        covered += [f"{folder}{name}" for folder in brace_expand(cells[0].strip("`")) for name in names]
    shipped = sorted(str(p.relative_to(ROOT)) for p in (ROOT / "recipes").rglob("*.yaml") if not p.name.startswith("_"))
    left_out = [p for p in shipped if not any(fnmatch.fnmatch(p, c) for c in covered)]
    assert covered and not left_out, left_out


def test_the_recipe_fields_table_has_a_row_for_every_model_and_train_setting() -> None:
    """docs/recipes.md's fields table names every `model.*` and `train.*` setting: model.warm_start,
    and pad_multiple, length_buckets, save_every, keep_checkpoints, gradient_checkpointing,
    skip_nonfinite and report_to had none."""
    import dataclasses

    from toolkit.recipe_data import ModelConfig, TrainConfig

    text = (ROOT / "docs" / "recipes.md").read_text()
    table = text.split("| section | field | default | meaning |", 1)[1].split("\n\n", 1)[0]
    for section, config in (("model", ModelConfig), ("train", TrainConfig)):
        rows = table.split(f"\n| {section} |", 1)[1].split("\n| task |" if section == "model" else "\n\n", 1)[0]
        rows = f"| {section} |" + rows
        named = {n for line in rows.splitlines() for n in re.findall(r"`(\w+)`", line.split(" | ")[1])}
        missing = {f.name for f in dataclasses.fields(config)} - named
        assert not missing, (section, missing)


PLUGIN_PAGES = {"method": ["methods.md"], "task": ["tasks.md", "task-types.md", "recipes.md"],
                "attention module": ["attention.md"]}


def test_every_plugin_setting_is_named_on_its_page() -> None:
    """Each method's, task's and attention module's settings appear on its docs page: IA3's
    `feedforward_modules`, mlm's `mlm_probability` / `random_ratio` and denoise's
    `permute_sentences` were nowhere."""
    import dataclasses

    from toolkit.attention import ATTENTION
    from toolkit.methods import METHODS
    from toolkit.tasks import TASKS

    unnamed = []
    for registry in (METHODS, TASKS, ATTENTION):
        text = "".join((ROOT / "docs" / page).read_text() for page in PLUGIN_PAGES[registry.kind])
        for name in registry.names():
            plugin = registry.get(name)
            fields = [f.name for f in dataclasses.fields(plugin)] if dataclasses.is_dataclass(plugin) else []
            unnamed += [f"{registry.kind} {name}: {f}" for f in fields
                        if f != "name" and not re.search(rf"\b{f}\b", text)]
    assert not unnamed, unnamed


# Named as they were then: structure.md's "before" column.
FORMER_NAMES = {"train._finish"}


def test_every_toolkit_function_a_page_names_is_there() -> None:
    """`module.name` in a code span, `module` a file of toolkit/ (`errors.user_path`,
    `tasks._fields.likeliest_text`, `toolkit.methods.merged`), names a def, class or assignment
    there: a page naming a function renamed since sends a reader to nothing. Recipe settings
    (`train.lr`, `task.max_length`) are not modules."""
    def module(parts: list[str]) -> tuple[Path | None, list[str]]:
        for i in range(len(parts), 0, -1):
            path = ROOT.joinpath("toolkit", *parts[:i])
            if path.with_suffix(".py").is_file():
                return path.with_suffix(".py"), parts[i:]
            if (path / "__init__.py").is_file():
                return path / "__init__.py", parts[i:]
        return None, []

    missing = []
    for page in PAGES:
        for code in code_texts(page):
            for ref in re.findall(r"(?<![\w./-])(?:toolkit\.)?((?:[a-z_]+\.)+[A-Za-z_]\w*)(?![\w/-])", code):
                parts = ref.split(".")
                if parts[0] in ("train", "task", "method", "model") and not parts[1].startswith("_") or ref in FORMER_NAMES:
                    continue
                path, rest = module(parts)
                if path is None or not rest or re.fullmatch(r"py|json|yaml|jsonl|md|csv|tsv|txt|gz|safetensors", rest[0]):
                    continue
                name = re.escape(rest[0])
                if not re.search(rf"^\s*(?:async\s+)?(?:def|class)\s+{name}\b|^\s*{name}\s*(?::[^=\n]*)?=|^\s+{name}\s*:"
                                 rf"|import[^\n]*\b{name}\b", path.read_text(), re.M):
                    missing.append(f"{page.name}: {ref}")
    assert not missing, sorted(set(missing))


def test_the_readme_links_every_docs_page() -> None:
    """A page the README's "Where the rest lives" does not name is a page no new user finds."""
    linked = set(re.findall(r"\]\(docs/([\w-]+\.md)", (ROOT / "README.md").read_text()))
    assert not {p.name for p in (ROOT / "docs").glob("*.md")} - linked
