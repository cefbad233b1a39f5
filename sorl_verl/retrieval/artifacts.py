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
``--faiss_gpu``), and the corpus is never loaded into Python objects: :class:`MmapCorpus` maps
the file and reads row ``i`` through an offset table built once beside it
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

import hashlib
import json
import mmap
import os
import sys
from pathlib import Path

import numpy as np

from sorl_verl.fileio import atomic_dir
from sorl_verl.progress import progress
from sorl_verl.retrieval.corpus import CorpusFormatError, _row_to_document
from sorl_verl.retrieval.store import IndexFormatError

try:  # installed with verl (through tensordict); json is the fallback
    import orjson
except ImportError:  # pragma: no cover - depends on the environment
    orjson = None

__all__ = ["FaissArtifactRetriever", "MmapCorpus", "load_faiss_artifacts"]

OFFSETS_FORMAT = "sorl_verl.corpus_offsets"
OFFSETS_VERSION = 1
OFFSETS_SUFFIX = ".offsets"  # the table of wiki-18.jsonl is the folder wiki-18.jsonl.offsets/
_DIGEST_BYTES = 1 << 20  # the table records digests of the corpus's first and last MiB
_SCAN_BYTES = 1 << 26  # newline scan window (64 MiB)
_SHORT_LINE = 16  # lines this short are checked for being whitespace only (skipped, like blank lines)


def _fingerprint(path: Path) -> dict:
    """Size and digests of the first and last MiB: what identifies a corpus file cheaply."""
    size = path.stat().st_size
    with open(path, "rb") as f:
        head = hashlib.sha256(f.read(_DIGEST_BYTES)).hexdigest()
        f.seek(max(0, size - _DIGEST_BYTES))
        tail = hashlib.sha256(f.read(_DIGEST_BYTES)).hexdigest()
    return {"corpus_size": size, "head_sha256": head, "tail_sha256": tail}


def _offsets_dir_candidates(corpus: Path) -> list[Path]:
    """Beside the corpus, then the cache (keyed by the corpus's path): a table is looked for in both,
    and built in the first whose folder is writable."""
    from sorl_verl.retrieval import default_cache_dir

    key = hashlib.sha256(str(corpus.resolve()).encode()).hexdigest()[:12]
    return [
        corpus.with_name(corpus.name + OFFSETS_SUFFIX),
        default_cache_dir() / "corpus_offsets" / f"{corpus.name}-{key}{OFFSETS_SUFFIX}",
    ]


def scan_rows(path: Path, show_progress: bool = True) -> np.ndarray:
    """``(num_rows, 2)`` int64 ``[start, end)`` byte spans of the non-blank lines of ``path``
    (``end`` excludes the newline and a ``\\r`` before it). Vectorised over 64 MiB windows."""
    data = np.memmap(path, dtype=np.uint8, mode="r") if path.stat().st_size else np.zeros(0, np.uint8)
    size = len(data)
    newlines = []
    with progress(
        total=size, unit="B", unit_scale=True, desc=f"index rows of {path.name}", disable=not show_progress
    ) as bar:
        for start in range(0, size, _SCAN_BYTES):
            window = data[start : start + _SCAN_BYTES]
            newlines.append(np.flatnonzero(window == 10).astype(np.int64) + start)
            bar.update(len(window))
    nl = np.concatenate(newlines) if newlines else np.zeros(0, np.int64)
    starts = np.concatenate([[0], nl + 1]).astype(np.int64)
    ends = np.concatenate([nl, [size]]).astype(np.int64)
    crlf = ends > starts
    crlf[crlf] = data[ends[crlf] - 1] == 13
    ends -= crlf
    keep = ends > starts
    short = np.flatnonzero(keep & (ends - starts < _SHORT_LINE))
    for i in short:  # a handful at most: drop whitespace-only lines
        if not bytes(data[starts[i] : ends[i]]).strip():
            keep[i] = False
    del data
    return np.stack([starts[keep], ends[keep]], axis=1)


