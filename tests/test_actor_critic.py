"""The Actor-Critic procedural-thinking template (model.templates.thinking: actor_critic): parsing,
prompts, gold traces with flagged slips, the same format score, 07's metrics and infer's display."""
import json

import pytest
from transformers import AutoTokenizer

from helpers import run_stage
from utils.agent.episode import Episode, Segment
from utils.agent.prompts import render_executor, render_planner
from utils.agent.protocol import (EXECUTOR, PLANNER, THINK, actor_critic_think, executor_turn, extract_tag,
                                  format_score, split_actor_critic)
from utils.agent.rollout import Codec
from utils.agent.traces import ThinkStyle, episode_from_trace, make_trace
from utils.core.config import ConfigError
from utils.core.schema import RunConfig, TemplatesConfig
from utils.eval.evaluation import actor_critic_metrics
from utils.deploy.infer import render

AC = TemplatesConfig(thinking="actor_critic", actor_critic="ac\n")
STEPS = [("12+7", "19"), ("19*3", "57"), ("57-4", "53")]


@pytest.mark.parametrize("think, parts", [
    ("actor: 1+2=4 critic: check: 1+2=4 no refined: 1+2=3", ("1+2=4", "check: 1+2=4 no", "1+2=3")),
    ("actor:a\ncritic:b\nrefined:c", ("a", "b", "c")),
    ("  actor: a  critic: b refined: c  ", ("a", "b", "c")),
    ("actor: a refined: c critic: b", None),                   # out of order
    ("actor: a critic:  refined: c", None),                     # an empty part
    ("actor: a critic: b refined: c refined: d", None),         # a label twice
    ("actor: a critic: b", None),                               # no refined part
    ("x actor: a critic: b refined: c", None),                  # text before the actor
    ("12+7=19", None), ("", None), (None, None),
])
def test_split_actor_critic(think, parts):
    assert split_actor_critic(think) == parts


def test_the_format_score_ignores_what_the_think_holds():
    for role, action in ((EXECUTOR, "<answer>19</answer>"), (PLANNER, "<task>12+7</task>")):
        plain = format_score(f"<think>12+7=19</think>{action}", role)
        ac = format_score(f"<think>{actor_critic_think('12+7=18', 'check: 12+7=18 no', '12+7=19')}</think>{action}",
                          role)
        assert plain == ac == (1.0, {"think": 1.0, "action": 1.0})
    assert format_score("<answer>19</answer>", EXECUTOR)[0] == 0.5  # no think costs the same in both modes


def test_the_instruction_comes_first_in_both_role_prompts_only_in_that_mode():
    assert render_planner(AC, "12+7*3") == "ac\nplan: 12+7*3\n"
    assert render_executor(AC, "12+7") == "ac\nsolve: 12+7\n"
    plain = TemplatesConfig(actor_critic="ac\n")
    assert render_planner(plain, "12+7*3") == "plan: 12+7*3\n" and render_executor(plain, "12+7") == "solve: 12+7\n"
    executor_only = TemplatesConfig(thinking="actor_critic", actor_critic="ac\n", actor_critic_roles="executor")
    assert render_planner(executor_only, "12+7*3") == "plan: 12+7*3\n"
    assert render_executor(executor_only, "12+7") == "ac\nsolve: 12+7\n"


