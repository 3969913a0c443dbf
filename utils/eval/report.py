"""The comparison report of `08_compare_runs.py`: report.md (its plots: utils/eval/plots.py).

Everything here reads the `Evaluation`s and `Training`s that utils/eval/compare.py collects and
writes nothing but the files it is asked to; the numbers in summary.csv and report.md are the
ones in each evaluation's metrics.json (tests/test_compare.py checks that).
"""
from __future__ import annotations

from pathlib import Path

import pandas as pd

from utils.core.files import rel
from utils.core.manifest import MANIFEST_NAME, read_manifest
from utils.core.methods import CONTROL, SFT_WARMUP
from utils.eval.compare import Evaluation, Training, config_diff, fmt
from utils.eval import frames
from utils.eval.frames import across_seeds, ci, evaluations, markdown, sampled, select
from utils.eval.mechanism import mechanism_section
from utils.eval.compute import compute_section
from utils.eval.curves import Crossing, curve_section


def render_report(evals: list[Evaluation], trainings: list[Training], tests: list[dict], plots: list[str],
                  sources: list[Path], resamples: int, crossings: list[Crossing] = ()) -> str:
    runs = sorted({e.run for e in evals})
    lines = ["# RED-CoDA run comparison", "",
             f"Sources: {', '.join(rel(s) for s in sources)}. {len(evals)} evaluations in {len(runs)} run(s); "
             f"greedy Planner/Executor rollouts on each run's test split (07_evaluate).", ""]
    df = evaluations(evals)
    lines += _accuracy_section(df)
    lines += _sampled_section(df)
    lines += mechanism_section(evals, trainings)
    lines += [f"Primary metric of the paired tests: **{primary_label(evals)}**.", ""]
    lines += _paired_section(tests, resamples)
    lines += curve_section(evals, list(crossings))
    lines += _training_section(trainings)
    lines += compute_section(trainings)
    lines += ["## Plots", ""] + [f"![{p[:-4]}](plots/{p})" for p in plots] + [""]
    lines += _config_section(evals, trainings, runs)
    lines += ["## What these numbers show and do not show", ""] + _caveats(evals, trainings, tests) + [""]
    return "\n".join(lines)


def primary_label(evals: list[Evaluation]) -> str:
    """The paired tests' metric in words, e.g. "mean@8 at temperature 0.7" (comparisons() has
    refused a run whose evaluations disagree)."""
    e = evals[0] if evals else None
    if e is None or e.primary == "greedy":
        return "greedy accuracy"
    return f"mean@{e.metrics.get('samples')} at temperature {e.metrics.get('sample_temperature')}"


_SAMPLED_COLUMNS = {"run": "run", "seed": "seed", "method": "method", "accuracy": "greedy", "mean@k": "mean@k",
                    "mean_at_k_ci95": "95% CI", "pass@k": "pass@k", "samples": "k", "sample_temperature": "temperature"}


def _sampled_section(df: pd.DataFrame) -> list[str]:
    """mean@k and pass@k at the rollout temperature beside greedy, where 07 sampled (eval.samples)."""
    have = sampled(df)
    if have.empty:
        return []
    rows = select(have, _SAMPLED_COLUMNS)
    return ["### Sampled at the rollout temperature", "",
            "mean@k: each item's mean answer score over k episodes sampled at the rollout temperature, averaged "
            "over items (the policy RL optimises; CI a bootstrap over items); pass@k: items with a fully correct "
            "sample. mean@k up with greedy and pass@k flat is sharpening; greedy or pass@k up as well is new "
            "capability.", "", markdown(rows, {"95% CI": ci, "k": str, "temperature": str}), ""]


_ACCURACY_COLUMNS = {"run": "run", "seed": "seed", "method": "method", "n": "n", "accuracy": "accuracy",
                     "accuracy_ci95": "95% CI", "format": "format", "answered": "answered", "turns": "turns",
                     "subtasks": "subtasks", "tokens_planner": "tokens planner", "tokens_executor": "tokens executor"}


def _accuracy_section(df: pd.DataFrame) -> list[str]:
    per_seed = select(df, _ACCURACY_COLUMNS)
    lines = ["## Test accuracy", "",
             "Accuracy is the mean item score under the reward spec's scorer; the CI is a bootstrap over "
             "test items (from metrics.json).", "",
             markdown(per_seed, {"95% CI": ci, "turns": two_decimals, "subtasks": two_decimals, "tokens planner": one_decimal,
                                 "tokens executor": one_decimal}), ""]
    lines += _length_section(df)
    lines += _failure_section(df)
    lines += _search_section(df)
    seeds = across_seeds(df)
    if not seeds.empty:
        lines += ["### Across seeds", "", "Mean of the per-seed accuracies with a t-interval over seeds.", "",
                  markdown(seeds, {"95% CI": str}), ""]
    return lines


