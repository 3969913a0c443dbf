"""05_train_red_grpo: the methods with an SFT term, red by default (the same trainer with another
--algorithm config, each named in --help; the pure-RL methods are 06's, and this script
refuses them).

Each step rolls out questions x n samples on the engine serving the current LoRA adapter,
scores them with the reward spec, and takes one optimizer step on
L_GRPO − β·H + w_entropy·w_acc·α·L_SFT (utils/train/update.py); the new adapter then goes to the engine.
Writes outputs/<run_id>/<stage>/<method>/: metrics.jsonl (and wandb files, offline unless
WANDB_API_KEY is set), episodes/step_N.jsonl every rl.dump_freq steps, ckpt/step_N (resumable,
last rl.keep_last kept), final_adapter/ and the manifest. An interrupted run resumes.
The stage itself is utils/train/rl_stage.py, shared with 06.
"""
import sys

from utils.core.stages import run_main
from utils.train.rl_stage import run_rl_stage

STAGE = "05_train_red_grpo"

if __name__ == "__main__":
    sys.exit(run_main(STAGE, lambda: run_rl_stage(STAGE, __doc__, sys.argv[1:], default_algorithm="red")))
