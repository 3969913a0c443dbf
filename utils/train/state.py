"""What an RL run checkpoints besides its weights and optimizer (utils/train/grpo_trainer.py): the
step, the question and SFT streams' cursors, RED's state, and what a method's variant carries from
step to step: what a method's own policy loss reads from the previous step (red_paper's entropies),
and what each method in one file keeps, under its name (utils/core/method_files.py)."""
from __future__ import annotations

from dataclasses import asdict, dataclass, field

from utils.core.method_files import method_files
from utils.core.stream import Cursor
from utils.train.red import RedState


@dataclass
class TrainState:
    step: int = 0
    questions: Cursor = field(default_factory=Cursor)  # the (seed, "q", epoch)-shuffled question stream
    sft: Cursor = field(default_factory=Cursor)  # the (seed, "s", epoch)-shuffled SFT example stream
    red: dict = field(default_factory=lambda: asdict(RedState()))
    piece_state: dict = field(default_factory=dict)  # a method's own policy loss's previous step (red_paper: h_sft, h_rl)
    methods: dict = field(default_factory=dict)  # each method file's own state, by its name

    @classmethod
    def from_json(cls, d: dict) -> "TrainState":
        """The state a checkpoint wrote; one written before 2026-12-07's method seam holds `piece_state`
        as `red_paper`, and a method file's state at the top level under the method's name."""
        d = {("piece_state" if k == "red_paper" else k): v for k, v in d.items()}
        moved = {mf.name: d.pop(mf.name) for mf in method_files() if mf.name in d}
        if moved:
            d["methods"] = {**d.get("methods", {}), **moved}
        return cls(**{**d, "questions": Cursor(**d["questions"]), "sft": Cursor(**d["sft"])})
