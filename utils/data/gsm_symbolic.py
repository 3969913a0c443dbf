"""GSM-Symbolic through `reasoning-gym`, offline and seeded, written in GSM8K's native schema.

GSM-Symbolic (arXiv 2410.05229) re-instantiates the templates of real GSM8K test problems with new
names and numbers; `reasoning-gym` (pinned in requirements.txt) ships its generators as Python, one
function a template, so `bash download.sh --dataset gsm_symbolic` writes the splits with no hub. Each
generated item has a `question` (reasoning-gym appends "Give the result as your final answer. Do not
include units."; kept, it is the benchmark's item), an `answer` and the worked solution
`metadata.answer_cot`: GSM8K's prose, one calculation a line, ending `#### N`, without GSM8K's
`<<expr=value>>` calculator annotations. utils/data/worked_lines.py reads the calculations back out of
the prose; they are written into the answer as GSM8K annotations, so the `gsm8k` adapter, its gold
decomposition (one Executor subtask per annotation, utils/data/decompose.py) and the numeric scorer
read the files unchanged.

What becomes of an item (counted in manifest.json, `outcomes`, per template in `templates`):
- `decomposed`: every calculation read and checked, the last one the answer: the answer carries the
  annotations, 03 gets a gold trace with one subtask per calculation. Lines with no calculation
  (narration, "Let T be ...") are prose the planner never delegates.
- `no_decomposition`: a line holds arithmetic that is not read (an unknown such as `2x+90=252`, a word
  such as "half", `2(73+57)`), or the last calculation is not the answer: the row keeps its question
  and answer for RL and evaluation, with no annotations, so it has no gold trace (03 counts it).
- `dropped`: a calculation evaluates to another value than the line states (the template rounds
  down, e.g. `1188/60=19`): its gold answer is not the question's, so it is never drawn.

Splits: templates come from `data.templates` (reasoning-gym's indices; empty: all 85 it marks
working), items from a seeded stream, and an item joins a split only if its number of calculation
lines is within `data.min_steps`..`data.max_steps` and its instance (template, variables) was never
drawn before, in the order train, val, test: no instance is shared between splits. The manifest
records reasoning-gym's version, the knobs that made the files (`knobs`, which 00 compares with the
run's config: utils/data/adapters.py) and a generator version raised whenever the same knobs would
write other files.
"""
from __future__ import annotations

import json
import random
import warnings
from collections import Counter
from importlib import metadata
from pathlib import Path

from utils.core.hashing import config_sha256
from utils.data.draw import draw_splits, publish_splits, up_to_date
from utils.data.worked_lines import line_calculations
from utils.reward.scorers import parse_number

GENERATOR_VERSION = 1
PACKAGE = "reasoning-gym"
KNOBS = ("seed", "templates", "min_steps", "max_steps", "n_train", "n_val", "n_test")  # what makes the files


def generators() -> tuple[dict, list[int]]:
    """reasoning-gym's GSM-Symbolic generators by template index, and the indices it marks working."""
    with warnings.catch_warnings():  # its package imports modules with SyntaxWarnings on first compile
        warnings.simplefilter("ignore")
        from reasoning_gym.arithmetic.gsm_symbolic import gsm_symbolic as gs
        from reasoning_gym.arithmetic.gsm_symbolic import generators_00_49, generators_50_99
    found = {int(name[len("generate_"):]): getattr(mod, name) for mod in (generators_00_49, generators_50_99)
             for name in dir(mod) if name.startswith("generate_")}
    return found, list(gs.tasks_ok)


def annotate(solution: str) -> tuple[str | None, int, str]:
    """(the worked solution with GSM8K's `<<expr=value>>` after each calculation's `=`, or None when
    it cannot be decomposed; its number of calculation lines; the outcome: decomposed,
    no_decomposition or dropped, as the module docstring says)."""
    body, _, final = solution.partition("####")
    lines, n_lines, outcome, last = [], 0, "decomposed", None
    for line in body.rstrip("\n").splitlines():
        calcs, wrong, unread = line_calculations(line)
        if wrong:
            return None, 0, "dropped"
        if unread:
            outcome = "no_decomposition"
        n_lines += bool(calcs or unread)
        parts = line.split("=")
        for expr, shown, _, k in calcs:  # GSM8K's place: right after the `=`, before the value
            parts[k + 1] = f"<<{expr}={shown}>>{parts[k + 1]}"
            last = shown
        lines.append("=".join(parts))
    if last is None or last.rstrip("%") != final.strip() and parse_number(last) != parse_number(final):
        outcome = "no_decomposition" if outcome == "decomposed" else outcome
    text = "\n".join(lines) + f"\n#### {final.strip()}"
    return (text if outcome == "decomposed" else None), n_lines, outcome


