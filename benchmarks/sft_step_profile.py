"""What 04's SFT step costs against the compute floor of the same batch: the speed issue's ratio.

    .venv/bin/python benchmarks/sft_step_profile.py [--run outputs/run_001] [--steps 30] [--rounds 3] [--compile]

Builds 04's model (the base with a fresh LoRA, seeded as 04 seeds it) and its SFT loop on the
run's own traces (03_generate_sft_traces/sft_traces.jsonl), writing only under a temporary
directory. It records `--steps` of the loop's batches, then times, per batch and alternating in
`--rounds` rounds so that the box's drift falls on each alike:
- **step**: the loop's real optimizer step (`SftLoop._update` and the lr schedule: the loss
  through the LoRA model, backward, clipping, AdamW);
- **lora fwd+bwd**: the same loss and backward through the LoRA model, no optimizer;
- **peft fwd+bwd**: the same through a copy running peft's own LoRA forward, not the fused one
  load_policy installs (utils/train/lora_fast.py): what that forward saves;
- **folded fwd+bwd**: the same through a copy running the folded forward (`model.lora.forward:
  folded`, one wide product a layer, not the same arithmetic), or the fused one when the run's
  config already folds (then the step is the folded one);
- **merged fwd+bwd**: the same loss and backward through a copy with the adapter merged into the
  weights and every weight frozen but the input embedding, so the backward computes the same
  activation gradients without the rank-r products: the floor the speed issue measures against.

Prints each one's median seconds per batch, then the last line

    step/merged=<ratio> lora/merged=<ratio> peft/merged=<ratio> folded/merged=<ratio> optimizer_share=<(step - lora) / step>

With `--compile`, the LoRA model (for the step and its fwd+bwd), peft's copy and the floor run under
`torch.compile(dynamic=True)`; the first pass over each is untimed and its seconds printed (the
compile cost a run would pay once). A lever to measure, not what 04 does.

Each ratio is of two medians from this one run, since the box is shared and noisy; the target is
step/merged <= 1.3. docs/PERFORMANCE.md quotes it. Not a test.
"""
import argparse
import copy
import statistics
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from utils.agent.traces import read_trace_examples  # noqa: E402
from utils.core.config import ROOT  # noqa: E402
from utils.core.models import load_tokenizer  # noqa: E402
from utils.core.stages import model_dir, recorded_config  # noqa: E402
from utils.train.lora_fast import install_fast_lora, uninstall_fast_lora  # noqa: E402
from utils.train.policy import load_policy  # noqa: E402
from utils.train.sft_floor import fwd_bwd, merged_floor, profile, record_batches  # noqa: E402
from utils.train.sft_trainer import SftLoop  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--run", type=Path, default=ROOT / "outputs" / "run_001")
    ap.add_argument("--steps", type=int, default=30, help="batches recorded and timed")
    ap.add_argument("--rounds", type=int, default=3, help="passes over the recorded batches")
    ap.add_argument("--compile", action="store_true", help="torch.compile the models first (dynamic shapes)")
    args = ap.parse_args()
    import torch

    if not (args.run / "04_sft_warmup" / "manifest.json").is_file():
        sys.exit(f"sft_step_profile: {args.run / '04_sft_warmup'} has no manifest: run 09_driver.py (or 00-04) first")
    cfg = recorded_config(args.run / "04_sft_warmup")  # the model, LoRA and warmup the run trained with
    if cfg.threads:
        torch.set_num_threads(cfg.threads)
    traces = args.run / "03_generate_sft_traces" / "sft_traces.jsonl"
    if not traces.exists():
        sys.exit(f"sft_step_profile: {traces} missing: run 09_driver.py (or 00-03) for {args.run} first")
    base = model_dir(cfg)
    pad_id = load_tokenizer(base, cfg.model.trust_remote_code).pad_token_id
    torch.manual_seed(cfg.seed)  # 04's LoRA init
    model = load_policy(base, cfg.model.lora, cfg.model.dtype, trust_remote_code=cfg.model.trust_remote_code)
    loop = SftLoop(model, read_trace_examples(traces), cfg.warmup, cfg.seed, pad_id,
                   Path(tempfile.mkdtemp(prefix="sft_step_profile_")), None, "profile")
    model.train()
    batches = record_batches(loop, args.steps)
    floor, stock, other = merged_floor(model), copy.deepcopy(model), copy.deepcopy(model)
    uninstall_fast_lora(stock)
    install_fast_lora(other, "fused" if cfg.model.lora.forward == "folded" else "folded")
    if args.compile:
        loop.model, floor = torch.compile(model, dynamic=True), torch.compile(floor, dynamic=True)
        stock, other = torch.compile(stock, dynamic=True), torch.compile(other, dynamic=True)
    for name, m in (("lora", loop.model), ("peft", stock), ("folded", other), ("merged", floor)):  # first-call costs are not a step's
        print(f"first fwd+bwd, {name}: {sum(fwd_bwd(m, b, pad_id) for b in batches[:2]):.1f} s")
    times = profile(loop, stock, other, floor, batches, args.rounds, pad_id)
    med = {k: statistics.median(v) for k, v in times.items()}
    tokens = statistics.fmean(sum(len(e.ids) for e in b) for b in batches)
    print(f"{args.run}: {args.steps} batches of {cfg.warmup.batch_size} ({tokens:.0f} tokens each on average), "
          f"{args.rounds} rounds, {torch.get_num_threads()} threads{', compiled' if args.compile else ''}")
    for k, v in med.items():
        print(f"{k:<16}{v * 1000:>9.1f} ms  (spread {min(times[k]) * 1000:.1f}-{max(times[k]) * 1000:.1f})")
    print(f"step/merged={med['step'] / med['merged fwd+bwd']:.2f} lora/merged={med['lora fwd+bwd'] / med['merged fwd+bwd']:.2f} "
          f"peft/merged={med['peft fwd+bwd'] / med['merged fwd+bwd']:.2f} "
          f"folded/merged={med['folded fwd+bwd'] / med['merged fwd+bwd']:.2f} "
          f"optimizer_share={(med['step'] - med['lora fwd+bwd']) / med['step']:.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
