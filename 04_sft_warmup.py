"""04_sft_warmup: LoRA SFT warmup on the traces, validated with greedy rollouts.

Not implemented yet (issue #5); it exits with status 2 and writes nothing.
"""
import sys

from utils.cli import not_implemented

if __name__ == "__main__":
    sys.exit(not_implemented("04_sft_warmup", "issue #5"))