def _knob_errors(cfg, known: list[int]) -> None:
    for split in ("train", "val", "test"):
        if isinstance(getattr(cfg, f"n_{split}"), float):
            raise ValueError(f"data.n_{split}={getattr(cfg, f'n_{split}')}: GSM-Symbolic items are drawn as a "
                             f"count, not a fraction")
    bad = [t for t in cfg.templates if t not in known]
    if bad:
        raise ValueError(f"data.templates: {bad} not among reasoning-gym's working GSM-Symbolic templates "
                         f"({PACKAGE} {metadata.version(PACKAGE)} marks {len(known)} working: {known[0]}..{known[-1]}, "
                         f"without {sorted(set(range(known[-1] + 1)) - set(known))})")
    if cfg.min_steps > cfg.max_steps:
        raise ValueError(f"data.min_steps={cfg.min_steps} > data.max_steps={cfg.max_steps}")


def generate(cfg) -> tuple[dict[str, list[dict]], dict]:
    """The three splits' native rows, and what the draw met (`outcomes`, per-template counts)."""
    found, known = generators()
    _knob_errors(cfg, known)
    pool = list(cfg.templates) or known
    rng = random.Random(cfg.seed)
    outcomes, per_template = Counter(), Counter()

    def draw():
        template = rng.choice(pool)
        item = found[template](random.Random(rng.getrandbits(64)), 1.0)
        answer, n_lines, outcome = annotate(item["metadata"]["answer_cot"])
        outcomes[outcome] += 1
        if outcome == "dropped" or not cfg.min_steps <= n_lines <= cfg.max_steps:
            return None
        return {"template": template, "variables": item["metadata"]["variables"], "n_steps": n_lines,
                "question": item["question"], "outcome": outcome,
                "answer": answer or f"{item['metadata']['answer_cot'].partition('####')[0].rstrip()}\n#### "
                                    f"{item['answer']}"}

    sizes = {"train": cfg.n_train, "val": cfg.n_val, "test": cfg.n_test}
    drawn = draw_splits(sizes, draw, lambda it: None if it is None else
                        (it["template"], json.dumps(it["variables"], sort_keys=True, default=str)),
                        f"cannot draw {sum(sizes.values())} distinct GSM-Symbolic items from templates "
                        f"{list(cfg.templates) or 'all'} with {cfg.min_steps}-{cfg.max_steps} calculation lines; "
                        f"widen data.templates or data.min_steps/max_steps, or draw fewer")
    splits = {}
    for split, items in drawn.items():
        splits[split] = [{"id": f"{split}-{i:05d}", **{k: it[k] for k in ("question", "answer", "template", "n_steps",
                                                                             "outcome", "variables")}}
                         for i, it in enumerate(items)]
        per_template.update(f"{it['template']}:{it['outcome']}" for it in items)
    return splits, {"draws": dict(sorted(outcomes.items())), "templates": dict(sorted(per_template.items()))}


def write_gsm_symbolic(cfg, out_dir: Path) -> Path:
    """Write train/val/test.jsonl and manifest.json into `out_dir` atomically; a no-op when the folder
    already holds this config's files from this reasoning-gym and generator version."""
    from utils.core.config import to_dict

    knobs = {k: getattr(cfg, k) for k in KNOBS}
    version = metadata.version(PACKAGE)
    digest = config_sha256({"knobs": knobs, "generator": GENERATOR_VERSION, PACKAGE: version})
    if up_to_date(out_dir, digest):
        print(f"gsm_symbolic: {out_dir} is up to date")
        return out_dir
    splits, seen = generate(cfg)
    decomposed = {s: sum(r["outcome"] == "decomposed" for r in rows) for s, rows in splits.items()}
    publish_splits(out_dir, splits, {
        "generator": "utils/data/gsm_symbolic.py", "generator_version": GENERATOR_VERSION,
        "package": {"name": PACKAGE, "version": version, "task": "gsm_symbolic", "difficulty": 1.0},
        "config": to_dict(cfg), "knobs": knobs, "config_sha256": digest, "decomposed": decomposed, **seen})
    print(f"gsm_symbolic: wrote {out_dir} {({s: len(r) for s, r in splits.items()})}, with a gold decomposition "
          f"{decomposed}")
    return out_dir
