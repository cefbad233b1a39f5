"""Exact top-k BM25 by dynamic pruning: MaxScore, document at a time, over layout 2 (compiled).

MaxScore is Turtle and Flood's (1995); this implementation over our layout 2
(:mod:`sorl_verl.retrieval.bm25_format`: uint16 factor codes and uint16 rows within segments of
``2**bits`` documents) is ours.

Why: exhaustive scoring (``BM25Retriever.top_k_blocked``) adds every posting of every query term
into a score buffer, so its cost per query grows with the postings, and at 21M passages the buffer
(84 MB) and the postings leave the CPU caches (docs/retrieval.md, "Measured at 21M passages").
MaxScore reads the posting lists in row order, a cursor per term, and keeps the ``k`` best documents
so far; their ``k``-th score is a threshold that rises as it goes. Each term has an upper bound, its
largest score (``maxcode.index.npy``, or the idf times the corpus's largest factor for indexes
without it). Sorted by bound, the terms whose bounds together stay at or under the threshold are
*non-essential*: a document holding only those cannot enter the top ``k``. So candidates come from
the essential terms' lists alone, and the others are only probed (a forward seek) for a candidate
whose partial score plus the bounds left could still beat the threshold. No score buffer, no
random writes; reads are sequential in every list.

Exactness: the result is the same documents, in the same order, with the same float32 scores as
the exhaustive paths (tested against them). A posting's score is ``float32(idf * factors[code])``
as everywhere in layout 2, and a candidate's score is the float32 sum of its terms' scores in query
order, as the buffer's ``np.add.at`` sums them. A candidate is pruned only when ``bound * (1 + eps)
<= threshold``, where ``bound`` is the float64 sum of exact scores and upper bounds and ``eps =
(m + 1) * 2**-23`` for ``m`` query terms covers the float32 rounding of an ``m``-term sum (at most
``(m - 1) * 2**-24`` relative) and the float64 sums. Documents are visited in ascending row order,
so a later document must beat the ``k``-th score strictly (ties go to the lower row).
"""

from __future__ import annotations

import numba
import numpy as np

_NO_ROW = np.int64(1) << 62  # a finished cursor's row: beyond every document
_SCAN = 16  # a seek scans this many postings before it gallops


