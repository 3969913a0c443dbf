"""The Executor's search tool: a corpus, an index built from it once, and retrievers from a registry.

A corpus is a JSONL file of `{id, title, text}` rows (ids unique and non-empty, text non-empty);
`read_corpus` names the file, row and field of anything else. `build_index` writes an index
folder (01_prepare_dataset does it once per run; its hash goes into 01's manifest):

    index.json         {"retriever", "docs", "corpus_sha256", ...}
    docs.jsonl         the corpus rows, in index order
    <retriever files>  bm25: bm25s's sparse matrices; dense: vectors.npy (unit rows) and faiss.index

`load_index` reads it back as a `Retriever`, whose `search(query, k)` returns the top-k `Passage`s,
best first, ties broken by corpus order, so a search is deterministic. Retrievers (`RETRIEVERS`):
- `bm25`: bm25s over lower-cased word tokens; CPU-only, no model. The default.
- `dense`: inner product over unit vectors in a faiss flat index; texts are embedded by a local
  model directory (mean-pooled last hidden states, `HFEmbedder`). Any callable from a list of texts
  to an [n, d] float array can embed, which is how the index and search code are tested here
  without an embedding model.

A query longer than `max_query_chars` raises `QueryTooLong` (the rollout turns it into an
information block that says so: the policy's bad query must not stop a training run).
"""
from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from utils.core.io import DataError, read_records, require, write_jsonl
from utils.core.files import atomic_write_json
from utils.core.hashing import path_sha256
from utils.core.registry import Registry

INDEX_FILE, DOCS_FILE = "index.json", "docs.jsonl"
_WORD = re.compile(r"\w+")


class QueryTooLong(ValueError):
    pass


@dataclass(frozen=True)
class Passage:
    id: str
    title: str
    text: str

    def render(self) -> str:
        return f"{self.title}: {self.text}" if self.title else self.text


def read_corpus(path: Path) -> list[Passage]:
    """The corpus rows; errors name the file, row and field (missing or empty file, bad row, duplicate id)."""
    path = Path(path)
    if not path.is_file():
        raise DataError(path, None, None, "corpus file not found (agent.tool.corpus, relative to data.path)")
    docs, seen = [], {}
    for i, obj in read_records(path):
        pid = require(obj, "id", str, path, i)
        title = require(obj, "title", str, path, i)
        text = require(obj, "text", str, path, i)
        if not pid.strip():
            raise DataError(path, i, "id", "empty id")
        if not text.strip():
            raise DataError(path, i, "text", "empty text: a passage must say something")
        if pid in seen:
            raise DataError(path, i, "id", f"duplicate id {pid!r} (first at row {seen[pid]})")
        seen[pid] = i
        docs.append(Passage(pid, title, text))
    return docs


def words(text: str) -> list[str]:
    return _WORD.findall(text.lower())


def _check_query(query: str, max_chars: int) -> None:
    if len(query) > max_chars:
        raise QueryTooLong(f"query of {len(query)} characters exceeds agent.tool.max_query_chars={max_chars}")


class BM25Retriever:
    name = "bm25"

    def __init__(self, docs: list[Passage], model, max_query_chars: int):
        self.docs, self.model, self.max_query_chars = docs, model, max_query_chars
        self.vocab = set(model.vocab_dict)

    @classmethod
    def build(cls, docs: list[Passage], out_dir: Path, opts: dict) -> dict:
        import bm25s

        model = bm25s.BM25(k1=opts.get("k1", 1.5), b=opts.get("b", 0.75))
        model.index([words(d.render()) for d in docs], show_progress=False)
        model.save(str(out_dir))
        return {"k1": model.k1, "b": model.b}

    @classmethod
    def load(cls, docs: list[Passage], index_dir: Path, info: dict, max_query_chars: int) -> "BM25Retriever":
        import bm25s

        return cls(docs, bm25s.BM25.load(str(index_dir)), max_query_chars)

    def search(self, query: str, k: int) -> list[Passage]:
        _check_query(query, self.max_query_chars)
        tokens = [t for t in words(query) if t in self.vocab]
        if not tokens:
            return []
        scores = self.model.get_scores(tokens)
        order = sorted(range(len(self.docs)), key=lambda i: (-scores[i], i))
        return [self.docs[i] for i in order[:k] if scores[i] > 0]


class HFEmbedder:
    """Mean-pooled last hidden states of a local transformers model, as unit vectors."""

    def __init__(self, model_dir: str, batch_size: int = 32):
        from transformers import AutoModel, AutoTokenizer

        path = Path(model_dir)
        if not (path / "config.json").is_file():
            raise FileNotFoundError(f"agent.tool.embedding_model: no model at {path} (no config.json); the dense "
                                    "retriever needs a local embedding model directory")
        # an embedder that ships its own code is refused by transformers: no config turns that on
        self.tok = AutoTokenizer.from_pretrained(path, trust_remote_code=False)
        self.model = AutoModel.from_pretrained(path, trust_remote_code=False).eval()
        self.batch_size = batch_size

    def __call__(self, texts: list[str]):
        import torch

        pad = self.tok.pad_token_id if self.tok.pad_token_id is not None else 0
        out = []
        for s in range(0, len(texts), self.batch_size):
            enc = [self.tok.encode(t) for t in texts[s:s + self.batch_size]]
            width = max(len(e) for e in enc)
            ids = torch.tensor([e + [pad] * (width - len(e)) for e in enc])
            mask = torch.tensor([[1] * len(e) + [0] * (width - len(e)) for e in enc])
            with torch.no_grad():
                h = self.model(input_ids=ids, attention_mask=mask).last_hidden_state
            out.append((h * mask[..., None]).sum(1) / mask.sum(1, keepdim=True))
        return torch.cat(out).numpy()


