"""The executor's search tool: corpus checks, the real bm25s and faiss indexes, the tool step in the
rollout (scripted text on the real base model, then a trained adapter on vLLM and transformers),
the masking of injected information, and the lookup task's gold traces and stages."""
import json
import random
from pathlib import Path

import numpy as np
import pytest
from transformers import AutoTokenizer

from scripted import ScriptedEngine
from utils.agent.episode import episode_sequences
from utils.agent.retrieval import (DenseRetriever, HFEmbedder, QueryTooLong, build_index, load_index, read_corpus,
                                   render_information)
from utils.agent.rollout import Codec, Rollout, RolloutSpec
from utils.agent.traces import examples_from_trace, trace_from_row
from utils.core.io import DataError
from utils.core.schema import DataConfig, TemplatesConfig
from utils.data.lookup import CRATES, generate_lookup
from utils.data.synthetic import write_dataset

INFO = RolloutSpec().information


@pytest.fixture(scope="module")
def tok(base_dir):
    return AutoTokenizer.from_pretrained(base_dir)


@pytest.fixture(scope="module")
def lookup(tmp_path_factory):
    """A small synthetic_lookup dataset on disk and its bm25 index."""
    root = tmp_path_factory.mktemp("lookup")
    write_dataset(DataConfig(name="synthetic_lookup", seed=7, n_train=300, n_val=10, n_test=16, min_steps=2,
                             max_steps=3, operand_max=40), root / "data")
    build_index("bm25", root / "data" / "corpus.jsonl", root / "index")
    return root


def _rows(root: Path, split: str) -> list[dict]:
    from utils.data.adapters import load_split

    _, rows = load_split("synthetic_lookup", root / "data", split)
    return [r.to_json() for _, r in rows]


def _search_fn(retriever, k=2):
    def search(query):
        passages = retriever.search(query, k)
        return render_information(INFO, passages), [p.id for p in passages]
    return search


# ------------------------------------------------------------------ corpus and retrievers

@pytest.mark.parametrize("content,row,field,what", [
    (None, None, None, "not found"),
    ("", None, None, "empty"),
    ('{"id": "a", "title": "t", "text": "x"}\n{"id": "b", "title": "t"\n', 2, None, ""),
    ('{"id": "a", "title": "t", "text": "x"}\n{"id": "b", "text": "y"}\n', 2, "title", "missing field"),
    ('{"id": 3, "title": "t", "text": "x"}\n', 1, "id", "expected str"),
    ('{"id": "a", "title": "t", "text": "  "}\n', 1, "text", "empty text"),
    ('{"id": "a", "title": "t", "text": "x"}\n{"id": "a", "title": "u", "text": "y"}\n', 2, "id", "duplicate id"),
])
def test_bad_corpus_names_file_row_and_field(tmp_path, content, row, field, what):
    path = tmp_path / "corpus.jsonl"
    if content is not None:
        path.write_text(content)
    with pytest.raises(DataError) as err:
        build_index("bm25", path, tmp_path / "index")
    assert str(path) in str(err.value) and what in str(err.value)
    assert (err.value.row, err.value.field) == (row, field)
    assert not (tmp_path / "index").exists()  # nothing half-built


def test_unknown_retriever_lists_the_valid_ones(tmp_path, lookup):
    with pytest.raises(KeyError, match="valid: bm25, dense"):
        build_index("tfidf", lookup / "data" / "corpus.jsonl", tmp_path / "index")


def test_bm25_puts_the_gold_fact_first_and_round_trips(lookup):
    docs = read_corpus(lookup / "data" / "corpus.jsonl")
    retriever = load_index(lookup / "index", max_query_chars=40)
    for doc in random.Random(0).sample(docs, 60):  # names c10-c99: a search names its crate
        crate, attr = doc.id.split(":")
        hits = retriever.search(doc.id, 2)
        assert hits[0] == doc and hits[0].render() == f"{crate}: {doc.text}"
        assert hits[1].id == f"{crate}:{'p' if attr == 'w' else 'w'}"  # the same crate's other fact
    assert retriever.search("nothing known here", 2) == []
    with pytest.raises(QueryTooLong, match="41 characters exceeds agent.tool.max_query_chars=40"):
        retriever.search("x" * 41, 2)
    info = json.loads((lookup / "index" / "index.json").read_text())
    assert info["retriever"] == "bm25" and info["docs"] == len(docs) == 2 * CRATES


