"""06_ablate_grpo_only: the RED-GRPO trainer of 05 with the `grpo` algorithm config (SFT term off).

Same code path (utils/train/rl_stage.py), same outputs layout
(outputs/<run_id>/06_ablate_grpo_only/grpo/); only the config differs. Any 05 flag works here.
"""
import sys

from utils.core.stages import run_main
from utils.train.rl_stage import run_rl_stage

STAGE = "06_ablate_grpo_only"

if __name__ == "__main__":
    sys.exit(run_main(STAGE, lambda: run_rl_stage(STAGE, __doc__, sys.argv[1:], default_algorithm="grpo")))
