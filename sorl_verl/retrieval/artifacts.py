"""Serve Search-R1's published dense artifacts as they are: a FAISS index file plus its corpus JSONL.

Search-R1 (PeterGriffinJin/Search-R1, ``search_r1/search/index_builder.py`` and
``retrieval_server.py``) publishes ``e5_Flat.index`` and ``wiki-18.jsonl``:

* the corpus is JSON lines ``{"id", "contents": "\\"Title\\"\\ntext"}``, 21M rows;
* the index is a FAISS flat inner-product index (``index_factory(dim, "Flat", METRIC_INNER_PRODUCT)``)
  over ``intfloat/e5-base-v2`` embeddings: mean pooling over the last hidden state, L2-normalised,
  ``"passage: "`` before each document's ``contents`` (and ``"query: "`` before each query);
* FAISS id ``i`` is row ``i`` of the corpus (the order ``datasets.load_dataset("json")`` reads it).

Here (our design) the index is opened as it is (memory-mapped where this ``faiss`` can,
``IO_FLAG_MMAP_IFC``), moved to the GPUs when ``faiss`` has any (fp16, sharded, as Search-R1's
``--faiss_gpu``), and the corpus is never loaded into Python objects:
:class:`~sorl_verl.retrieval.corpus.MmapCorpus` maps the file and reads row ``i`` through an offset table built once beside it
(``wiki-18.jsonl.offsets/``, atomically) and rebuilt when the corpus changes. Queries are encoded
by :class:`sorl_verl.retrieval.dense.MeanPoolEncoder` (the same mean pooling and e5 prefix rule as
our own dense indexes; fp32, where Search-R1 encodes queries in fp16 on a GPU, so scores may differ
in the last digits).

::

    sorl-retriever --faiss-index e5_Flat.index --corpus wiki-18.jsonl --encoder intfloat/e5-base-v2
    retriever = load_retriever(faiss_index="e5_Flat.index", corpus="wiki-18.jsonl",
                               encoder="intfloat/e5-base-v2")
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from sorl_verl.retrieval.corpus import MmapCorpus
from sorl_verl.retrieval.store import IndexFormatError

__all__ = ["FaissArtifactRetriever", "MmapCorpus", "load_faiss_artifacts"]


def _faiss_gpu_count() -> int:
    import faiss

    return faiss.get_num_gpus() if hasattr(faiss, "get_num_gpus") else 0


class FaissArtifactRetriever:
    """Dense search over a FAISS index file whose id ``i`` is row ``i`` of a corpus JSONL.

    ``encoder``: a name for :func:`sorl_verl.retrieval.dense.make_encoder` (HF model name or folder,
    ``bundled-minilm``, ``hashing:DIM``) or any object with ``encode(texts, kind) -> (n, dim)``
    float32 and ``dim``. ``faiss_gpu``: None = GPUs when ``faiss`` has them, True = required,
    False = CPU. ``mmap_index``: map the index file instead of reading it into memory (flat
    indexes, where this ``faiss`` supports it). The index must use inner product, and its
    dimension must equal the encoder's.
    """

    method = "dense"

    def __init__(
        self,
        faiss_index: str | Path,
        corpus: str | Path,
        encoder,
        faiss_gpu: bool | None = None,
        mmap_index: bool = True,
        query_max_length: int = 256,
        batch_size: int = 64,
        offsets_dir: str | Path | None = None,
        show_progress: bool = True,
    ):
        import faiss

        from sorl_verl.retrieval.dense import make_encoder

        index_path = Path(faiss_index)
        if not index_path.is_file():
            raise FileNotFoundError(f"FAISS index file not found: {index_path}")
        flags = getattr(faiss, "IO_FLAG_MMAP_IFC", 0) if mmap_index else 0
        try:
            index = faiss.read_index(str(index_path), flags)
        except RuntimeError as e:
            raise IndexFormatError(f"{index_path}: not a FAISS index faiss can read ({str(e).strip()[:200]})") from None
        if index.metric_type != faiss.METRIC_INNER_PRODUCT:
            raise IndexFormatError(
                f"{index_path}: the index's metric is not inner product (Search-R1's indexes are "
                f"IndexFlatIP); got metric_type {index.metric_type}"
            )
        self.encoder = (
            make_encoder(encoder, max_length=query_max_length, batch_size=batch_size)
            if isinstance(encoder, str)
            else encoder
        )
        if int(self.encoder.dim) != index.d:
            raise IndexFormatError(
                f"{index_path}: vectors of dimension {index.d}, but encoder {encoder!r} gives "
                f"{self.encoder.dim}; use the encoder the index was built with"
            )
        self.corpus = MmapCorpus(
            corpus, offsets_dir=offsets_dir, expected_rows=index.ntotal, show_progress=show_progress
        )
        gpus = _faiss_gpu_count()
        if faiss_gpu and gpus == 0:
            raise RuntimeError(
                "faiss_gpu=True, but this faiss sees no GPU (install faiss-gpu, or pass faiss_gpu=False)"
            )
        self.on_gpu = bool(gpus) if faiss_gpu is None else bool(faiss_gpu)
        if self.on_gpu:
            options = faiss.GpuMultipleClonerOptions()
            options.useFloat16 = True  # as Search-R1's --faiss_gpu: half the GPU memory
            options.shard = True
            index = faiss.index_cpu_to_all_gpus(index, co=options)
        self._index = index
        self.index_path = index_path

    def __len__(self) -> int:
        return len(self.corpus)

    def search(self, queries: list[str], topk: int = 3) -> list[list[dict]]:
        """One list per query, best first: ``{"document": {"id", "contents"}, "score"}``."""
        if topk <= 0:
            raise ValueError(f"topk must be positive, got {topk}")
        if not queries:
            return []
        embeddings = np.ascontiguousarray(
            self.encoder.encode(list(queries), kind="query"), dtype=np.float32
        )  # (n, dim)
        scores, rows = self._index.search(embeddings, min(topk, len(self.corpus)))  # (n, k) each
        return [
            [
                {"document": self.corpus[r], "score": float(s)}
                for r, s in zip(row_ids, row_scores, strict=True)
                if r >= 0
            ]
            for row_ids, row_scores in zip(rows, scores, strict=True)
        ]


def load_faiss_artifacts(
    faiss_index: str | Path, corpus: str | Path | None, encoder, **options
) -> FaissArtifactRetriever:
    """:class:`FaissArtifactRetriever`, with errors for a missing corpus or encoder."""
    if corpus is None:
        raise ValueError("a FAISS index file needs its corpus JSONL (corpus=..., --corpus): FAISS id i is corpus row i")
    if encoder is None:
        raise ValueError(
            "a FAISS index file needs the encoder it was built with (encoder=..., --encoder), "
            "e.g. intfloat/e5-base-v2 for Search-R1's e5_Flat.index"
        )
    return FaissArtifactRetriever(faiss_index, corpus, encoder, **options)
