"""docs/records/study and docs/records/peers, the archived records of the default study and of the
joint SFT+RL peers (utils/run/archive.py): every archived evaluation loads as 08 loads it, archive.json
lists exactly what is there, and each seed's mean@4 and pass@k curve are the figures docs/RESULTS.md
quotes for it (the three-seed table, the five-seed comparisons, the curve table, the peers' five-seed
table), so the results and the records behind them cannot drift."""
import json
import re

import pytest

from utils.core.config import ROOT
from utils.core.manifest import read_manifest
from utils.eval.compare import evaluation_dirs, find_run_dirs, load_evaluation

RECORDS = ROOT / "docs" / "records" / "study"
PEERS = ROOT / "docs" / "records" / "peers"
RESULTS = ROOT / "docs" / "RESULTS.md"
SEEDS = (1, 2, 3)  # the seeds of RESULTS' three-seed table


def _evaluations(records=RECORDS):
    return [load_evaluation(d, ROOT / "outputs") for d in evaluation_dirs(find_run_dirs([records]))]


def _three_seed_table() -> dict[str, list[float]]:
    """{checkpoint: [mean@4 of seeds 1, 2, 3]} from RESULTS' three-seed table."""
    section = RESULTS.read_text().split("## The three-seed study", 1)[1].split("\n## ", 1)[0]
    rows = {}
    for line in section.splitlines():
        m = re.match(r"\| \**([a-z_]+)\**(?: \([^|]*\))? \| ([0-9.]+) / ([0-9.]+) / ([0-9.]+) \|", line)
        if m:
            rows[m.group(1)] = [float(x) for x in m.groups()[1:]]
    return rows


def _captioned(heading: str, label: str) -> tuple[list[int], str]:
    """(the seeds, the text after the caption) of the table under RESULTS' `heading` whose caption
    names its seeds ("<label>, seed 1 / seed 2 / ...")."""
    section = RESULTS.read_text().split(heading, 1)[1].split("\n## ", 1)[0]
    caption = re.search(rf"^{label}, (seed \d+(?: / seed \d+)*) ", section, re.M)
    assert caption, f"RESULTS' {heading.lstrip('# ')}: no caption '{label}, seed 1 / seed 2 ...' above its table"
    return [int(s.removeprefix("seed ")) for s in caption.group(1).split(" / ")], section[caption.end():]


def _curve_table() -> tuple[list[int], list[int], dict[str, list[list[float]]]]:
    """(the seeds, the k, {checkpoint: [[pass@k of each seed] for each k]}) from RESULTS' per-seed
    curve table, whose caption names its seeds ("pass@k, seed 1 / seed 2 / ...")."""
    seeds, text = _captioned("## pass@k curves", "pass@k")
    lines = text.splitlines()
    first = next(i for i, line in enumerate(lines) if line.startswith("| k |"))
    ks = [int(x) for x in lines[first].strip("| ").split(" | ")[1:]]
    rows = {}
    for line in lines[first + 2:lines.index("", first)]:  # below the header and its rule, to the first blank line
        m = re.match(r"\| ([a-z_]+) \| (.*) \|$", line)
        if m:
            rows[m.group(1)] = [[float(x) for x in cell.split(" / ")] for cell in m.group(2).split(" | ")]
    return seeds, ks, rows


def _five_seed_table(heading: str = "### The five-seed comparisons") -> tuple[list[int], dict[str, list[float]]]:
    """(the seeds, {checkpoint: [mean@4 of each seed]}) from the per-seed table under RESULTS' `heading`,
    whose caption names its seeds ("mean@4, seed 1 / seed 2 / ...")."""
    seeds, text = _captioned(heading, "mean@4")
    rows = {}
    for line in text.split("\n\n", 2)[1].splitlines()[2:]:  # the table, below its header and rule
        name, cell = line.strip("| ").split(" | ")[:2]
        rows[name] = [float(x) for x in cell.split(" / ")]
    return seeds, rows


def _assert_archived(seeds: list[int], table: dict[str, list[float]], records) -> None:
    """Each (checkpoint, seed) figure of a per-seed mean@4 table is the one archived in `records`."""
    archived = {(e.method, e.seed): e.metrics["mean@4"] for e in _evaluations(records)}
    for method, figures in table.items():
        assert len(figures) == len(seeds), (method, "a figure per seed named in the caption")
        for seed, figure in zip(seeds, figures):
            assert archived[(method, seed)] == pytest.approx(figure, abs=5.1e-5), (method, seed)


