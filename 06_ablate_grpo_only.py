"""06_ablate_grpo_only: the RED-GRPO trainer of 05 with the `grpo` algorithm config (SFT term off).

Same code path, same outputs layout (outputs/<run_id>/06_ablate_grpo_only/grpo/); only the config
differs. Any 05 flag works here.
"""
import importlib
import sys

from utils.stages import run_main

STAGE = "06_ablate_grpo_only"

if __name__ == "__main__":
    trainer = importlib.import_module("05_train_red_grpo")
    sys.exit(run_main(STAGE, lambda: trainer.train(STAGE, default_algorithm="grpo")))
