"""The front page and the docs hold (issue 46): README.md stays a short front page, every relative
link in README.md and docs/ resolves, the front page names no commit, its methods table is the
registry's, and every command it shows parses."""
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
README_MAX_LINES, FIRST_COMMAND_BY = 150, 40

LINK = re.compile(r"(?<!!)\[[^\]]*\]\(([^)\s]+)\)")  # [text](target); images are not links here
HEADING = re.compile(r"^(#{1,6})\s+(.*?)\s*#*\s*$")
# a git hash as the docs would quote one: 7-40 lowercase hex characters with a digit and a letter
HASH = re.compile(r"(?<![\w.-])(?=[0-9a-f]*[0-9])(?=[0-9a-f]*[a-f])[0-9a-f]{7,40}(?![\w-])")
# `.venv/bin/python 09_driver.py ...` or `python 00_check_data.py ...` inside a code block
COMMAND = re.compile(r"(?:^|[\s;&|(])(?:\.venv/bin/)?python3?\s+((?:[\w.-]+/)*[\w.-]+\.py)\b([^\n;&|]*)")


def _docs() -> list[Path]:
    return [README, *sorted((ROOT / "docs").rglob("*.md"))]


def _without_code(text: str) -> str:
    """The text with fenced code blocks and inline code blanked (links in them are not links)."""
    text = re.sub(r"^```.*?^```", "", text, flags=re.S | re.M)
    return re.sub(r"`[^`\n]*`", "", text)


def _code_blocks(text: str) -> list[str]:
    return re.findall(r"^```[^\n]*\n(.*?)^```", text, flags=re.S | re.M)


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, markup and punctuation dropped, spaces to hyphens."""
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading)  # a link in a heading keeps its text
    text = re.sub(r"[*`]", "", text).strip().lower()  # underscores stay, as on GitHub
    return re.sub(r"[^\w\- ]", "", text).replace(" ", "-")


def anchors(path: Path) -> set[str]:
    """Every heading anchor of a markdown file, with GitHub's -1, -2 ... for repeats."""
    seen: dict[str, int] = {}
    out = set()
    for line in _without_fences(path.read_text()).splitlines():
        m = HEADING.match(line)
        if m:
            base = slug(m.group(2))
            n = seen.get(base, 0)
            seen[base] = n + 1
            out.add(base if n == 0 else f"{base}-{n}")
    return out


def _without_fences(text: str) -> str:
    return re.sub(r"^```.*?^```", "", text, flags=re.S | re.M)


def broken_links(path: Path, root: Path = ROOT) -> list[str]:
    """The relative links of one markdown file whose file, or heading in a markdown file, is missing."""
    out = []
    for target in LINK.findall(_without_code(path.read_text())):
        if re.match(r"[a-z][a-z0-9+.-]*:", target):  # https:, mailto: ...: not checked here
            continue
        file_part, _, anchor = target.partition("#")
        dest = (path.parent / file_part).resolve() if file_part else path
        if not dest.exists():
            out.append(f"{path.relative_to(root)}: {target} (no such file)")
        elif root not in dest.parents and dest != root:
            out.append(f"{path.relative_to(root)}: {target} (outside the repository)")
        elif anchor and dest.suffix == ".md" and anchor not in anchors(dest):
            out.append(f"{path.relative_to(root)}: {target} (no heading '{anchor}' in {dest.name})")
    return out


def commit_hashes(text: str) -> list[str]:
    return HASH.findall(text)


def readme_commands(text: str) -> dict[str, set[str]]:
    """Script -> the --flags the README's code blocks pass it (continuation lines joined)."""
    out: dict[str, set[str]] = {}
    for block in _code_blocks(text):
        for line in block.replace("\\\n", " ").splitlines():
            line = line.split("  #")[0]  # a trailing comment is not part of the command
            for script, rest in COMMAND.findall(line):
                out.setdefault(script, set()).update(re.findall(r"(?<![\w-])(--[\w-]+)", rest))
    return out


def test_readme_is_a_short_front_page():
    lines = README.read_text().splitlines()
    assert len(lines) <= README_MAX_LINES, f"README.md has {len(lines)} lines (at most {README_MAX_LINES})"
    first = next((i for i, line in enumerate(lines, 1) if line.startswith("bash setup.sh")), None)
    assert first is not None and first <= FIRST_COMMAND_BY, f"the first command is on line {first}"


def test_readme_describes_the_code_as_it_is_with_no_dated_or_historical_sentence():
    """Past results, previous defaults and timings of a day belong to the journal (docs/journal/README.md)."""
    history = re.compile(r"\b20\d\d-\d\d-\d\d\b|\bat HEAD\b|\bthat (?:morning|evening|hour)\b|\bprevious default\b")
    assert history.findall(_without_code(README.read_text())) == []
    before = (ROOT / "docs" / "journal" / "2026-12-02-front-page-snapshot.md").read_text()  # the page it replaced
    assert {"at HEAD", "that morning", "previous default"} <= set(history.findall(before))


