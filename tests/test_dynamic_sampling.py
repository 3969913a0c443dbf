"""DAPO's dynamic sampling in the RL trainer (algorithm.rl.dynamic_sampling): groups whose answer
scores are all equal are dropped and the batch refilled from the question stream, the cap on extra
rounds holds, and a step where no group carries a signal stops the run instead of training on
nothing. The policy is a real LoRA model; the sampler is a rule engine whose right answers are
known by construction (tests/scripted.py), so the counts are exact on any CPU."""
import copy

import pytest
import torch
from transformers import AutoTokenizer

from scripted import RuleEngine
from helpers import EVERY_QUESTION, make_trainer
from utils.core.loader import load_run_config
from utils.core.stages import StageError
from utils.core.stream import rl_question_key, take


def _cfg(rounds: int, refill: str = "rounds"):
    return load_run_config(algorithm="grpo", overrides=[
        *EVERY_QUESTION, "algorithm.rl.steps=1", "algorithm.rl.questions_per_step=4", "algorithm.rl.n_samples=4",
        f"algorithm.rl.dynamic_sampling={rounds}", "algorithm.rl.save_freq=100", "algorithm.rl.dump_freq=0",
        f"algorithm.rl.refill={refill}"])


def _engine(hf_base, base_dir, rows, mixed: set[str]):
    """The planner answers at once: on a `mixed` question only the first of its samples is right
    (a group with a signal); on any other all are wrong (a group without one)."""
    gold = {r["question"]: r["answers"][0] for r in rows}

    def respond(role, prompt, call, occurrence):  # noqa: ARG001
        question = prompt.removeprefix("plan: ").split("\n")[0]
        right = question in mixed and occurrence == 0
        return f"<answer>{gold[question] if right else int(gold[question]) + 1}</answer>"
    return RuleEngine(hf_base, AutoTokenizer.from_pretrained(base_dir), respond)


def _expected(trainer, rounds: int, mixed: set[str]):
    """What the stream hands out: round 0 takes 4 questions, each later round as many as are missing."""
    cursor, kept, seen = copy.deepcopy(trainer.state.questions), [], []
    for r in range(rounds + 1):
        batch = take(trainer.rows, 4 - len(kept), rl_question_key(trainer.cfg.seed), cursor)
        seen += batch
        kept += [q for q in batch if q["question"] in mixed]
        if len(kept) >= 4:
            return kept[:4], seen, r + 1
    return kept, seen, rounds + 1


@pytest.mark.parametrize("refill", ["rounds", "pipelined"])
@pytest.mark.parametrize("rounds", [1, 6])
def test_dropped_groups_are_refilled_up_to_the_cap(hf_base, base_dir, tmp_path, rounds, refill):
    """Both refills keep the same groups: pipelined starts each replacement when its dropped group
    ends, at the place and with the seeds it has in rounds."""
    trainer = make_trainer(_cfg(rounds, refill), None, None, tmp_path, base_dir)
    mixed = {r["question"] for i, r in enumerate(trainer.rows) if i % 3 == 0}
    engine = _engine(hf_base, base_dir, trainer.rows, mixed)
    trainer.engine = trainer.rollout.engine = engine
    kept, seen, used = _expected(trainer, rounds, mixed)
    start = copy.deepcopy(trainer.state.questions)
    assert len(seen) > 4  # the first batch alone does not fill it: something was dropped
    metrics = trainer.step()
    rows, episodes = trainer.last_rollout.rows, trainer.last_rollout.episodes
    assert [r["id"] for r in rows] == [q["id"] for q in kept]  # only groups with a signal, in stream order
    assert metrics["train/kept_groups"] == len(kept) and metrics["train/sampling_rounds"] == used <= rounds + 1
    assert 0 < metrics["time/rollout_refill"] < metrics["time/rollout"]  # the extra rounds, inside the rollout
    assert metrics["train/dropped_groups"] == len(seen) - len(kept)
    # the step consumed kept + dropped questions (utils/eval/batch_mix.py rebuilds on it)
    take(trainer.rows, metrics["train/kept_groups"] + metrics["train/dropped_groups"], rl_question_key(trainer.cfg.seed), start)
    assert trainer.state.questions == start
    assert len(episodes) == 4 * len(kept) and metrics["train/zero_variance_groups"] == 0
    # accuracy is over every sampled episode: one right of 4 in each mixed group seen
    assert metrics["train/accuracy"] == pytest.approx(sum(q["question"] in mixed for q in seen) / (4 * len(seen)))
    if rounds == 1:
        assert used == 2 and len(kept) < 4  # the cap stopped it short of a full batch


