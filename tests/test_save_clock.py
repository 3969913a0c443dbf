"""utils/train/guard.py `SaveClock`: when a training loop writes its resumable checkpoint. The
steps rule and the time floor, on a clock this test moves (the wiring into 04's loop, and that a
checkpoint written for the time resumes exactly, are tests/test_sft_stages.py's kill-and-resume)."""
from utils.core.loader import load_run_config
from utils.core.stages import stage_config
from utils.train import guard


class Clock:
    def __init__(self):
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def _saved(monkeypatch, minutes: float, step_seconds: float) -> tuple[guard.SaveClock, Clock, list[int]]:
    """A SaveClock (every 5 steps, 12 in all) run over steps 1-12 of `step_seconds` each: the steps it saved."""
    clock = Clock()
    monkeypatch.setattr(guard.time, "monotonic", clock)
    saves = guard.SaveClock(every=5, last=12, minutes=minutes)
    due = []
    for step in range(1, 13):
        clock.now += step_seconds
        if saves.due(step):
            due.append(step)
    return saves, clock, due


def test_a_checkpoint_every_n_steps_at_the_last_and_once_the_minutes_have_passed(monkeypatch):
    saves, clock, due = _saved(monkeypatch, minutes=2.0, step_seconds=50.0)  # 2 minutes pass in the 3rd step
    assert due == [3, 5, 8, 10, 12]  # 3 by time; 5 by steps, which restarts the clock; 8 by time; 10; the last
    clock.now += 1000.0
    assert saves.due(13, stopped=True)  # a loop that stops early saves whatever the clock says


def test_zero_minutes_saves_by_steps_alone_and_the_minutes_are_not_hashed(monkeypatch):
    _, _, due = _saved(monkeypatch, minutes=0.0, step_seconds=1e6)
    assert due == [5, 10, 12]
    a = load_run_config(overrides=["warmup.save_minutes=0", "algorithm.rl.save_minutes=0"])
    b = load_run_config(overrides=["warmup.save_minutes=30", "algorithm.rl.save_minutes=1"])
    for stage in ("04_sft_warmup", "05_train_red_grpo"):  # when a checkpoint is written, not what is computed
        assert stage_config(a, stage) == stage_config(b, stage)
    c = load_run_config(overrides=["warmup.save_every=7"])
    assert stage_config(a, "04_sft_warmup") != stage_config(c, "04_sft_warmup")  # the slice still sees the warmup