def test_readme_keeps_the_two_commands_ci_and_newcomers_run():
    blocks = "\n".join(_code_blocks(README.read_text()))
    assert "bash setup.sh && bash download.sh && .venv/bin/python 09_driver.py --method red\n" in blocks
    assert "bash setup.sh && .venv/bin/python -m pytest -q --full\n" in blocks
    assert "bash setup.sh && .venv/bin/python -m pytest -q --full\n" in (ROOT / ".ci" / "run").read_text()


def test_the_journal_index_lists_every_entry():
    journal = ROOT / "docs" / "journal"
    listed = set(re.findall(r"\]\(([\w.-]+\.md)\)", (journal / "README.md").read_text()))
    entries = {p.name for p in journal.glob("*.md") if p.name != "README.md"}
    assert entries - listed == set(), f"docs/journal/README.md does not list {sorted(entries - listed)}"


@pytest.mark.parametrize("path", _docs(), ids=lambda p: str(p.relative_to(ROOT)))
def test_relative_links_resolve(path):
    assert not broken_links(path), "\n".join(broken_links(path))


def test_the_link_check_can_fail(tmp_path):
    repo = tmp_path / "repo"
    repo.mkdir()
    (tmp_path / "outside.md").write_text("# Outside\n")
    (repo / "a.md").write_text("# Top\n\n## Top\n\n[ok](#top-1) [gone](missing.md) [bad](#nowhere) `[code](x.md)`\n"
                               "[out](../outside.md) [web](https://example.com/x.md)\n")
    assert [b.split(": ", 1)[1] for b in broken_links(repo / "a.md", repo)] == [
        "missing.md (no such file)", "#nowhere (no heading 'nowhere' in a.md)",
        "../outside.md (outside the repository)"]
    assert slug("Data-parallel training: `accelerate launch`") == "data-parallel-training-accelerate-launch"
    assert slug("Running a study's branches at once: `--executor ray`") == \
        "running-a-studys-branches-at-once---executor-ray"
    assert slug("Other task: `synthetic_lookup`") == "other-task-synthetic_lookup"


def test_readme_names_no_commit():
    found = commit_hashes(README.read_text())
    assert not found, f"README.md names commits (history goes to docs/journal/): {found}"


def test_the_hash_check_tells_hashes_from_words_and_numbers():
    assert commit_hashes("measured at 546e93f and b6d22a4a996629fabde296af3a4bce670a4f3fcf") == [
        "546e93f", "b6d22a4a996629fabde296af3a4bce670a4f3fcf"]
    prose = ("the decade's accepted facade, deadbeef defaced; 1,234,567 items, 0.7401234, 1e-4, 2026-11-25, "
             "sha256, bf16, fp32, tok/s, 12345678, docs/journal/2026-11-25-regime-d.md, x86_64")
    assert commit_hashes(prose) == []


def _table_methods(text: str, after: str) -> list[str]:
    """The first column of the first markdown table after the line starting with `after`."""
    lines = text.split(after, 1)[1].splitlines()[1:]  # [0] is the rest of the header line
    assert lines and lines[0].startswith("| ---"), f"no table after {after!r}"
    rows = []
    for line in lines[1:]:
        if not line.startswith("|"):
            break
        rows.append(re.sub(r"[`* ]", "", line.split("|")[1]))
    return rows


def test_one_methods_table_and_it_is_the_registry():
    from utils.core.methods import METHODS

    readme = _table_methods(README.read_text(), "| method | trains in |")
    methods_doc = _table_methods((ROOT / "docs" / "METHODS.md").read_text(), "| method | trains in |")
    assert readme == list(METHODS), f"README's methods table lists {readme}, the registry {list(METHODS)}"
    assert readme == methods_doc, "README.md and docs/METHODS.md show different methods tables"
    table = lambda text: text.split("| method | trains in |", 1)[1].splitlines()[:len(METHODS) + 2]
    assert table(README.read_text()) == table((ROOT / "docs" / "METHODS.md").read_text()), \
        "README.md and docs/METHODS.md word the methods table differently"