def one_decimal(x) -> str:
    return fmt(x, 1)


def two_decimals(x) -> str:
    return fmt(x, 2)


def _length_section(df: pd.DataFrame) -> list[str]:
    """Accuracy by the gold decomposition's length, when the task has one: recall of the demonstrated
    chain lengths and extension to longer ones read apart."""
    have = df[df["accuracy_by_gold_subtasks"].map(bool)] if "accuracy_by_gold_subtasks" in df else df.iloc[:0]
    if have.empty:
        return []
    by_length = pd.DataFrame(have["accuracy_by_gold_subtasks"].tolist(), index=have.index, dtype=object)
    by_length = by_length[sorted(by_length.columns, key=int)]
    by_length = by_length.where(by_length.notna(), None).rename(columns=lambda k: f"{k} subtasks")
    return ["### By gold decomposition length", "",
            "Accuracy on the test items whose gold decomposition has that many subtasks (metrics.json "
            "`accuracy_by_gold_subtasks`).", "",
            markdown(pd.concat([have[["run", "seed", "method"]], by_length], axis=1)), ""]


_FAILURES = ("correct", "wrong_answer", "stopped_early", "no_answer", "malformed", "hit_max_turns", "executor_error")


def _failure_section(df: pd.DataFrame) -> list[str]:
    """The greedy episodes by outcome (metrics.json `failures`, 07's failure_category): what a gain
    removed, e.g. the imperfect teacher's stopping one subtask early."""
    have = df[df["failures"].map(bool)] if "failures" in df else df.iloc[:0]
    if have.empty:
        return []
    counts = pd.DataFrame(have["failures"].tolist(), index=have.index).fillna(0).astype(int)
    kinds = [k for k in _FAILURES if k in counts] + sorted(set(counts) - set(_FAILURES))
    return ["### Greedy episodes by outcome", "",
            "Counts of test items (07's `failures`). `stopped_early`: a wrong answer equal to the gold chain's "
            "next-to-last result, the planner answering one subtask early (the imperfect teacher's flaw).", "",
            markdown(pd.concat([have[["run", "seed", "method"]], counts[kinds].astype(object)], axis=1)), ""]


_SEARCH_COLUMNS = {"run": "run", "seed": "seed", "method": "method", "searches_per_subtask": "searches / subtask",
                   "retrieval_hit_rate": "retrieval hit rate", "accuracy_hit": "accuracy (hit)",
                   "accuracy_miss": "accuracy (miss)"}


def _search_section(df: pd.DataFrame) -> list[str]:
    """The search tool's figures, when the evaluations used it (metrics.json from 07)."""
    have = df[df["searches_per_subtask"].map(lambda v: v is not None)] if "searches_per_subtask" in df else df.iloc[:0]
    if have.empty:
        return []
    return ["### Search", "",
            "Searches per subtask; retrieval hit: every gold fact of the item was among some search's top-k "
            "passages; accuracy on the items where retrieval hit and where it missed (— where there were none).",
            "", markdown(select(have, _SEARCH_COLUMNS),
                         {"searches / subtask": two_decimals}), ""]


def p_value(p: float | None) -> str:
    """A p-value to 4 decimals; one below that reads "< 0.0001", never "0.0000"."""
    return "< 0.0001" if p is not None and p < 1e-4 else fmt(p)


