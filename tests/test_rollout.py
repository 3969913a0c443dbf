"""The Planner/Executor rollout: protocol handling, malformed endings, masks and serialisation.

Malformed-output cases use tests/scripted.py (scripted text, real model log-probs); the engine
comparisons run the real vLLM (CPU build) and transformers engines."""
import pytest
from transformers import AutoTokenizer

from scripted import ScriptedEngine
from utils.agent.episode import Episode, dump_episodes, episode_sequences, load_episodes
from utils.agent.rollout import Codec, Rollout, RolloutSpec
from utils.core.schema import TemplatesConfig

ROW = {"id": "q1", "question": "12+7-3", "answers": ["16"]}
GOOD_PLANNER = ["<think>12+7-3</think><task>12+7</task>", "<think>19-3</think><task>19-3</task>",
                "<think>16</think><answer>16</answer>"]
GOOD_EXECUTOR = ["<think>12+7=19</think><answer>19</answer>", "<think>19-3=16</think><answer>16</answer>"]


@pytest.fixture(scope="module")
def tok(base_dir):
    return AutoTokenizer.from_pretrained(base_dir)


def scripted(hf_base, tok, planner, executor, max_turns=4, n_rows=1, n=1):
    engine = ScriptedEngine(hf_base, tok, planner, executor)
    ro = Rollout(engine, Codec(tok, TemplatesConfig()), RolloutSpec(max_turns=max_turns))
    rows = [dict(ROW, id=f"q{i}") for i in range(n_rows)]
    return ro.run(rows, n=n, seed=0), engine


def test_well_formed_episode(hf_base, tok):
    (ep,), _ = scripted(hf_base, tok, GOOD_PLANNER, GOOD_EXECUTOR)
    assert ep.status == "answered" and ep.final_answer == "16"
    assert [s.role for s in ep.segments] == ["planner", "executor", "planner", "executor", "planner"]
    assert ep.n_turns == 3 and ep.n_subtasks == 2 and ep.format_score == 1.0
    p1, e1, p2 = ep.segments[:3]
    # the planner context persists: turn 2 = turn-1 context + turn-1 output + injected result
    _, injected = Codec(tok, TemplatesConfig()).result("19")
    assert p2.context_ids == p1.context_ids + p1.gen_ids + injected
    # the executor starts fresh with only its subtask
    assert tok.decode(e1.context_ids, skip_special_tokens=True) == "solve: 12+7\n"
    assert "<result>19</result>" in ep.transcript and "<result>16</result>" in ep.transcript


@pytest.mark.parametrize("planner,executor,status,error", [
    (["no tags at all"], GOOD_EXECUTOR, "malformed", "neither <task> nor <answer>"),
    (["<think>x</think><task>12+7"], GOOD_EXECUTOR, "malformed", "neither <task> nor <answer>"),
    (["<think>x</think><task>  </task>"], GOOD_EXECUTOR, "malformed", "empty <task>"),
    (["<think>a</think><task>1+1</task>"], ["<think>1+1=2</think><answer>2</answer>"], "max_turns", "no <answer> after 3"),
    (GOOD_PLANNER, ["<think>12+7 is hard and I will never stop thinking"], "executor_error", "never closed <answer>"),
    (["\x00\x7f<<<>>>" * 20_000], GOOD_EXECUTOR, "malformed", "neither"),
    (["<task>1+1</task><answer>2"], GOOD_EXECUTOR, "max_turns", None),
])
def test_malformed_output_ends_cleanly_with_format_zero(hf_base, tok, planner, executor, status, error):
    (ep,), _ = scripted(hf_base, tok, planner, executor, max_turns=3)
    assert ep.status == status
    if error:
        assert error in ep.error
    assert ep.format_score == 0.0
    assert ep.final_answer is None
    assert f"[end: {status}" in ep.transcript


def test_one_engine_call_per_role_per_turn(hf_base, tok):
    eps, engine = scripted(hf_base, tok, GOOD_PLANNER, GOOD_EXECUTOR, n_rows=2, n=2)
    assert len(eps) == 4
    assert engine.calls == {"planner": 3, "executor": 2}
    assert all(e.status == "answered" and e.final_answer == "16" for e in eps)


def test_result_tokens_are_never_trained(hf_base, tok):
    """Changing the injected <result> tokens changes no trained position (mask invariance)."""
    (a,), _ = scripted(hf_base, tok, GOOD_PLANNER, GOOD_EXECUTOR)
    other = ["<think>12+7=18</think><answer>18</answer>", GOOD_EXECUTOR[1]]
    (b,), _ = scripted(hf_base, tok, GOOD_PLANNER, other)
    pa, pb = episode_sequences(a)[0], episode_sequences(b)[0]
    assert pa.role == pb.role == "planner"
    ids_a, mask_a, lp_a = pa.ids, pa.mask, pa.logprobs
    ids_b, mask_b = pb.ids, pb.mask
    assert mask_a == mask_b and len(ids_a) == len(ids_b)
    differ = [k for k in range(len(ids_a)) if ids_a[k] != ids_b[k]]
    assert differ, "the two episodes should differ in their injected results"
    assert all(mask_a[k] == 0 for k in differ)
    trained = [k for k, m in enumerate(mask_a) if m]
    assert [ids_a[k] for k in trained] == [ids_b[k] for k in trained]
    assert sum(mask_a) == sum(len(s.gen_ids) for s in a.segments if s.role == "planner")
    assert all(lp == 0.0 for lp, m in zip(lp_a, mask_a) if not m)


def test_episodes_round_trip_through_jsonl(hf_base, tok, tmp_path):
    eps, _ = scripted(hf_base, tok, GOOD_PLANNER * 2, GOOD_EXECUTOR * 2, n=2)
    dump_episodes(eps, tmp_path / "eps.jsonl")
    back = load_episodes(tmp_path / "eps.jsonl")
    assert [e.to_json() for e in back] == [e.to_json() for e in eps]
    assert isinstance(back[0], Episode) and episode_sequences(back[0])[0].mask[-1] == 1


def test_context_overflow_ends_the_episode(hf_base, tok):
    engine = ScriptedEngine(hf_base, tok, GOOD_PLANNER, GOOD_EXECUTOR)
    _, prompt = Codec(tok, TemplatesConfig()).planner_prompt(ROW["question"])
    ro = Rollout(engine, Codec(tok, TemplatesConfig()), RolloutSpec(max_model_len=len(prompt)))
    (ep,) = ro.run([ROW], n=1, seed=0)
    assert ep.status == "malformed" and ep.error == "planner context exceeds max_model_len"
    assert ep.format_score == 0.0 and not ep.segments


def test_gold_trace_examples_equal_the_rollout_of_the_same_texts(hf_base, tok):
    """SFT traces and RL batches are built by one function from the same kind of episode: the gold
    trace's examples are exactly the training sequences of a rollout that generated its texts."""
    from utils.agent.traces import examples_from_trace, make_trace

    trace = make_trace("q0", ROW["question"], [("12+7", "19"), ("19-3", "16")], "16")
    assert trace.planner_turns == GOOD_PLANNER and [t for _, t in trace.executor_calls] == GOOD_EXECUTOR
    (ep,), _ = scripted(hf_base, tok, GOOD_PLANNER, GOOD_EXECUTOR)
    from_rollout = [(e.role, e.ids, e.mask) for e in episode_sequences(ep)]
    from_trace = [(e.role, e.ids, e.mask) for e in examples_from_trace(trace, Codec(tok, TemplatesConfig()))]
    assert [r for r, _, _ in from_trace] == ["planner", "executor", "executor"]
    assert from_trace == from_rollout
