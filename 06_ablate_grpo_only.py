"""06_ablate_grpo_only: the pure-RL methods, no SFT term, grpo by default (the others are named in
--help; the methods with an SFT term are 05's, and this script refuses them).

The same trainer as 05 (utils/train/rl_stage.py), the same outputs layout
(outputs/<run_id>/06_ablate_grpo_only/<method>/); only the config differs. Any 05 flag works here.
"""
import sys

from utils.core.stages import run_main
from utils.train.rl_stage import run_rl_stage

STAGE = "06_ablate_grpo_only"

if __name__ == "__main__":
    sys.exit(run_main(STAGE, lambda: run_rl_stage(STAGE, __doc__, sys.argv[1:], default_algorithm="grpo")))
