"""The paired tests of 08_compare_runs: which checkpoint pairs are tested, and how they are adjusted.

Within each run, four families (`comparisons`); across runs, the pairs a user names (`across_runs`),
for checkpoints that no single run holds together, such as a method trained from another warmup in
another run directory. Every test is `paired_test` (utils/eval/stats.py) of a − b on the items the two
share, paired by (training seed, test item), Holm-adjusted within its family, with a verdict. With
an equivalence margin δ > 0 (`eval.equivalence_margin`) each test also carries its equivalence test
against ±δ, whose p-values are Holm-adjusted within the family the same way (`tost_holm`): a pair
the difference test cannot call better or worse is "equivalent within ±δ" when that one rejects.
"""
from __future__ import annotations

from collections import defaultdict

from utils.core.methods import CONTROL, METHODS, SFT_WARMUP
from utils.eval.compare import CompareError, Evaluation, method_key
from utils.eval.stats import holm, paired_test, verdict


def _primaries(evals: list[Evaluation], where: str) -> None:
    """Refuse evaluations that declare different primary metrics: their scores are not comparable."""
    found = {(e.primary, e.metrics.get("samples"), e.metrics.get("sample_temperature")) for e in evals}
    if len(found) > 1:
        raise CompareError(f"{where}: the evaluations declare different primary metrics {sorted(found, key=str)} "
                           "(eval.primary, eval.samples, algorithm.rl.temperature); re-evaluate them with one setting")


def _scores(evals: list[Evaluation]) -> dict:
    return {(e.seed, q): s for e in evals for q, s in e.scores.items()}


def comparisons(evals: list[Evaluation], resamples: int, seed: int, margin: float = 0.0) -> list[dict]:
    """Four families of paired tests per run, each Holm-adjusted on its own: the positive control
    (`family` "control": CONTROL − sft_warmup, alone, so that adding an arm cannot change whether the
    setup detected the effect it must detect), red against every other checkpoint ("red"), every
    other trained method against CONTROL, the SFT→RL reference ("grpo"; red − grpo is in red's family
    and not repeated here, so each pair has one verdict), and every other trained method against the
    SFT warmup it started from ("warmup": did training improve on its start?). Each is `paired_test`
    (utils/eval/stats.py) of a − b on items paired by (seed, item), with a verdict."""
    by_run = defaultdict(list)
    for e in evals:
        by_run[e.run].append(e)
    for run, found in by_run.items():
        _primaries(found, f"run {run}")
    out = []
    for run, found in sorted(by_run.items()):
        methods = {m: _scores([e for e in found if e.method == m]) for m in {e.method for e in found}}
        ordered = sorted(methods, key=method_key)
        warm = SFT_WARMUP in methods
        pairs = {"control": [(CONTROL, SFT_WARMUP)] if warm and CONTROL in methods else [],
                 "red": [("red", m) for m in ordered if m != "red"] if "red" in methods else [],
                 "grpo": [(m, CONTROL) for m in ordered if m in METHODS and m not in (CONTROL, "red")]
                 if CONTROL in methods else [],
                 "warmup": [(m, SFT_WARMUP) for m in ordered if m in METHODS and m != CONTROL] if warm else []}
        boot: dict[tuple[str, str], dict] = {}  # red − sft_warmup is in both families: resample it once
        for name, family in pairs.items():
            for a, b in family:
                if (a, b) not in boot:
                    boot[(a, b)] = paired_test(methods[a], methods[b], resamples, seed, margin)
            out += _family(run, name, family, boot)
    return out


def _family(run: str, name: str, pairs: list[tuple[str, str]], boot: dict) -> list[dict]:
    """One family's tests from their bootstraps, Holm-adjusted within the family, with verdicts."""
    tests = [{"run": run, "family": name, "a": a, "b": b, **boot[(a, b)]} for a, b in pairs]
    tested = [t for t in tests if t["p_value"] is not None]
    for t, p in zip(tested, holm([t["p_value"] for t in tested])):
        t["p_holm"] = p
    equivalence = [t for t in tested if t.get("tost_p") is not None]
    for t, p in zip(equivalence, holm([t["tost_p"] for t in equivalence])):
        t["tost_holm"] = p
    for t in tests:
        t["verdict"] = verdict(t["diff"], t.get("p_holm"), tost_adjusted=t.get("tost_holm"), margin=t.get("margin", 0.0))
    return tests


def across_runs(evals: list[Evaluation], pairs: list[tuple[str, str]], resamples: int, seed: int,
                margin: float = 0.0) -> list[dict]:
    """The named pairs of checkpoints across runs ("RUN/METHOD" labels, e.g. ("early/red", "study/grpo")),
    one family ("across"), on the (seed, item) pairs both evaluated; none shared is an error."""
    by_label = defaultdict(list)
    for e in evals:
        by_label[f"{e.run}/{e.method}"].append(e)
    pairs, boot = list(dict.fromkeys(pairs)), {}  # a pair named twice is tested once
    for a, b in pairs:
        missing = [x for x in (a, b) if x not in by_label]
        if missing:
            raise CompareError(f"--across {a} {b}: no evaluation labelled {', '.join(missing)}; "
                               f"have: {', '.join(sorted(by_label))}")
        _primaries(by_label[a] + by_label[b], f"--across {a} {b}")
        sa, sb = _scores(by_label[a]), _scores(by_label[b])
        if not set(sa) & set(sb):
            raise CompareError(f"--across {a} {b}: no (seed, test item) pair evaluated by both")
        boot[(a, b)] = paired_test(sa, sb, resamples, seed, margin)
    return _family("across", "across", pairs, boot)