def _char_bag(texts):
    """Embeddings built by hand: counts of each printable character."""
    out = np.zeros((len(texts), 96), dtype="float32")
    for i, t in enumerate(texts):
        for ch in t:
            out[i, min(max(ord(ch) - 32, 0), 95)] += 1
    return out


def test_dense_index_and_search_on_built_vectors(tmp_path):
    corpus = tmp_path / "corpus.jsonl"
    texts = ["aaaa bbbb", "cccc dddd", "eeee ffff", "aaaa cccc"]
    corpus.write_text("".join(json.dumps({"id": f"d{i}", "title": "", "text": t}) + "\n" for i, t in enumerate(texts)))
    info = build_index("dense", corpus, tmp_path / "index", embed=_char_bag)
    assert info["dim"] == 96
    vectors = np.load(tmp_path / "index" / "vectors.npy")
    assert np.allclose(np.linalg.norm(vectors, axis=1), 1.0)
    retriever = load_index(tmp_path / "index", max_query_chars=50, embed=_char_bag)
    assert isinstance(retriever, DenseRetriever)
    assert [p.id for p in retriever.search("cccc dddd", 2)] == ["d1", "d3"]
    assert [p.id for p in retriever.search("eeee", 1)] == ["d2"]
    assert retriever.search("   ", 2) == []
    with pytest.raises(QueryTooLong):
        retriever.search("e" * 51, 1)


def test_dense_embedder_runs_on_a_local_model_and_refuses_a_missing_one(base_dir, tmp_path):
    vectors = HFEmbedder(str(base_dir))(["c417:w", "c233:p", "x"])
    assert vectors.shape == (3, 128) and np.isfinite(vectors).all()
    with pytest.raises(FileNotFoundError, match="agent.tool.embedding_model: no model at"):
        HFEmbedder(str(tmp_path / "nowhere"))


# ------------------------------------------------------------------ the tool step in the rollout

ROW = {"id": "q1", "question": "c417:w+3", "answers": ["26"]}
PLANNER = ["<think>c417:w+3</think><task>c417:w</task>", "<think>23+3</think><task>23+3</task>",
           "<think>26</think><answer>26</answer>"]
SEARCHING = ["<think>c417:w</think><search>c417:w</search>", "<think>23</think><answer>23</answer>",
             "<think>23+3=26</think><answer>26</answer>"]


class FixedRetriever:
    """Returns the passages it was given, whatever the query (for the masking test: only the injected
    information differs between two runs)."""

    def __init__(self, passages, max_chars=100):
        self.passages, self.max_chars, self.queries = passages, max_chars, []

    def search(self, query, k):
        self.queries.append(query)
        if len(query) > self.max_chars:
            raise QueryTooLong(f"query of {len(query)} characters exceeds agent.tool.max_query_chars={self.max_chars}")
        return self.passages[:k]


def _tool_rollout(hf_base, tok, executor, retriever, max_searches=2):
    engine = ScriptedEngine(hf_base, tok, PLANNER, executor)
    spec = RolloutSpec(max_turns=4, max_new_tokens_executor=160, max_searches=max_searches)
    ro = Rollout(engine, Codec(tok, TemplatesConfig()), spec, retriever)
    (ep,) = ro.run([ROW], n=1, seed=0)
    return ep


def _passages(weight):
    from utils.agent.retrieval import Passage

    return [Passage("c417:w", "c417", f"w={weight}"), Passage("c417:p", "c417", "p=5")]