def _paired_section(tests: list[dict], resamples: int) -> list[str]:
    method = ("The two checkpoints are paired on the same (training seed, test item). With two or more seeds the "
              "test is a paired t-test over the per-seed mean differences (seeds − 1 degrees of freedom; its 95% CI "
              "is the t-interval), so it carries run-to-run training variance; with one seed it is the paired "
              f"item bootstrap ({resamples} resamples), which covers test-item sampling only. 'items 95% CI' is "
              "the bootstrap of the items within each seed, for every row. p-values are two-sided and "
              "Holm-adjusted within each table and run; the verdict is at adjusted p < 0.05. 'MDE' is the "
              "difference the test would detect with 80% power at p < 0.05 before Holm, at the observed seed "
              "spread: a smaller true effect is likely to read 'no evidence either way', and Holm raises the bar.")
    margins = {t["margin"] for t in tests if t.get("margin")}
    if margins:
        method += (f" The equivalence margin δ = {', '.join(f'{m:g}' for m in sorted(margins))} was declared before "
                   "the study (eval.equivalence_margin): the same data go through two one-sided tests against ±δ "
                   "(over seeds two one-sided t-tests, at one seed the item bootstrap's tails), Holm-adjusted the "
                   "same way; '90% CI' lies inside ±δ exactly when a row's unadjusted equivalence p is below 0.05. "
                   "A pair the difference test does not call better or worse reads 'equivalent within ±δ' at "
                   "adjusted equivalence p < 0.05; 'no evidence either way' then means neither test can tell.")
    lines, df = [], frames.tests(tests)
    for family, title, empty in (
            ("control", f"The positive control: {CONTROL} vs {SFT_WARMUP}",
             f"No run here evaluated both `{CONTROL}` and `{SFT_WARMUP}`, so there is no positive control: a "
             "'no evidence either way' below cannot tell 'no effect' from 'the setup cannot see one'."),
            ("red", "Paired comparison: red vs each other method", "No run here evaluated `red`, so there is no "
                                                                   "paired comparison."),
            ("grpo", f"Against SFT→RL: each trained method but red vs {CONTROL} (red − {CONTROL} is above)", None),
            ("warmup", "Did training improve on its start: each other method vs sft_warmup",
             "No run here evaluated both `sft_warmup` and a trained method."),
            ("across", "Paired across runs (named with --across)", None)):
        rows = df[df["family"] == family] if "family" in df else df.iloc[:0]
        if empty is None and not len(rows):
            continue
        lines += [f"## {title}", ""]
        if family == "control" and len(rows):
            lines += [f"{CONTROL} − {SFT_WARMUP} is the effect this setup must detect: RL on the reward from the "
                      "warmup. It is tested alone, before the families below, so its verdict does not depend on "
                      "which other arms ran. If it does not read 'better', the other verdicts' 'no evidence either "
                      "way' cannot tell 'no effect' from 'the setup cannot see one'.", ""]
        lines += [method, "", _paired_table(rows), ""] if len(rows) else [empty, ""]
    return lines


def _paired_table(rows: pd.DataFrame) -> str:
    """One family's tests as the report shows them: CIs as ranges, p-values by `p_value`."""
    pair = lambda low, high: [ci(p) for p in zip(rows[low], rows[high])]  # noqa: E731
    shown = pd.DataFrame({"run": rows["run"], "difference": rows["a"] + " − " + rows["b"], "seeds": rows["seeds"],
                          "items": rows["n"], "mean diff": rows["diff"], "95% CI": pair("ci95_low", "ci95_high"),
                          "items 95% CI": pair("item_ci95_low", "item_ci95_high"), "MDE": rows["mde"],
                          "p": rows["p_value"], "p (Holm)": select(rows, {"p_holm": "p (Holm)"})["p (Holm)"],
                          "first is": rows["verdict"]}, dtype=object)
    if "tost_p" in rows:  # an equivalence margin: its interval and test before the verdict
        shown.insert(len(shown.columns) - 1, "90% CI", pair("ci90_low", "ci90_high"))
        shown.insert(len(shown.columns) - 1, "equivalence p (Holm)",
                     select(rows, {"tost_holm": "e"})["e"].tolist())
    return markdown(shown, {"p": p_value, "p (Holm)": p_value, "equivalence p (Holm)": p_value})


def _training_section(trainings: list[Training]) -> list[str]:
    if not trainings:
        return []
    df = frames.trainings(trainings)
    formats = {c: (lambda x: fmt(x, 3)) for c in df.columns if c.startswith(("reward", "train acc"))}
    formats.update({"wall s": lambda x: fmt(x, 1), "seed": fmt},
                   **{c: (lambda x: fmt(x, 2)) for c in df.columns if c.endswith("s/step")})
    return ["## Training", "", markdown(df, formats), ""]


def _config_table(configs: dict[str, dict]) -> str | None:
    """The keys whose values differ between the labelled configs, one column per label; None if none."""
    diff = config_diff(configs)
    rows = [[key] + [f"`{values[label]}`" for label in configs] for key, values in diff]
    return markdown(pd.DataFrame(rows, columns=["key", *configs], dtype=object)) if diff else None


def _config_section(evals: list[Evaluation], trainings: list[Training], runs: list[str]) -> list[str]:
    lines = ["## Configs that differ", ""]
    by_method = {f"{t.run}:{t.method}" + (f":s{t.seed}" if t.seed is not None else ""): t.manifest.get("config", {})
                 for t in trainings if t.manifest}
    between = _config_table(by_method)
    if between:
        lines += ["Between the trainer runs (from their manifests):", "", between, ""]
    else:
        lines += ["The trainer runs have identical configs or there is only one." if by_method
                  else "No trainer runs here.", ""]
    if len(runs) > 1:
        per_run = {run: {} for run in runs}
        for e in evals:
            per_run[e.run].update({f"07/{e.method}.{k}": v for k, v in e.manifest.get("config", {}).items()})
        lines += ["Between runs (07_evaluate configs):", "", _config_table(per_run) or "identical.", ""]
    return lines


