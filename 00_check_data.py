"""00_check_data: validate the raw dataset before anything is built from it.

Reads the native files of `data.name` under `data.path` through its adapter and checks schema and
types, empty or duplicate ids, empty questions or answers, gold answers the scorer cannot parse,
and leakage between splits, after any check its adapter registers for its files (utils/data/adapters.py
`check_files`): for the generated datasets, that the files were generated with the config's
difficulty knobs and seed (their manifest.json), so a changed config never runs on stale files;
differing split sizes are a warning. Writes outputs/<run_id>/00_check_data/{summary.json, manifest.json}.
Hard errors exit 1 (the manifest says 'failed'); warnings are listed in the summary and manifest.
"""
import sys

from utils.core.cli import parse_stage_args
from utils.data.adapters import get_adapter
from utils.data.checks import check_dataset, summarize
from utils.data.prepare import CONTEXT_CORPUS
from utils.core.files import atomic_write_json
from utils.core.manifest import StageRun
from utils.core.config import repo_path
from utils.core.stages import StageError, run_main, stage_config, stage_dir

STAGE = "00_check_data"


def main(argv=None) -> int:
    cfg, _ = parse_stage_args(__doc__, argv)
    out = stage_dir(cfg, STAGE)
    root = repo_path(cfg.data.path)
    with StageRun(STAGE, out, stage_config(cfg, STAGE)) as run:  # no run seed: nothing here is drawn
        run.warnings.extend(get_adapter(cfg.data.name).file_warnings(cfg.data, root))  # the generated ones' knobs
        rep = check_dataset(cfg.data.name, root, cfg.data.scorer)
        for path in rep.files.values():
            run.add_input(path)
        if cfg.agent.tool.retriever != "none" and cfg.agent.tool.corpus != CONTEXT_CORPUS:  # the tool's corpus: checked, hashed
            from utils.agent.retrieval import read_corpus

            run.metrics["corpus_docs"] = len(read_corpus(root / cfg.agent.tool.corpus))
            run.add_input(root / cfg.agent.tool.corpus)
        summary = summarize(rep)
        atomic_write_json(out / "summary.json", summary)
        run.add_output(out / "summary.json")
        run.warnings.extend(rep.warnings)
        run.metrics.update({f"rows_{s}": v["rows"] for s, v in summary["splits"].items()})
        run.metrics.update(errors=len(rep.errors), warnings=len(run.warnings))
        for w in run.warnings[:10]:
            print(f"warning: {w}", file=sys.stderr)
        if not rep.ok:
            shown = "\n  ".join(rep.errors[:20])
            more = f"\n  ... and {len(rep.errors) - 20} more (see {out / 'summary.json'})" if len(rep.errors) > 20 else ""
            raise StageError(f"{len(rep.errors)} data error(s):\n  {shown}{more}")
    rows = ", ".join(f"{s} {v['rows']}" for s, v in summary["splits"].items())
    print(f"{STAGE}: ok ({cfg.data.name}: {rows}; {len(run.warnings)} warning(s)) -> {out}")
    return 0


if __name__ == "__main__":
    sys.exit(run_main(STAGE, main))
