"""Serving what was trained, on loopback only: a real `vllm serve` of tiny-arith with a trained
adapter as a LoRA module answers HTTP; the `openai` engine's greedy rollouts through it equal the
offline vLLM engine's; the LLM judge makes a real round trip; the inference command runs against it
and offline; an endpoint that never answers gives an error in its timeout, not a hang. Every server
started here is stopped here."""
import json
import socket
import subprocess
import sys
import threading
import time

import pytest
from transformers import AutoTokenizer

from helpers import arith_rows, free_port, greedy_episodes
from utils.core.config import ROOT
from utils.core.http import request_json
from utils.core.schema import EngineConfig, JudgeConfig

CHAT = "{% for m in messages %}{{ m['content'] }}\n{% endfor %}"  # tiny-arith's tokenizer has no chat template


@pytest.fixture(scope="module")
def served(protocol_adapter, base_dir, tmp_path_factory):
    from utils.deploy.serve import Server

    tmp = tmp_path_factory.mktemp("serve")
    (tmp / "chat.jinja").write_text(CHAT)
    server = Server(base_dir, {"proto": protocol_adapter}, EngineConfig(memory_share=0.1, max_lora_rank=8),
                    free_port(), tmp / "server.log", chat_template=str(tmp / "chat.jinja"))
    ready = server.start(timeout=600)
    print(f"vllm serve ready in {ready:.1f} s")
    yield server
    server.stop()
    assert server.proc.poll() is not None  # stopped, and its port closed
    with pytest.raises(OSError):
        socket.create_connection(("127.0.0.1", int(server.url.split(":")[2].split("/")[0])), timeout=2).close()


def test_served_adapter_answers_an_http_request(served, protocol_adapter):
    listing = request_json(served.url, "/models", None, timeout=10)
    roots = {m["id"]: m.get("root") for m in listing["data"]}
    assert set(roots) == {"base", "proto"} and roots["proto"] == str(protocol_adapter)
    body = {"model": "proto", "prompt": "plan: 12+30-7\n", "max_tokens": 48, "temperature": 0, "stop": ["</task>"],
            "include_stop_str_in_output": True}
    text = request_json(served.url, "/completions", body, timeout=60)["choices"][0]["text"]
    base = request_json(served.url, "/completions", {**body, "model": "base"}, timeout=60)["choices"][0]["text"]
    assert "<task>" in text and text.endswith("</task>") and "<task>" not in base  # the adapter, not the base


def test_openai_engine_agrees_with_the_offline_engine(served, vllm_engine, protocol_adapter, base_dir):
    from utils.agent.served import OpenAIEngine

    tok = AutoTokenizer.from_pretrained(base_dir)
    engine = OpenAIEngine(base_dir, EngineConfig(base_url=served.url))
    rows = arith_rows(12)
    answered = {}
    for adapter in (protocol_adapter, None):
        engine.set_adapter(adapter)
        vllm_engine.set_adapter(adapter)
        online, offline = greedy_episodes(engine, tok, rows), greedy_episodes(vllm_engine, tok, rows)
        for a, b in zip(online, offline):
            assert (a.status, a.final_answer) == (b.status, b.final_answer)
            assert [(s.role, s.context_ids, s.gen_ids, s.text) for s in a.segments] == \
                   [(s.role, s.context_ids, s.gen_ids, s.text) for s in b.segments]
            for sa, sb in zip(a.segments, b.segments):
                assert max([abs(x - y) for x, y in zip(sa.logprobs, sb.logprobs)] + [0.0]) < 1e-4
        answered[adapter] = sum(e.status == "answered" for e in online)
    assert answered[protocol_adapter] >= len(rows) // 2 and answered[None] == 0  # real episodes, and the base's