class MmapCorpus:
    """Read-only random access to the rows of a corpus JSONL file, without loading it.

    ``corpus[i]`` is row ``i`` (0-based, blank lines not counted) as ``{"id", "contents"}``; rows
    ``{"title", "text"}`` become Search-R1's ``contents`` (see :mod:`sorl_verl.retrieval.corpus`).
    The file is memory-mapped; the offset table (``(num_rows, 2)`` int64 byte spans,
    ``offsets.npy``, also memory-mapped) lives in ``offsets_dir`` (default: ``<corpus>.offsets``
    beside the corpus, or the cache when the table is not beside it and that folder is read-only),
    is written atomically with a
    ``meta.json`` recording the corpus's size and the digests of its first and last MiB, and is
    rebuilt when they no longer match. The first and last rows are checked on opening (a last
    row cut short means a truncated file); any other row is checked when read.

    Raises :class:`CorpusFormatError` naming the file: gzip input (cannot be mapped), an empty
    corpus, an unparseable first/last row, or a row count other than ``expected_rows``.
    Safe to read from several threads.
    """

    def __init__(
        self,
        path: str | Path,
        offsets_dir: str | Path | None = None,
        expected_rows: int | None = None,
        show_progress: bool = True,
    ):
        path = Path(path)
        if not path.is_file():
            raise FileNotFoundError(f"corpus file not found: {path}")
        if path.suffix == ".gz":
            raise CorpusFormatError(f"{path}: a gzip-compressed corpus cannot be memory-mapped; gunzip it first")
        self.path = path
        candidates = [Path(offsets_dir)] if offsets_dir is not None else _offsets_dir_candidates(path)
        self.rebuilt = False  # whether this open (re)built the offset table
        fingerprint = _fingerprint(path)
        found = [c for c in candidates if self._table_matches(c, fingerprint)]
        if found:
            self.offsets_dir = found[0]
        else:
            writable = [c for c in candidates if c == candidates[-1] or os.access(c.parent, os.W_OK)]
            self.offsets_dir = writable[0]
            self._build_table(fingerprint, show_progress)
            self.rebuilt = True
        # (num_rows, 2) int64, as a plain ndarray view of the map: np.memmap's per-index Python
        # overhead was ~7 us of the ~10 us a document fetch cost.
        self._spans = np.load(self.offsets_dir / "offsets.npy", mmap_mode="r").view(np.ndarray)
        self._num_rows = len(self._spans)
        if self._num_rows == 0:
            raise CorpusFormatError(f"{path}: the corpus has no documents")
        with open(path, "rb") as f:
            self._mm = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
        for row, which in ((0, "first"), (len(self._spans) - 1, "last")):
            try:
                self[row]
            except CorpusFormatError as e:
                hint = " (the file looks truncated)" if which == "last" else ""
                raise CorpusFormatError(f"{e}{hint}") from None
        if expected_rows is not None and expected_rows != len(self._spans):
            raise CorpusFormatError(
                f"{path}: {len(self._spans)} rows, but {expected_rows} were expected; the corpus is truncated "
                f"or is not the one the index was built from"
            )

    @staticmethod
    def _table_matches(offsets_dir: Path, fingerprint: dict) -> bool:
        meta_path = offsets_dir / "meta.json"
        try:
            meta = json.loads(meta_path.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            return False
        expected = {"format": OFFSETS_FORMAT, "format_version": OFFSETS_VERSION, **fingerprint}
        return all(meta.get(k) == v for k, v in expected.items()) and (offsets_dir / "offsets.npy").is_file()

    def _build_table(self, fingerprint: dict, show_progress: bool) -> None:
        if self.offsets_dir.exists():
            print(
                f"{self.path} changed since its offset table {self.offsets_dir} was built; rebuilding it",
                file=sys.stderr,
            )
        spans = scan_rows(self.path, show_progress=show_progress)
        with atomic_dir(self.offsets_dir, overwrite=True) as tmp:
            np.save(tmp / "offsets.npy", spans)
            meta = {
                "format": OFFSETS_FORMAT,
                "format_version": OFFSETS_VERSION,
                "corpus": str(self.path.resolve()),
                "num_rows": int(len(spans)),
                **fingerprint,
            }
            (tmp / "meta.json").write_text(json.dumps(meta, indent=2) + "\n", encoding="utf-8")

    def __len__(self) -> int:
        return len(self._spans)

    def __getitem__(self, row: int) -> dict:
        """Row ``row`` as a fresh ``{"id": str, "contents": str}``."""
        row = int(row)
        if not 0 <= row < self._num_rows:
            raise IndexError(f"{self.path}: row {row} out of range 0..{self._num_rows - 1}")
        start, end = self._spans[row].tolist()
        if end > len(self._mm):
            raise CorpusFormatError(
                f"{self.path}: row {row} (byte {start}): past the end of the file ({len(self._mm)} bytes): "
                "the file was truncated"
            )
        line = self._mm[start:end]
        try:
            # orjson: 1.2 us a 600-byte row here, json.loads 3-6 us. It accepts a subset of what json
            # accepts (no NaN, lone surrogate escapes, integers beyond 64 bits, BOM), with the same values.
            record = orjson.loads(line) if orjson is not None else json.loads(line)
        except ValueError:  # JSONDecodeError and UnicodeDecodeError both are: json decides, as before
            try:
                record = json.loads(line)
            except (json.JSONDecodeError, UnicodeDecodeError) as e:
                raise CorpusFormatError(
                    f"{self.path}: row {row} (byte {start}): invalid JSON ({str(e)[:120]})"
                ) from None
        if type(record) is dict:  # the common row (DocsWriter's): a string id and contents, taken as they are
            doc_id, contents = record.get("id"), record.get("contents")
            if type(doc_id) is str and type(contents) is str:
                return {"id": doc_id, "contents": contents}
        doc = _row_to_document(record, f"{self.path}: row {row} (byte {start})", row)
        return {"id": doc.id, "contents": doc.contents}

    def close(self) -> None:
        self._mm.close()


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