@pytest.mark.parametrize("refill", ["rounds", "pipelined"])
def test_a_step_with_no_signal_stops_the_run_without_training(hf_base, base_dir, tmp_path, refill):
    trainer = make_trainer(_cfg(2, refill), None, None, tmp_path, base_dir)
    trainer.engine = trainer.rollout.engine = _engine(hf_base, base_dir, trainer.rows, mixed=set())
    before = {n: p.detach().clone() for n, p in trainer.model.named_parameters() if p.requires_grad}
    with pytest.raises(StageError, match=r"every group of 12 questions had equal answer scores .* after 2 extra "
                                         r"sampling rounds \(algorithm.rl.dynamic_sampling=2\): nothing to train on"):
        trainer.step()
    assert all(torch.equal(p, before[n]) for n, p in trainer.model.named_parameters() if p.requires_grad)
    assert trainer.state.step == 0


def test_an_expert_gives_its_group_a_signal_under_red_paper(hf_base, base_dir, tmp_path):
    """Every rollout is wrong; a question with a (right) red_paper expert still has a signal, since the
    expert takes its group's last place, so exactly the questions with experts are kept."""
    from utils.agent.traces import OfflineSample, examples_from_trace, trace_from_row

    cfg = load_run_config(algorithm="red_paper", overrides=[
        *EVERY_QUESTION, "algorithm.rl.steps=1", "algorithm.rl.questions_per_step=4", "algorithm.rl.n_samples=4",
        "algorithm.rl.dynamic_sampling=3", "algorithm.rl.save_freq=100", "algorithm.rl.dump_freq=0"])
    trainer = make_trainer(cfg, None, None, tmp_path, base_dir)
    trainer.engine = trainer.rollout.engine = _engine(hf_base, base_dir, trainer.rows, mixed=set())
    for row in trainer.rows[::3]:
        trace, _ = trace_from_row(row, "gold")
        trainer.offline[row["id"]] = OfflineSample(examples_from_trace(trace, trainer.rollout.codec), trace.answer,
                                                   [t for t, _ in trace.executor_calls])
    experts = {r["question"] for r in trainer.rows[::3]}
    kept, seen, used = _expected(trainer, 3, experts)
    metrics = trainer.step()
    rows = trainer.last_rollout.rows
    assert [r["id"] for r in rows] == [q["id"] for q in kept] and len(kept) == 4
    assert metrics["train/dropped_groups"] == len(seen) - 4 > 0 and metrics["train/sampling_rounds"] == used
    assert metrics["red_paper/offline_groups"] == 4 and metrics["train/accuracy"] == 0.0  # rollouts only


def test_dynamic_sampling_is_refused_on_several_ranks(tmp_path):
    from utils.train.world import World
    from utils.train.grpo_trainer import GrpoTrainer

    with pytest.raises(StageError, match=r"dynamic_sampling=2 needs one rank \(this run has 2\).*"
                                         r"set algorithm.rl.dynamic_sampling=0"):
        GrpoTrainer(_cfg(2), torch.nn.Linear(1, 1), None, None, None, [], [], 0, tmp_path, None, "sha",
                    world=World(rank=0, size=2))


@pytest.mark.parametrize("refill", ["rounds", "pipelined"])
def test_the_sampler_needs_no_trainer_only_a_rollout_a_spec_and_a_question_stream(hf_base, base_dir, refill):
    """utils/train/sampler.py's seam: DynamicSampler built from the rollout, the reward spec and a
    stream function, with no policy model or trainer, keeps the groups with a signal in stream
    order and draws from the stream exactly the questions it rolled out."""
    from utils.agent.rollout import Codec, Rollout, RolloutSpec
    from utils.core.stream import Cursor
    from utils.reward.spec import RewardSpec
    from utils.tinyarith.quick import short_chain_rows
    from utils.train.sampler import DynamicSampler

    cfg = _cfg(3, refill)
    rows = short_chain_rows(40)
    mixed = {r["question"] for i, r in enumerate(rows) if i % 3 == 0}
    codec = Codec(AutoTokenizer.from_pretrained(base_dir), cfg.model.templates)
    rollout = Rollout(_engine(hf_base, base_dir, rows, mixed), codec, RolloutSpec.from_config(cfg, 1.0))
    cursor, drawn = Cursor(), []

    def stream(k: int) -> list[dict]:
        batch = take(rows, k, rl_question_key(cfg.seed), cursor)
        drawn.extend(batch)
        return batch

    sampler = DynamicSampler(rollout, RewardSpec(), stream, cfg.algorithm.rl, cfg.seed)
    batch = sampler.sample(stream(4), step=0, first=0)
    assert [r["id"] for r in batch.rows] == [q["id"] for q in drawn if q["question"] in mixed][:4]
    assert len(batch.episodes) == len(batch.scored) == 4 * len(batch.rows)
    assert batch.metrics["train/kept_groups"] + batch.metrics["train/dropped_groups"] == len(drawn) > 4
    assert batch.accuracy == pytest.approx(sum(q["question"] in mixed for q in drawn) / (4 * len(drawn)))
