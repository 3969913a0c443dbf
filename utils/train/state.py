"""What an RL run checkpoints besides its weights and optimizer (utils/train/grpo_trainer.py): the
step, the question and SFT streams' cursors, RED's state, and what a method's variant carries from
step to step (what a method's own policy loss reads from the previous step: red_paper's entropies;
ReLIFT's buffer)."""
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
    piece_state: dict = field(default_factory=dict)  # a method's own policy loss's previous step (red_paper: h_sft, h_rl)
    relift: list = field(default_factory=list)  # ReLIFT's buffer: question ids, newest first

    @classmethod
    def from_json(cls, d: dict) -> "TrainState":
        """The state a checkpoint wrote; one written before `piece_state` had its name holds it as `red_paper`."""
        d = {("piece_state" if k == "red_paper" else k): v for k, v in d.items()}
        return cls(**{**d, "questions": Cursor(**d["questions"]), "sft": Cursor(**d["sft"])})
