"""Recall: rank candidates (Skills, memories, later tools) for a query.

The scorer is replaceable (`XAGENT_RECALL_SCORER`, a dotted path to a class built with no
arguments whose `score(query_terms, documents)` returns one number per document); the default
is Okapi BM25 over the documents' fields. Whatever scores, `rank` keeps only positive scores and
orders ties by the documents' `ref`, so the same candidates always come back in the same order
(never the order they were read in). Scores are for ordering only: callers never show them to
the model.
"""

from __future__ import annotations

import math
import re
from collections import Counter
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Protocol

from django.conf import settings
from django.utils.module_loading import import_string

_WORD = re.compile(r"[^\W_]+", re.UNICODE)
# Words that say nothing about which Skill or memory fits (kept short on purpose).
_STOPWORDS = frozenset(
    """a an and are as at be but by can do does for from has have how i if in into is it its me my
    of on or our please so that the their then there these this to use using was we what when which
    who will with you your""".split()
)


def terms(text: str) -> list[str]:
    """Lowercased words without stopwords, plurals folded ("reports" -> "report")."""
    out = []
    for word in _WORD.findall(text.lower()):
        if len(word) < 2 or word in _STOPWORDS:
            continue
        if len(word) > 3 and word.endswith("s") and not word.endswith("ss"):
            word = word[:-1]
        out.append(word)
    return out


@dataclass(frozen=True)
class Document:
    """A candidate: `ref` identifies it (and breaks ties); `fields` are its searchable texts;
    `weights` scale a field's term frequency (a match in a name counts more than in prose)."""

    ref: str
    fields: dict[str, str]
    weights: dict[str, float] = field(default_factory=dict)
    payload: object = None

    def weighted_terms(self) -> Counter:
        counts: Counter = Counter()
        for name, text in self.fields.items():
            weight = self.weights.get(name, 1.0)
            for term in terms(text or ""):
                counts[term] += weight
        return counts


class Scorer(Protocol):
    def score(self, query_terms: list[str], documents: list[Document]) -> list[float]: ...


class BM25Scorer:
    """Okapi BM25 (k1 = 1.2, b = 0.75) with IDF over the candidate set itself."""

    k1 = 1.2
    b = 0.75

    def score(self, query_terms: list[str], documents: list[Document]) -> list[float]:
        if not documents or not query_terms:
            return [0.0] * len(documents)
        bags = [doc.weighted_terms() for doc in documents]
        lengths = [sum(bag.values()) for bag in bags]
        average = (sum(lengths) / len(lengths)) or 1.0
        n = len(documents)
        document_frequency = Counter(term for bag in bags for term in bag)
        wanted = list(dict.fromkeys(query_terms))
        scores = []
        for bag, length in zip(bags, lengths, strict=True):
            total = 0.0
            for term in wanted:
                tf = bag.get(term, 0.0)
                if not tf:
                    continue
                df = document_frequency[term]
                idf = math.log(1 + (n - df + 0.5) / (df + 0.5))
                total += idf * tf * (self.k1 + 1) / (tf + self.k1 * (1 - self.b + self.b * length / average))
            scores.append(total)
        return scores


@lru_cache(maxsize=4)
def _scorer_class(path: str):
    return import_string(path)


def scorer() -> Scorer:
    return _scorer_class(getattr(settings, "XAGENT_RECALL_SCORER", "skills_app.recall.BM25Scorer"))()


def rank(query: str, documents: list[Document], limit: int) -> list[Document]:
    """The best `limit` documents for `query` (positive score only), ties by `ref`."""
    query_terms = terms(query)
    if not query_terms or not documents or limit <= 0:
        return []
    ordered = sorted(documents, key=lambda d: d.ref)  # the input order never matters
    scores = scorer().score(query_terms, ordered)
    ranked = sorted(
        (pair for pair in zip(scores, ordered, strict=True) if pair[0] > 0),
        key=lambda pair: (-pair[0], pair[1].ref),
    )
    return [doc for _, doc in ranked[:limit]]