def test_readme_commands_parse():
    """Each script the README runs answers --help, and knows every --flag the README passes it.
    One interpreter runs every --help (runpy), so the shared imports are paid once."""
    commands = readme_commands(README.read_text())
    assert "09_driver.py" in commands, "the README's main command was not found"
    for script in commands:
        assert (ROOT / script).is_file(), f"README runs {script}, which does not exist"
    probe = (
        "import contextlib, io, json, runpy, sys\n"
        "out = {}\n"
        "for script in sys.argv[1:]:\n"
        "    sys.argv = [script, '--help']\n"
        "    buf = io.StringIO()\n"
        "    code = 0\n"
        "    with contextlib.redirect_stdout(buf), contextlib.redirect_stderr(buf):\n"
        "        try:\n"
        "            runpy.run_path(script, run_name='__main__')\n"
        "        except SystemExit as e:\n"
        "            code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)\n"
        "    out[script] = [code, buf.getvalue()]\n"
        "print(json.dumps(out))\n")
    res = subprocess.run([sys.executable, "-c", probe, *sorted(commands)], cwd=ROOT, capture_output=True,
                         text=True, timeout=120 * len(commands))
    assert res.returncode == 0, res.stderr[-2000:]
    helps = json.loads(res.stdout.strip().splitlines()[-1])
    for script, flags in sorted(commands.items()):
        code, text = helps[script]
        assert code == 0 and "usage:" in text, f"{script} --help exited {code}:\n{text[-1000:]}"
        unknown = sorted(f for f in flags if f not in text)
        assert not unknown, f"README passes {script} flags its --help does not list: {unknown}"


def test_the_command_finder_reads_code_blocks_only():
    text = ("run `python 03_generate_sft_traces.py` in prose\n\n```bash\n"
            "bash setup.sh && .venv/bin/python 09_driver.py --method red \\\n    --seeds 1,2  # a --note\n"
            "python benchmarks/step_profile.py --run outputs/x\n.venv/bin/python -m pytest -q\n```\n")
    assert readme_commands(text) == {"09_driver.py": {"--method", "--seeds"},
                                     "benchmarks/step_profile.py": {"--run"}}


EXTENDING = ROOT / "docs" / "EXTENDING.md"
READ = re.compile(r'registry_names\("(utils/[\w/]+\.py)", "([A-Z][A-Z_]+)"\)')  # the registries choices.py reads


def _registries() -> dict[str, str]:
    """Every registry EXTENDING.md must name: those utils/core/choices.py reads the names of, the
    method registry and the hub's datasets."""
    found = {name: path for path, name in READ.findall((ROOT / "utils" / "core" / "choices.py").read_text())}
    return {**found, "METHODS": "utils/core/methods.py", "DATASETS": "utils/core/hub.py",
            "ADAPTERS": "utils/data/adapters.py", "AGGREGATIONS": "utils/train/losses.py"}


def test_extending_names_every_registry_in_the_file_that_defines_it():
    import importlib

    from utils.core.registry import Registry

    text = EXTENDING.read_text()
    registries = _registries()
    assert {"ENGINES", "SCORERS", "ADVANTAGES", "POLICY_LOSSES", "RETRIEVERS", "TRACE_SOURCES"} <= set(registries)
    for name, path in registries.items():
        module = importlib.import_module(path[:-3].replace("/", "."))
        assert isinstance(getattr(module, name, None), Registry), f"{path} has no Registry {name}"
        assert f"`{name}`" in text and f"`{path}`" in text, f"docs/EXTENDING.md does not name {name} in {path}"
    headings = [m.group(2) for m in map(HEADING.match, text.splitlines()) if m and m.group(1) == "##"]
    for kind in ("method", "advantage", "scorer", "dataset adapter", "trace source", "engine", "retriever"):
        assert any(kind in h for h in headings), f"docs/EXTENDING.md has no checklist for a {kind}"


def test_every_file_extending_names_exists():
    paths = {p for p in re.findall(r"`([\w./<>-]+\.(?:py|yaml|md))(?:::\w+)?`", EXTENDING.read_text())
             if "/" in p or p[:2].isdigit() or p == "README.md"}  # repository paths, not output files
    paths |= set(re.findall(r"`((?:tests|utils|configs|benchmarks)/[\w./<>-]*/)`", EXTENDING.read_text()))
    assert len(paths) > 20
    missing = []
    for p in sorted(paths):
        if "<name>" in p:  # a template: its folder must exist
            p = p.split("<name>")[0]
        if not (ROOT / p).exists():
            missing.append(p)
    assert missing == []


def test_a_registry_names_the_valid_choices_for_an_unknown_name():
    from utils.core.registry import Registry

    reg = Registry("widget", {"b": 2, "a": 1})
    assert reg.get("a") == 1 and reg["b"] == 2 and reg.names == ("a", "b") and list(reg) == ["b", "a"]
    with pytest.raises(KeyError, match="unknown widget 'c'; valid: a, b"):
        reg.get("c")