def _start_caveat(trainings: list[Training]) -> list[str]:
    """Where the trained arms started: each run's SFT warmup length, from its 04 manifest, and which arms
    started from the bare base instead (algorithm.rl.init base, from their manifests: `joint`). The
    seed's own claim (joint SFT+RL from the start beats SFT -> RL) is the comparison of the two, so the
    report says which starts it compares."""
    from_base = sorted({t.method for t in trainings
                        if t.manifest.get("config", {}).get("algorithm", {}).get("rl", {}).get("init") == "base"})
    trainings = [t for t in trainings if t.method not in from_base]
    they = "it tests" if len(from_base) == 1 else "they test"
    base_line = ([f"- {', '.join(from_base)} started from the bare base with no warmup (algorithm.rl.init base): "
                  f"against the arms from the warmup, {they} the seed's claim that SFT and RL trained together "
                  "from the start beat SFT → RL."] if from_base else [])
    steps: dict[str, set] = {}
    for seed_dir, run in {t.directory.parent.parent: t.run for t in trainings}.items():  # one 04 per seed folder
        warmup = seed_dir / "04_sft_warmup"
        if (warmup / MANIFEST_NAME).is_file():
            config = read_manifest(warmup).get("config", {})
            steps.setdefault(run, set()).add(config.get("warmup", {}).get("steps"))
    if not steps:
        return base_line
    where = "; ".join(f"{run}: {', '.join(str(n) for n in sorted(v, key=str))}" for run, v in sorted(steps.items()))
    if from_base:
        return [f"- The other trained arms start from their run's SFT warmup (04's configured steps, {where}).",
                *base_line]
    return [f"- Every trained arm starts from its run's SFT warmup (04's configured steps, {where}). Arms that "
            "all start from one warmup compare methods after SFT; the seed's claim that joint SFT+RL from the "
            "start beats SFT → RL needs an arm from the base (method joint) beside them."]


_FAMILY_WORDS = {"control": ", tested alone as the positive control", "red": " among the comparisons with red",
                 "grpo": f" among the comparisons with {CONTROL}",
                 "warmup": " among the other comparisons with the warmup", "across": " among the pairs across runs"}  # after "Holm-adjusted p 0.01"


def _equivalence_words(t: dict) -> str:
    if t.get("tost_p") is None:
        return ""
    return (f"; against ±{t['margin']:g}: 90% CI {fmt(t['ci90_low'])} to {fmt(t['ci90_high'])}, Holm-adjusted "
            f"equivalence p {p_value(t.get('tost_holm'))}")


def _caveats(evals: list[Evaluation], trainings: list[Training], tests: list[dict]) -> list[str]:
    out = []
    for t in tests:
        if t["n"]:
            out.append(f"- {t['run']}: {t['a']} vs {t['b']}: **{t['verdict']}** ({t['a']} − {t['b']} = {fmt(t['diff'])} on "
                       f"{t['n']} shared items over {t['seeds']} seed(s), {t['test']}, 95% CI {fmt(t['ci95_low'])} to "
                       f"{fmt(t['ci95_high'])}, MDE {fmt(t['mde'])}, Holm-adjusted p {p_value(t.get('p_holm'))}"
                       f"{_FAMILY_WORDS[t['family']]}{_equivalence_words(t)}).")
    for t in tests:
        if t["family"] == "control" and t["verdict"] != "better":
            out.append(f"- {t['run']}: **the positive control did not hold** ({t['a']} − {t['b']} reads "
                       f"'{t['verdict']}'): in this run, 'no evidence either way' cannot tell 'no effect' from "
                       "'the setup cannot see one'.")
    seeds = {(e.run, e.method): set() for e in evals}
    for e in evals:
        seeds[(e.run, e.method)].add(e.seed)
    if all(len(s) <= 1 for s in seeds.values()):
        out.append("- One training seed per method: the CIs cover test-item sampling only, not run-to-run "
                   "training variance, so a difference may not survive another seed.")
    steps = {t.method: len(t.history) for t in trainings}
    if steps:
        out.append("- Training length per method: " + ", ".join(f"{m} {n} steps" for m, n in sorted(steps.items()))
                   + ". Short runs show early dynamics, not converged performance.")
    out += _start_caveat(trainings)
    n = {e.metrics["n"] for e in evals}
    out.append(f"- Test items per evaluation: {', '.join(str(x) for x in sorted(n))}; a gap smaller than the CI "
               "width is not evidence either way.")
    out.append("- Accuracy is judged by the reward spec's scorer on the final `<answer>`; it says nothing about "
               "whether the intermediate subtasks were sensible.")
    return out