@pytest.mark.parametrize("records", [RECORDS, PEERS], ids=["study", "peers"])
def test_every_archived_evaluation_loads_and_the_index_lists_what_is_there(records):
    evals = _evaluations(records)
    assert evals, f"{records}: no archived evaluation"
    for e in evals:
        assert e.run == records.name and e.directory.parent.parent.name == f"seed_{e.seed}"
        assert e.metrics["n"] == len(e.scores) == 200 and e.primary == "mean_at_k"
    index = json.loads((records / "archive.json").read_text())
    folders = {p.parent.relative_to(records).as_posix() for p in records.rglob("manifest.json")}
    assert set(index) == folders
    for name, entry in index.items():
        assert entry["archived_on"] and entry["kind"] in ("evaluation", "training", "warmup")
        assert read_manifest(records / name)["status"] == "completed"


def test_each_seeds_mean_at_4_is_the_figure_results_quotes():
    table = _three_seed_table()
    assert {"sft_warmup", "grpo", "red", "fixed_sft", "matched_sft"} <= set(table)
    checked = 0
    for e in _evaluations():
        if e.seed in SEEDS and e.method in table:
            assert e.metrics["mean@4"] == pytest.approx(table[e.method][SEEDS.index(e.seed)], abs=5.1e-5), (e.method, e.seed)
            checked += 1
    assert checked >= 6


def test_each_seeds_curve_is_the_figure_results_quotes():
    seeds, ks, table = _curve_table()
    assert ks == [1, 2, 4, 8, 16, 32, 64] and {"sft_warmup", "grpo", "red"} <= set(table) and len(seeds) >= 2
    curves = {(e.method, e.seed): e.metrics["pass_at_k_curve"] for e in _evaluations() if "pass_at_k_curve" in e.metrics}
    for method, cells in table.items():
        assert all(len(cell) == len(seeds) for cell in cells), (method, "a cell per seed named in the caption")
        for seed_index, seed in enumerate(seeds):
            curve = curves[(method, seed)]
            assert [round(curve[str(k)], 3) for k in ks] == [cell[seed_index] for cell in cells], (method, seed)


def test_each_seeds_mean_at_4_in_the_five_seed_table_is_the_archived_one():
    seeds, table = _five_seed_table()
    assert len(seeds) == 5 and {"sft_warmup", "grpo", "red", "fixed_sft", "matched_sft"} == set(table)
    _assert_archived(seeds, table, RECORDS)


def test_each_seeds_mean_at_4_in_the_peers_table_is_the_archived_one():
    seeds, table = _five_seed_table("## The joint SFT+RL peers, five seeds")
    assert seeds == [1, 2, 3, 9, 10]
    assert {"sft_warmup", "grpo", "red", "chord_mu", "chord_phi", "hpt", "relift", "joint", "srft",
            "srft_clamped"} == set(table)
    _assert_archived(seeds, table, PEERS)


def test_the_real_model_run_on_gsm_symbolic_holds_the_figures_its_journal_entry_quotes():
    """docs/records/real_smollm2: the README's real-model command on GSM-Symbolic, seed 1 (journal
    2026-12-07-gsm-symbolic.md): greedy accuracy and mean@4 on the 100 test items per checkpoint."""
    records = ROOT / "docs" / "records" / "real_smollm2"
    quoted = {"base": (0.0, 0.0), "sft_warmup": (0.0, 0.01), "red": (0.01, 0.0075), "grpo": (0.0, 0.0075)}
    evals = {e.method: e for e in _evaluations(records)}
    assert set(evals) == set(quoted)
    for method, (greedy, mean4) in quoted.items():
        m = evals[method].metrics
        assert m["n"] == 100 and (m["accuracy"], m["mean@4"]) == pytest.approx((greedy, mean4), abs=5.1e-5), method
    entry = (ROOT / "docs" / "journal" / "2026-12-07-gsm-symbolic.md").read_text()
    assert "| sft_warmup | 0.00 | 0.0100 |" in entry and "| grpo | 0.00 | 0.0075 |" in entry


