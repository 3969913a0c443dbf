"""What an RL run checkpoints besides its weights and optimizer (utils/train/grpo_trainer.py): the
step, the question and SFT streams' cursors, RED's state, and what a method's variant carries from
step to step (red_paper's previous entropies, ReLIFT's buffer)."""
from __future__ import annotations

from dataclasses import asdict, dataclass, field

from utils.core.stream import Cursor
from utils.train.red import RedState


@dataclass
class TrainState:
    step: int = 0
    questions: Cursor = field(default_factory=Cursor)  # the (seed, "q", epoch)-shuffled question stream
    sft: Cursor = field(default_factory=Cursor)  # the (seed, "s", epoch)-shuffled SFT example stream
    red: dict = field(default_factory=lambda: asdict(RedState()))
    red_paper: dict = field(default_factory=dict)  # red_paper: the previous step's entropies (h_sft, h_rl)
    relift: list = field(default_factory=list)  # ReLIFT's buffer: question ids, newest first

    @classmethod
    def from_json(cls, d: dict) -> "TrainState":
        return cls(**{**d, "questions": Cursor(**d["questions"]), "sft": Cursor(**d["sft"])})