def test_gold_traces_in_the_mode_flag_and_correct_the_actors_slips():
    clean = make_trace("q1", "12+7*3-4", STEPS, "53", style=ThinkStyle("actor_critic", 0.0, seed=1))
    for turn in clean.planner_turns:
        assert split_actor_critic(extract_tag(turn, THINK))
    assert extract_tag(clean.planner_turns[0], THINK) == "actor: 12+7*3-4 critic: ok refined: 12+7"
    assert [extract_tag(t, THINK) for _, t in clean.executor_calls] == [
        f"actor: {a}={r} critic: check: {a}={r} ok refined: {a}={r}" for a, r in STEPS]
    slipped = make_trace("q1", "12+7*3-4", STEPS, "53", style=ThinkStyle("actor_critic", 1.0, seed=1))
    for (task, result), (_, text) in zip(STEPS, slipped.executor_calls):
        actor, critic, refined = split_actor_critic(extract_tag(text, THINK))
        shown = actor.split("=")[1]
        assert abs(int(shown) - int(result)) == 1 and critic == f"check: {task}={shown} no"
        assert refined == f"{task}={result}" and extract_tag(text, "answer") == result  # the action stays right
    again = make_trace("q1", "12+7*3-4", STEPS, "53", style=ThinkStyle("actor_critic", 1.0, seed=1))
    assert again.executor_calls == slipped.executor_calls  # drawn from (seed, question, step): repeatable
    words = make_trace("q2", "who", [("capital of X", "Paris")], "Paris", style=ThinkStyle("actor_critic", 1.0))
    assert "critic: check: capital of X=Paris ok" in words.executor_calls[0][1]  # no slip on a non-integer
    executor_only = make_trace("q1", "12+7*3-4", STEPS, "53", style=ThinkStyle("actor_critic", 0.0, 1, "executor"))
    assert extract_tag(executor_only.planner_turns[0], THINK) == "12+7*3-4"  # the planner thinks plainly
    assert executor_only.executor_calls == clean.executor_calls
    plain = make_trace("q1", "12+7*3-4", STEPS, "53")
    assert plain.executor_calls[0][1] == executor_turn("12+7=19", "19")  # the default is unchanged


def test_the_slip_share_follows_the_rate_and_is_checked():
    style = ThinkStyle("actor_critic", 0.2, seed=3)
    texts = [style.executor(f"q{i}", 0, "12+7", "19") for i in range(2000)]
    share = sum(t.endswith("no refined: 12+7=19") for t in texts) / len(texts)
    assert 0.17 < share < 0.23
    cfg = RunConfig()
    cfg.traces.critic_error_rate = 1.5
    with pytest.raises(ConfigError, match="traces.critic_error_rate: 1.5"):
        ThinkStyle.from_config(cfg)


def test_metrics_and_infer_read_the_parts(base_dir):
    codec = Codec(AutoTokenizer.from_pretrained(base_dir), AC)
    trace = make_trace("q1", "12+7*3-4", STEPS, "53", style=ThinkStyle("actor_critic", 1.0, seed=1))
    ep = episode_from_trace(trace, codec)
    assert codec.tok.decode(ep.segments[0].context_ids, skip_special_tokens=True) == "ac\nplan: 12+7*3-4\n"
    stray = Episode("q2", "1+1", ["2"], 0, status="answered", final_answer="2")
    stray.segments += [Segment(PLANNER, 0, [], [], [], "<think>1+1</think><task>1+1</task>", "stop"),
                       Segment(EXECUTOR, 0, [], [], [], "<think>actor: 1+1=2 critic: fine refined: 2</think>"
                                                        "<answer>2</answer>", "stop")]
    assert actor_critic_metrics([ep, stray]) == pytest.approx({
        "actor_critic_rate": 8 / 9, "actor_critic_rate_planner": 4 / 5, "actor_critic_rate_executor": 1.0,
        "critic_flag_rate": 3 / 8}, abs=1e-6)  # three flagged executor slips among eight followed blocks
    assert actor_critic_metrics([ep, stray], (EXECUTOR,)) == pytest.approx({
        "actor_critic_rate": 1.0, "actor_critic_rate_executor": 1.0, "critic_flag_rate": 3 / 4}, abs=1e-6)
    shown = render(ep, [0.1] * len(ep.segments), "numeric")
    assert "        critic: check: 12+7=" in shown and "      refined: 12+7" in shown


def test_the_trace_stage_writes_the_mode(prepared):  # noqa: F811 - the fixture
    out, args = prepared
    ac = ["--set", "model.templates.thinking=actor_critic", "--set", "traces.critic_error_rate=0.5",
          "--set", "agent.max_new_tokens_planner=160", "--set", "agent.max_new_tokens_executor=96"]
    assert run_stage("03_generate_sft_traces", out, *args, *ac) == 0
    recs = [json.loads(x) for x in (out / "t" / "03_generate_sft_traces" / "sft_traces.jsonl").read_text().splitlines()]
    thinks = [extract_tag(t, THINK) for r in recs for t in r["planner_turns"]]
    thinks += [extract_tag(text, THINK) for r in recs for _, text in r["executor_calls"]]
    assert all(split_actor_critic(t) for t in thinks)
    flagged = sum(split_actor_critic(t)[1].endswith(" no") for t in thinks)
    executors = sum(len(r["executor_calls"]) for r in recs)
    assert 0.3 * executors < flagged < 0.7 * executors