def test_search_injects_information_into_the_executor_context_only(hf_base, tok):
    retriever = FixedRetriever(_passages(23))
    ep = _tool_rollout(hf_base, tok, SEARCHING, retriever)
    assert ep.status == "answered" and ep.final_answer == "26"
    assert [s.role for s in ep.segments] == ["planner", "executor", "executor", "planner", "executor", "planner"]
    assert ep.n_subtasks == 2 and ep.format_score == 1.0
    assert retriever.queries == ["c417:w"]
    assert ep.searches == [{"turn": 0, "query": "c417:w", "docs": ["c417:w", "c417:p"], "error": None}]
    first, second = ep.segments[1], ep.segments[2]
    info = "<information>c417: w=23\nc417: p=5</information>\n"
    assert second.context_ids == first.context_ids + first.gen_ids + tok.encode(info, add_special_tokens=False)
    planner_text = tok.decode(ep.segments[-1].context_ids, skip_special_tokens=True)
    assert "<result>23</result>" in planner_text and "information" not in planner_text and "w=23" not in planner_text
    # one training sequence per executor call, the search and its answer in one conversation
    seqs = episode_sequences(ep)
    assert [s.role for s in seqs] == ["planner", "executor", "executor"]
    assert sum(seqs[1].mask) == len(first.gen_ids) + len(second.gen_ids)


def test_information_tokens_are_never_trained(hf_base, tok):
    """Changing the retrieved text changes no trained position and no trained token (mask invariance)."""
    a = episode_sequences(_tool_rollout(hf_base, tok, SEARCHING, FixedRetriever(_passages(23))))[1]
    b = episode_sequences(_tool_rollout(hf_base, tok, SEARCHING, FixedRetriever(_passages(41))))[1]
    assert a.mask == b.mask and len(a.ids) == len(b.ids)
    differ = [k for k in range(len(a.ids)) if a.ids[k] != b.ids[k]]
    assert differ and all(a.mask[k] == 0 for k in differ)
    assert all(lp == 0.0 for lp, m in zip(a.logprobs, a.mask) if not m)


def test_the_loss_has_no_gradient_through_information_targets(hf_base, tok):
    """Injected information is context, never a target: on the real model's log-probs of an executor
    call, the SFT loss's gradient is zero at every information position and non-zero at generated ones."""
    import torch

    from utils.train.losses import gather_logprobs, sft_cross_entropy

    ep = _tool_rollout(hf_base, tok, SEARCHING, FixedRetriever(_passages(23)))
    ex = episode_sequences(ep)[1]
    info_ids = tok.encode("<information>c417: w=23\nc417: p=5</information>\n",
                          add_special_tokens=False)
    start = len(ep.segments[1].context_ids) + len(ep.segments[1].gen_ids)
    assert ex.ids[start:start + len(info_ids)] == info_ids
    ids = torch.tensor([ex.ids])
    with torch.no_grad():
        logp = gather_logprobs(hf_base(input_ids=ids).logits, ids).requires_grad_(True)
    sft_cross_entropy(logp, torch.tensor([ex.mask[1:]], dtype=torch.float32)).backward()
    grad = logp.grad[0]  # position t predicts ids[t + 1]
    info_targets = range(start - 1, start - 1 + len(info_ids))
    assert all(grad[t] == 0 for t in info_targets)
    assert all(grad[t] != 0 for t in range(len(ex.ids) - 1) if ex.mask[t + 1])


def test_search_limit_and_overlong_query(hf_base, tok):
    ep = _tool_rollout(hf_base, tok, [SEARCHING[0]] * 3, FixedRetriever(_passages(23)), max_searches=2)
    assert ep.status == "executor_error" and "more than 2 searches" in ep.error
    assert len(ep.searches) == 2
    long_query = "<think>x</think><search>" + "c417 " * 25 + "</search>"
    ep = _tool_rollout(hf_base, tok, [long_query, SEARCHING[1], SEARCHING[2]], FixedRetriever(_passages(23)))
    assert ep.status == "answered"  # the bad query is answered with a note, not a crash
    assert ep.searches[0]["docs"] == [] and "exceeds agent.tool.max_query_chars=100" in ep.searches[0]["error"]
    assert "exceeds agent.tool.max_query_chars" in tok.decode(ep.segments[2].context_ids)