def test_openai_engine_names_what_it_cannot_find(served, base_dir, tmp_path):
    from utils.agent.served import EndpointError, OpenAIEngine

    engine = OpenAIEngine(base_dir, EngineConfig(base_url=served.url))
    with pytest.raises(EndpointError, match=f"serves no adapter loaded from {tmp_path}"):
        engine.set_adapter(tmp_path)
    with pytest.raises(EndpointError, match=r"serves \['base', 'proto'\], not the base model"):
        OpenAIEngine(base_dir, EngineConfig(base_url=served.url, served_model="nope"))


def test_judge_round_trip_through_the_served_model(served, monkeypatch):
    from utils.reward.judge import check_judge, judge_score

    monkeypatch.setenv("OPENAI_API_KEY", "sk-planted-never-needed")  # sent as a header, accepted by the server
    cfg = JudgeConfig(enabled=True, base_url=served.url, model="base", timeout=60)
    assert set(check_judge(cfg)) == {"base", "proto"}
    score, comps = judge_score(cfg, "12+30-7", "35", ["35"])
    # the tiny model is no grader: the point is the real request, the reply and its parsing
    assert isinstance(comps["judge_reply"], str) and 0.0 <= score <= 1.0
    assert comps["judge_error"] in (None, "no score 0-10 in reply")


def test_inference_command_on_the_served_model_and_offline(served, protocol_adapter, tmp_path):
    questions = tmp_path / "qs.jsonl"
    questions.write_text(json.dumps({"question": "12+30-7", "answers": ["35"]}) + "\n"
                         + json.dumps({"question": "40-8+3", "answers": ["35"]}) + "\n")
    for engine in ("openai", "hf"):
        out = subprocess.run([sys.executable, "-m", "utils.deploy.infer", "--engine", engine, "--checkpoint",
                              str(protocol_adapter), "--questions", str(questions), "--save", str(tmp_path / engine),
                              "--set", f"model.engine.base_url={served.url}"], cwd=ROOT, capture_output=True,
                             text=True, timeout=300)
        assert out.returncode == 0, out.stderr
        assert out.stdout.count("question: ") == 2 and "planner turn 1 (" in out.stdout
        assert "executor (" in out.stdout and "(gold 35: " in out.stdout
        saved = [json.loads(line) for line in (tmp_path / engine).read_text().splitlines()]
        assert [r["question"] for r in saved] == ["12+30-7", "40-8+3"] and all(r["times"] for r in saved)
    answers = [[json.loads(line)["answer"] for line in (tmp_path / e).read_text().splitlines()] for e in ("openai", "hf")]
    assert answers[0] == answers[1]  # greedy: the served model and transformers agree
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"question": "1+2"}\n{"q": "3+4"}\n')
    out = subprocess.run([sys.executable, "-m", "utils.deploy.infer", "--engine", "hf", "--questions", str(bad),
                          "--checkpoint", str(protocol_adapter)], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert out.returncode == 1 and f"{bad}, row 2, field 'question': expected a non-empty string" in out.stderr


def test_an_endpoint_that_never_answers_times_out(base_dir):
    from utils.agent.served import EndpointError, OpenAIEngine
    from utils.reward.judge import judge_score

    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(8)  # accepts connections, never replies
    held = []
    stop = threading.Event()

    def accept():
        listener.settimeout(0.2)
        while not stop.is_set():
            try:
                held.append(listener.accept()[0])
            except OSError:
                pass

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    url = f"http://127.0.0.1:{listener.getsockname()[1]}/v1"
    try:
        t0 = time.time()
        score, comps = judge_score(JudgeConfig(enabled=True, base_url=url, timeout=1.0), "q", "a", ["a"])
        assert score == 0.0 and "timed out" in comps["judge_error"] and time.time() - t0 < 10
        t0 = time.time()
        with pytest.raises(EndpointError, match="failed .*timed out.*python -m utils.deploy.serve"):
            OpenAIEngine(base_dir, EngineConfig(base_url=url, request_timeout=1.0))
        assert time.time() - t0 < 10
    finally:
        stop.set()
        thread.join()
        for c in held:
            c.close()
        listener.close()