def _unit(vectors):
    import numpy as np

    v = np.asarray(vectors, dtype="float32")
    if v.ndim != 2:
        raise ValueError(f"embeddings must be an [n, d] array, got shape {v.shape}")
    return v / np.maximum(np.linalg.norm(v, axis=1, keepdims=True), 1e-12)


class DenseRetriever:
    name = "dense"

    def __init__(self, docs: list[Passage], index, embed: Callable, max_query_chars: int):
        self.docs, self.index, self.embed, self.max_query_chars = docs, index, embed, max_query_chars

    @classmethod
    def build(cls, docs: list[Passage], out_dir: Path, opts: dict) -> dict:
        import faiss
        import numpy as np

        embed = opts.get("embed") or HFEmbedder(opts["embedding_model"])
        vectors = _unit(embed([d.render() for d in docs]))
        if len(vectors) != len(docs):
            raise ValueError(f"the embedder returned {len(vectors)} vectors for {len(docs)} passages")
        index = faiss.IndexFlatIP(vectors.shape[1])
        index.add(vectors)
        np.save(out_dir / "vectors.npy", vectors)
        faiss.write_index(index, str(out_dir / "faiss.index"))
        return {"dim": int(vectors.shape[1]), "embedding_model": opts.get("embedding_model", "")}

    @classmethod
    def load(cls, docs: list[Passage], index_dir: Path, info: dict, max_query_chars: int,
             embed: Callable | None = None) -> "DenseRetriever":
        import faiss

        return cls(docs, faiss.read_index(str(index_dir / "faiss.index")),
                   embed or HFEmbedder(info["embedding_model"]), max_query_chars)

    def search(self, query: str, k: int) -> list[Passage]:
        _check_query(query, self.max_query_chars)
        if not query.strip():
            return []
        scores, ids = self.index.search(_unit(self.embed([query])), min(k, len(self.docs)))
        hits = sorted(((-float(s), int(i)) for s, i in zip(scores[0], ids[0]) if i >= 0))
        return [self.docs[i] for _, i in hits]


RETRIEVERS = Registry("retriever", {"bm25": BM25Retriever, "dense": DenseRetriever})


def _retriever_class(name: str):
    return RETRIEVERS.get(name)


def build_index(name: str, corpus: Path, out_dir: Path, **opts) -> dict:
    """Index `corpus` with retriever `name` into `out_dir` (created; must not exist yet); its index.json."""
    cls = _retriever_class(name)
    docs = read_corpus(corpus)
    if not docs:
        raise DataError(corpus, None, None, "the corpus is empty: the search tool needs at least one passage")
    out_dir.mkdir(parents=True)
    write_jsonl(out_dir / DOCS_FILE, ({"id": d.id, "title": d.title, "text": d.text} for d in docs))
    info = {"retriever": name, "docs": len(docs), "corpus": str(corpus), "corpus_sha256": path_sha256(corpus),
            **cls.build(docs, out_dir, opts)}
    atomic_write_json(out_dir / INDEX_FILE, info)
    return info


def render_information(template: str, passages: list[Passage]) -> str:
    """The text injected after a search: the passages one per line ("no results" for none)."""
    return template.format(passages="\n".join(p.render() for p in passages) or "no results")


def run_retriever(cfg, run=None):
    """The run's retriever, from the index 01_prepare_dataset built (recorded as an input of `run`);
    None with the tool off (agent.tool.retriever none)."""
    from utils.core.stages import stage_dir

    if cfg.agent.tool.retriever == "none":
        return None
    index = stage_dir(cfg, "01_prepare_dataset") / "index"
    retriever = load_index(index, cfg.agent.tool.max_query_chars)
    if run is not None:
        run.add_input(index)
    return retriever


def load_index(index_dir: Path, max_query_chars: int, **opts):
    """The retriever an index folder was built for."""
    index_dir = Path(index_dir)
    if not (index_dir / INDEX_FILE).is_file():
        raise FileNotFoundError(f"{index_dir / INDEX_FILE} not found: the search index is built by 01_prepare_dataset")
    info = json.loads((index_dir / INDEX_FILE).read_text())
    docs = [Passage(o["id"], o["title"], o["text"]) for _, o in read_records(index_dir / DOCS_FILE)]
    return _retriever_class(info["retriever"]).load(docs, index_dir, info, max_query_chars, **opts)