# ------------------------------------------------------------------ the lookup task

def test_lookup_gold_traces_search_the_real_index(lookup, tok):
    retriever = load_index(lookup / "index", max_query_chars=200)
    rows = _rows(lookup, "train")
    trace, why = trace_from_row(rows[0], "gold", _search_fn(retriever))
    assert why is None
    n_lookups = sum("search" in s for s in rows[0]["meta"]["steps"])
    assert sum("<search>" in text for _, text in trace.executor_calls) == n_lookups >= 1
    fact = rows[0]["meta"]["facts"][0]
    assert fact in {p.id for p in retriever.search(rows[0]["meta"]["steps"][0]["search"], 2)}
    examples = examples_from_trace(trace, Codec(tok, TemplatesConfig()))
    search_call = examples[1]
    text = tok.decode([i for i, m in zip(search_call.ids, search_call.mask) if not m], skip_special_tokens=True)
    assert "<information>" in text  # the information is in the context, masked
    assert "<information>" not in tok.decode([i for i, m in zip(search_call.ids, search_call.mask) if m])
    # without the tool, or when the search misses the gold fact, there is no trace, and it says why
    assert "search tool is off" in trace_from_row(rows[0], "gold", None)[1]
    missing = trace_from_row(rows[0], "gold", lambda q: ("<information>no results</information>\n", []))[1]
    assert f"gold fact {fact} not in the top-k" in missing


def test_lookup_task_needs_the_corpus(lookup):
    """Operands exist only in the corpus: no lookup value is written in its question."""
    splits, corpus = generate_lookup(DataConfig(name="synthetic_lookup", seed=7, n_train=50, n_val=5, n_test=5,
                                                min_steps=2, max_steps=6, operand_max=40))
    values = {r["id"]: r["text"] for r in corpus}
    assert len(corpus) == len({r["id"] for r in corpus}) == 2 * CRATES
    for row in splits["train"]:
        lookups = [s for s in row["steps"] if "search" in s]
        assert lookups and all(values[s["fact"]].endswith(f"={s['result']}") for s in lookups)
        assert 2 <= len(row["steps"]) <= 6 and 0 <= row["answer"] <= 99
    with pytest.raises(ValueError, match="uses \\+ and - only"):
        generate_lookup(DataConfig(name="synthetic_lookup", ops=["*"]))


@pytest.mark.slow
def test_tool_rollouts_are_token_identical_on_vllm_and_hf(lookup, base_dir, vllm_engine, hf_engine, tmp_path):
    """Greedy rollouts of an adapter that searches: every segment's ids, every search and every
    ending agree between the vLLM and transformers engines."""
    from utils.tinyarith.quick import train_lookup_adapter

    retriever = load_index(lookup / "index", max_query_chars=200)
    adapter = train_lookup_adapter(base_dir, _rows(lookup, "train"), _search_fn(retriever),
                                   tmp_path / "adapter")
    runs = {}
    for engine in (vllm_engine, hf_engine):
        engine.set_adapter(adapter)
        ro = Rollout(engine, Codec(engine.tokenizer, TemplatesConfig()), RolloutSpec(max_turns=6, temperature=0.0),
                     retriever)
        runs[engine.name] = ro.run(_rows(lookup, "test")[:8], n=1, seed=0)
        engine.set_adapter(None)
    v, h = runs["vllm"], runs["hf"]
    assert sum(len(e.searches) for e in h) >= 4, "the adapter should search"
    for a, b in zip(v, h):
        assert [(s.role, s.gen_ids) for s in a.segments] == [(s.role, s.gen_ids) for s in b.segments]
        assert (a.searches, a.status, a.final_answer) == (b.searches, b.status, b.final_answer)


def _stage_data(stage, outputs, data, *args):
    import importlib

    from utils.core.stages import run_main

    mod = importlib.import_module(stage)
    return run_main(stage, lambda: mod.main(["--set", f"outputs_dir={outputs}", "--run_id", "t", "--data", data,
                                             *args]))