ARCHITECTURE = ROOT / "docs" / "ARCHITECTURE.md"
ARCHITECTURE_MAX_WORDS = 3000
DOC_MAX_WORDS = 5000  # RESULTS, PERFORMANCE, OPERATIONS (issue 99)
# docs/ARCHITECTURE.md, "Protocol"   or   docs/ARCHITECTURE.md "Stages" and "Memory of the update"
SECTION_CITE = re.compile(r"docs/([A-Z]+)\.md,?\s+((?:\"[^\"\n]+\"(?:\s*(?:,|and)\s*)?)+)")


def section_cites(text: str) -> list[tuple[str, str]]:
    """(doc, heading) for every `docs/<NAME>.md, "Heading"` a file's text cites, quotes joined by and/commas."""
    text = re.sub(r"\s*\n\s*#?\s*", " ", text)  # a cite wrapped over lines, in code or a comment
    return [(doc, h) for doc, quoted in SECTION_CITE.findall(text) for h in re.findall(r"\"([^\"]+)\"", quoted)]


def test_architecture_is_a_map_not_a_manual():
    """ARCHITECTURE stays a map that points at the docstrings holding the detail (issue 85)."""
    words = len(ARCHITECTURE.read_text().split())
    assert words <= ARCHITECTURE_MAX_WORDS, f"docs/ARCHITECTURE.md has {words} words (at most {ARCHITECTURE_MAX_WORDS})"


@pytest.mark.parametrize("name", ["RESULTS", "PERFORMANCE", "OPERATIONS"])
def test_the_long_docs_say_what_holds_at_head_in_a_bounded_length(name):
    """RESULTS, PERFORMANCE and OPERATIONS say what holds at HEAD; history and superseded figures go to
    the journal (issue 99), so each stays within DOC_MAX_WORDS."""
    words = len((ROOT / "docs" / f"{name}.md").read_text().split())
    assert words <= DOC_MAX_WORDS, f"docs/{name}.md has {words} words (at most {DOC_MAX_WORDS}): move history to docs/journal"


def test_every_doc_section_the_code_cites_exists():
    """A docstring or comment that sends a reader to `docs/<X>.md, "Section"` names a heading that doc
    has, whole or by its first words ("Data-parallel training" for "Data-parallel training: ...")."""
    sources = [p for d in ("utils", "tests", "benchmarks", "configs") for p in (ROOT / d).rglob("*")
               if p.suffix in (".py", ".yaml") and p != Path(__file__)] + sorted(ROOT.glob("[0-9][0-9]_*.py"))
    cited, missing = 0, []
    for path in sources:
        for doc, heading in section_cites(path.read_text()):
            target = ROOT / "docs" / f"{doc}.md"
            cited += 1
            if not target.exists() or not any(a.startswith(slug(heading)) for a in anchors(target)):
                missing.append(f"{path.relative_to(ROOT)}: docs/{doc}.md \"{heading}\"")
    assert cited > 20 and missing == []


def test_the_section_cite_finder_reads_wrapped_and_joined_cites():
    text = 'x (docs/ARCHITECTURE.md, "Training" and "Memory of\n    the update"). y docs/OPERATIONS.md "Data-parallel training"'
    assert section_cites(text) == [("ARCHITECTURE", "Training"), ("ARCHITECTURE", "Memory of the update"),
                                   ("OPERATIONS", "Data-parallel training")]


DEFAULT_RUN = re.compile(r"regime `(\w+)`, which\s+`(configs/data/[\w.]+\.yaml)` names: a warmup of (\d+) steps of (\d+) "
                         r"on the gold traces of (\d+)\s+questions, then (\d+) RL steps of (\d+) questions × (\d+) "
                         r"samples at lr ([\d.e-]+), (\d+) optimizer passes a batch")


def test_the_readme_says_what_the_main_command_trains_with():
    """The values the default run trains with are on the front page (issue 85), and they are the
    loaded config's: a changed regime or tier that the README does not follow fails here."""
    from utils.core.config import read_yaml
    from utils.core.loader import load_run_config

    m = DEFAULT_RUN.search(" ".join(README.read_text().split()).replace("\n", " "))
    assert m, "README.md's quick start no longer says what the main command trains with"
    regime, tier, steps, batch, traces, rl_steps, questions, samples, lr, passes = m.groups()
    cfg = load_run_config()  # the main command's: tiny-arith, red, synthetic_arith
    assert read_yaml(ROOT / tier)["run"]["regime"] == regime == cfg.regime
    assert (cfg.warmup.steps, cfg.warmup.batch_size, cfg.traces.max_traces) == (int(steps), int(batch), int(traces))
    rl = cfg.algorithm.rl
    assert (rl.steps, rl.questions_per_step, rl.n_samples, rl.ppo_epochs) == (int(rl_steps), int(questions),
                                                                               int(samples), int(passes))
    assert rl.lr == float(lr)