@numba.njit(cache=True, nogil=True)
def top_k_maxscore(k, lows, codes, factors, seghigh, segstart, bits, starts, ends, seg_starts, seg_ends, idf, bounds):
    """The ``k`` best documents of a query over a layout-2 index: ``(rows, scores, stats)``, best first,
    ties to the lower row; ``rows`` ``(n,)`` int64 and ``scores`` ``(n,)`` float32 with ``n <= k``
    (fewer when fewer documents hold a query term), ``stats`` ``(2,)`` int64: postings read from the
    essential lists, and seeks into the others.

    The index: ``lows`` ``(nnz,)`` uint16, ``codes`` ``(nnz,)`` uint16/uint32, ``factors`` ``(codes,)``
    float64, ``seghigh`` ``(segments,)`` int32, ``segstart`` ``(segments,)`` int64, ``bits`` the
    segment bits. The query's ``m`` non-empty terms, in query order (a repeated term once per
    occurrence): postings ``[starts, ends)`` and segments ``[seg_starts, seg_ends)``, all ``(m,)``
    int64; ``idf`` ``(m,)`` float64 (of the float32 idf); ``bounds`` ``(m,)`` float64, each at least
    the term's largest float32 score.
    """
    # One function, no helpers: a numba call that passes arrays counts references on each of them,
    # which cost 10x the work of a posting (measured). A cursor per term: ``pos`` its posting,
    # ``seg`` that posting's segment, ``cur`` its row (``_NO_ROW`` once the list is done).
    m = starts.shape[0]
    rows = np.empty(k, dtype=np.int64)
    scores = np.empty(k, dtype=np.float32)
    read = 0
    seeks = 0
    pos = starts.copy()
    seg = seg_starts.copy()
    cur = np.empty(m, dtype=np.int64)
    for t in range(m):
        cur[t] = (np.int64(seghigh[seg[t]]) << bits) | np.int64(lows[pos[t]])
    mask = (np.int64(1) << bits) - 1
    # Terms by ascending bound; prefix[j]: the bounds of order[:j] summed (float64).
    order = np.argsort(bounds, kind="mergesort")
    prefix = np.zeros(m + 1, dtype=np.float64)
    for j in range(m):
        prefix[j + 1] = prefix[j] + bounds[order[j]]
    slack = 1.0 + (m + 1) * 2.0**-23
    part = np.zeros(m, dtype=np.float32)  # the candidate's score of each term (query order)
    present = np.zeros(m, dtype=np.bool_)
    held = 0
    threshold = -1.0  # the k-th best score once k are held (scores are positive)
    first = 0  # order[first:] are the essential terms
    while True:
        doc = _NO_ROW  # the next candidate: the lowest row of the essential terms' cursors
        for j in range(first, m):
            if cur[order[j]] < doc:
                doc = cur[order[j]]
        if doc == _NO_ROW:
            break
        partial = 0.0
        for j in range(first, m):  # score the essential terms at doc and step past it
            t = order[j]
            if cur[t] != doc:
                present[t] = False
                continue
            p = pos[t]
            score = np.float32(idf[t] * factors[codes[p]])
            part[t] = score
            present[t] = True
            partial += score
            read += 1
            p += 1
            pos[t] = p
            if p == ends[t]:
                cur[t] = _NO_ROW
                continue
            if seg[t] + 1 < seg_ends[t] and p == segstart[seg[t] + 1]:
                seg[t] += 1
            cur[t] = (np.int64(seghigh[seg[t]]) << bits) | np.int64(lows[p])
        bound = partial + prefix[first]
        pruned = False
        for j in range(first - 1, -1, -1):  # non-essential terms, largest bound first: seek doc
            if bound * slack <= threshold:
                pruned = True
                break
            t = order[j]
            seeks += 1
            if cur[t] < doc:  # move the cursor to its first posting with row >= doc
                high = doc >> bits
                s = seg[t]
                last = seg_ends[t] - 1
                while s < last and seghigh[s] < high:  # whole segments before doc's
                    s += 1
                if seghigh[s] < high:  # the list ends before doc
                    pos[t] = ends[t]
                    cur[t] = _NO_ROW
                else:
                    p = pos[t] if s == seg[t] else segstart[s]
                    stop = segstart[s + 1] if s < last else ends[t]
                    if seghigh[s] == high:
                        low = doc & mask
                        if p + _SCAN <= stop:  # doc is usually a few postings on: count them, no branch
                            below = 0
                            for i in range(p, p + _SCAN):
                                below += lows[i] < low
                            p += below
                        else:
                            while p < stop and lows[p] < low:
                                p += 1
                        if p < stop and lows[p] < low:  # farther: gallop, then bisect
                            lo = p  # invariant: lows[lo] < low, and hi == stop or lows[hi] >= low
                            step = 1
                            hi = p + 1
                            while hi < stop and lows[hi] < low:
                                lo = hi
                                step *= 2
                                hi = lo + step
                            hi = min(hi, stop)
                            while hi - lo > 1:
                                mid = (lo + hi) >> 1
                                if lows[mid] < low:
                                    lo = mid
                                else:
                                    hi = mid
                            p = hi
                    if p < stop:
                        seg[t] = s
                        pos[t] = p
                        cur[t] = (np.int64(seghigh[s]) << bits) | np.int64(lows[p])
                    elif s < last:  # past the segment: the next one's first posting
                        seg[t] = s + 1
                        pos[t] = segstart[s + 1]
                        cur[t] = (np.int64(seghigh[s + 1]) << bits) | np.int64(lows[pos[t]])
                    else:
                        seg[t] = s
                        pos[t] = ends[t]
                        cur[t] = _NO_ROW
            if cur[t] == doc:
                score = np.float32(idf[t] * factors[codes[pos[t]]])
                part[t] = score
                present[t] = True
                bound += score - bounds[t]
            else:
                present[t] = False
                bound -= bounds[t]
        if pruned:
            continue
        total = np.float32(0.0)
        for t in range(m):  # the float32 sum in query order, as the score buffer adds them
            if present[t]:
                total = np.float32(total + part[t])
        if held == k and total <= threshold:
            continue
        i = held if held < k else k - 1  # insert after every score >= total (their rows are lower)
        while i > 0 and scores[i - 1] < total:
            rows[i] = rows[i - 1]
            scores[i] = scores[i - 1]
            i -= 1
        rows[i] = doc
        scores[i] = total
        if held < k:
            held += 1
        if held == k:
            threshold = scores[k - 1]
            while first < m and prefix[first + 1] * slack <= threshold:
                first += 1
            if first == m:  # no document can beat the threshold any more
                break
    return rows[:held], scores[:held], np.array([read, seeks], dtype=np.int64)