def _stage(stage, outputs, *args):
    return _stage_data(stage, outputs, "synthetic_lookup", *args)


def test_stages_check_the_corpus_and_hash_the_index(lookup, tmp_path, capsys):
    import shutil

    data = tmp_path / "data"
    shutil.copytree(lookup / "data", data)
    sizes = ["--set", f"data.path={data}", "--set", "data.seed=7", "--set", "data.n_train=300",
             "--set", "data.n_val=10", "--set", "data.n_test=16", "--set", "data.max_steps=3"]
    out = tmp_path / "outputs"
    for stage in ("00_check_data", "01_prepare_dataset"):
        assert _stage(stage, out, *sizes) == 0, capsys.readouterr().err
    m0 = json.loads((out / "t" / "00_check_data" / "manifest.json").read_text())
    m1 = json.loads((out / "t" / "01_prepare_dataset" / "manifest.json").read_text())
    assert any(p.endswith("corpus.jsonl") for p in m0["inputs"]) and m0["metrics"]["corpus_docs"] == 2 * CRATES
    assert m1["config"]["agent"]["tool"]["retriever"] == "bm25" and m1["metrics"]["index_docs"] == 2 * CRATES
    index = out / "t" / "01_prepare_dataset" / "index"
    assert any(p.endswith("01_prepare_dataset/index") for p in m1["outputs"]) and (index / "index.json").is_file()
    assert not (out / "t" / "01_prepare_dataset" / "index.tmp").exists()
    # a corpus row broken after the fact: 00 names the file, the row and the field
    rows = (data / "corpus.jsonl").read_text().splitlines()
    rows[4] = json.dumps({"id": "c1:w", "title": "c1"})
    (data / "corpus.jsonl").write_text("\n".join(rows) + "\n")
    assert _stage("00_check_data", out, *sizes) == 1
    assert f"{data / 'corpus.jsonl'}, row 5, field 'text': missing field" in capsys.readouterr().err


def test_hotpotqa_paragraphs_become_the_corpus_and_bridge_traces_search(tmp_path, capsys):
    """The CoDA setting (--data hotpotqa_search): 01 writes every context paragraph of the native
    fixture as a passage and indexes it, prompts lose their context, and the bridge question's
    gold trace searches each hop and finds its supporting paragraph."""
    fixture = Path(__file__).parent / "fixtures" / "hotpotqa"
    out = tmp_path / "outputs"
    args = ["--set", f"data.path={fixture}", "--set", "data.n_val=1", "--set", "data.n_test=1"]
    for stage in ("00_check_data", "01_prepare_dataset", "02_build_rewards", "03_generate_sft_traces"):
        assert _stage_data(stage, out, "hotpotqa_search", *args) == 0, capsys.readouterr().err
    prep = out / "t" / "01_prepare_dataset"
    corpus = [json.loads(x) for x in (prep / "corpus.jsonl").read_text().splitlines()]
    titles = {p["id"] for p in corpus}
    assert {"Ida Lorne", "Brenfold", "Marlow Glass Works", "Kestrel Hotel"} <= titles and len(titles) == len(corpus)
    rows = [json.loads(x) for s in ("train", "val", "test") for x in (prep / f"{s}.jsonl").read_text().splitlines()]
    assert all(r["context"] is None and "context:" not in r["prompt"] for r in rows)
    bridge = next(r for r in rows if r["id"] == "hp-train-0002")
    assert bridge["meta"]["facts"] == ["Marlow Glass Works", "Brenfold"]
    (trace,) = [json.loads(x) for x in (out / "t" / "03_generate_sft_traces" / "sft_traces.jsonl").read_text().splitlines()]
    first, second = (text for _, text in trace["executor_calls"])
    assert "<search>" in first and "Marlow Glass Works: The Marlow Glass Works stood in Brenfold." in first
    assert first.endswith("<answer>Brenfold</answer>") and "Brenfold: Brenfold is a market town on the Tessel." in second