def test_the_peers_compute_is_what_results_says_seed_by_seed():
    """Issue 100's compute check, from the archive alone (utils/eval/compute.py): seeds 1 and 9's
    warmups stopped early at 600 steps, so their SFT → RL arms trained 660 optimizer steps against
    joint's 860; the other seeds' trained 860. RESULTS' peers section quotes the per-seed totals."""
    from utils.eval.compare import load_trainings
    from utils.eval.compute import compute

    runs = [PEERS / f"seed_{s}" for s in (1, 2, 3, 9, 10)]
    df = compute(load_trainings(runs, ROOT / "outputs"))
    total = {(r["method"], r["seed"]): r["total steps"] for r in df.to_dict("records")}
    quoted = {1: 660, 2: 860, 3: 860, 9: 660, 10: 860}
    for seed, steps in quoted.items():
        assert total[("joint", seed)] == 860
        for arm in ("grpo", "red", "chord_mu", "chord_phi", "hpt", "srft", "srft_clamped"):
            assert total[(arm, seed)] == steps, (arm, seed)
        assert 1 <= total[("relift", seed)] - steps <= 4  # ReLIFT's own SFT steps
    results = (ROOT / "docs" / "RESULTS.md").read_text()
    assert "660 / 860 / 860 / 660 / 860" in results


def test_the_real_model_control_holds_the_figures_its_journal_entry_quotes():
    """docs/records/real_control: issue 97's positive control on SmolLM2-135M-Instruct and the word
    problems, R1 as chosen on val, seeds 11 to 14 (journal 2026-12-07-real-rl.md): greedy
    accuracy and mean@4 at T 1.0 on the 100 test items per checkpoint; more seeds join the same folder."""
    records = ROOT / "docs" / "records" / "real_control"
    quoted = {("base", 11): (0.0, 0.0), ("sft_warmup", 11): (0.30, 0.215), ("red", 11): (0.34, 0.2525),
              ("grpo", 11): (0.35, 0.255), ("base", 12): (0.0, 0.0), ("sft_warmup", 12): (0.35, 0.2375),
              ("red", 12): (0.42, 0.25), ("grpo", 12): (0.43, 0.2475), ("base", 13): (0.0, 0.0),
              ("sft_warmup", 13): (0.36, 0.2675), ("red", 13): (0.36, 0.30), ("grpo", 13): (0.38, 0.2975),
              ("base", 14): (0.0, 0.0), ("sft_warmup", 14): (0.29, 0.20), ("red", 14): (0.30, 0.245),
              ("grpo", 14): (0.30, 0.2475)}
    evals = {(e.method, e.seed): e for e in _evaluations(records)}
    assert set(evals) == set(quoted)
    for key, (greedy, mean4) in quoted.items():
        m = evals[key].metrics
        assert m["n"] == 100 and m["sample_temperature"] == 1.0, key
        assert (m["accuracy"], m["mean@4"]) == pytest.approx((greedy, mean4), abs=5.1e-5), key
    entry = (ROOT / "docs" / "journal" / "2026-12-07-real-rl.md").read_text()
    assert "| grpo | 0.35 | 0.2550 | 0.44 |" in entry and "| sft_warmup | 0.30 | 0.2150 | 0.41 |" in entry
    assert "| grpo | 0.43 | 0.2475 | 0.49 |" in entry and "| sft_warmup | 0.35 | 0.2375 | 0.45 |" in entry
    assert "| grpo | 0.38 | 0.2975 | 0.47 | 1.00 | 13 |" in entry and "| sft_warmup | 0.36 | 0.2675 | 0.48 | 1.00 | 6 |" in entry
    assert "| grpo | 0.30 | 0.2475 | 0.47 | 1.00 | 4 |" in entry and "| sft_warmup | 0.29 | 0.2000 | 0.42 | 1.00 | 4 |" in entry


def test_the_real_model_controls_verdicts_rederive_from_its_records():
    """08's paired tests over the four archived seeds, as RESULTS and the README quote them: the
    positive control grpo − sft_warmup reads better (+0.0319 mean@4), red − grpo equivalent within ±0.03."""
    from utils.eval.paired import comparisons

    evals = _evaluations(ROOT / "docs" / "records" / "real_control")
    rows = {(r["a"], r["b"]): r for r in comparisons(evals, resamples=1000, seed=0, margin=0.03)}
    control, red = rows[("grpo", "sft_warmup")], rows[("red", "grpo")]
    assert control["verdict"] == "better" and control["diff"] == pytest.approx(0.0319, abs=5e-5)
    assert red["verdict"].startswith("equivalent") and red["diff"] == pytest.approx(0.0, abs=5e-5)
    results = " ".join(RESULTS.read_text().split())  # as read, whatever the line breaks
    assert "grpo − sft_warmup **+0.032**" in results and "(95% CI +0.006 to +0.058, p 0.030" in results
