"""What a target loss means: the losses of two count models on the speedrun's evaluation windows.

A target is only worth reaching fast if a model has to learn something to reach it. Two models
that learn nothing but counts set the scale:

* the **unigram** model predicts every token from its frequency in the training split, ignoring
  the context; a transformer reaches its loss within a few dozen steps (the "unigram plateau");
* the **bigram** model predicts a token from the one before it, from the training split's
  counts of adjacent pairs; below its loss a model must use more than one token of context.

Both are smoothed by adding ``k`` to every count (add-k, Lidstone; Jurafsky and Martin, *Speech
and Language Processing*, 3rd ed., ch. 3), so an unseen token or pair has a finite loss, and
both are scored on exactly the windows the harness evaluates a run on
(:func:`~trainfast.speedrun.data.evaluation_windows`): every target token of every window, with
its input token as the bigram's context. :meth:`ReferenceLosses.between` places a target
between them; the ``cpu`` preset's target lies at least halfway from the unigram to the bigram
loss, the ``gpu`` preset's below the bigram loss.

When not to use it: these are floors of what counting buys, not baselines of what a small
transformer reaches at a given budget; a target between them says which regime a run is in, not
how hard it is to reach.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import torch

from trainfast.speedrun.data import PreparedData, evaluation_windows
from trainfast.validation import check_number, check_positive

__all__ = [
    "ReferenceLosses",
    "bigram_loss",
    "reference_losses",
    "unigram_loss",
]


def _as_ids(tokens, name: str) -> np.ndarray:
    array = tokens.numpy() if isinstance(tokens, torch.Tensor) else np.asarray(tokens)
    array = array.reshape(-1).astype(np.int64)
    if array.size == 0:
        raise ValueError(f"Invalid {name}: no tokens")
    return array


def _check(vocab_size: int, k: float, *arrays: np.ndarray) -> None:
    check_positive("vocab_size", vocab_size)
    check_number("k", k, above=0.0)
    for array in arrays:
        if array.min() < 0 or array.max() >= vocab_size:
            raise ValueError(
                f"Invalid vocab_size: {vocab_size} (a token id {int(array.max())} is out of range)"
            )


def unigram_loss(train, targets, vocab_size: int, k: float = 0.1) -> float:
    """Mean cross-entropy (nats per token) of ``targets`` under the add-``k`` unigram model of
    ``train``: p(t) = (count(t) + k) / (len(train) + k * vocab_size)."""
    train, targets = _as_ids(train, "train"), _as_ids(targets, "targets")
    _check(vocab_size, k, train, targets)
    counts = np.bincount(train, minlength=vocab_size).astype(np.float64)
    log_p = np.log(counts + k) - math.log(len(train) + k * vocab_size)
    return float(-log_p[targets].mean())


def bigram_loss(train, contexts, targets, vocab_size: int, k: float = 0.1) -> float:
    """Mean cross-entropy (nats per token) of each ``targets[i]`` after ``contexts[i]`` under
    the add-``k`` bigram model of ``train``: p(b | a) = (count(a, b) + k) / (count(a, .) + k *
    vocab_size), counted over the adjacent pairs of ``train``.

    The pair counts are kept sparse (sorted pair codes ``a * vocab_size + b``), so memory grows
    with the training tokens, not with ``vocab_size`` squared."""
    train = _as_ids(train, "train")
    contexts, targets = _as_ids(contexts, "contexts"), _as_ids(targets, "targets")
    if contexts.shape != targets.shape:
        raise ValueError(
            f"Invalid contexts: {contexts.size} tokens for {targets.size} targets (expected one "
            "each)"
        )
    if train.size < 2:
        raise ValueError("Invalid train: fewer than two tokens (no pair to count)")
    _check(vocab_size, k, train, contexts, targets)
    codes, pair_counts = np.unique(train[:-1] * vocab_size + train[1:], return_counts=True)
    context_counts = np.bincount(train[:-1], minlength=vocab_size).astype(np.float64)
    wanted = contexts * vocab_size + targets
    at = np.searchsorted(codes, wanted).clip(max=len(codes) - 1)
    seen = np.where(codes[at] == wanted, pair_counts[at], 0).astype(np.float64)
    log_p = np.log(seen + k) - np.log(context_counts[contexts] + k * vocab_size)
    return float(-log_p.mean())


@dataclass(frozen=True)
class ReferenceLosses:
    """The count models' losses on one split's evaluation windows (nats per token)."""

    unigram: float
    bigram: float
    split: str
    eval_tokens: int  # target tokens scored
    k: float

    def between(self, fraction: float) -> float:
        """The loss ``fraction`` of the way from the unigram loss (0) to the bigram loss (1);
        above 1, that far below the bigram loss."""
        check_number("fraction", fraction, minimum=0.0)
        return self.unigram - fraction * (self.unigram - self.bigram)

    def fraction_of(self, loss: float) -> float:
        """How far ``loss`` lies from the unigram loss (0) towards the bigram loss (1)."""
        return (self.unigram - loss) / (self.unigram - self.bigram)


def reference_losses(
    data: PreparedData,
    seq_len: int,
    eval_tokens: int,
    *,
    split: str = "validation",
    k: float = 0.1,
) -> ReferenceLosses:
    """The unigram and bigram losses, counted on the training split of ``data``, on the windows
    a run of ``seq_len`` tokens with ``eval_tokens`` evaluation tokens is scored on in ``split``
    (:func:`~trainfast.speedrun.data.evaluation_windows`)."""
    if split not in ("validation", "tune"):
        raise ValueError(f"Invalid split: {split!r} (expected 'validation' or 'tune')")
    windows = evaluation_windows(data.tokens_of(split), seq_len, eval_tokens)
    contexts, targets = windows[:, :-1], windows[:, 1:]
    train = np.asarray(data.tokens_of("train"))
    return ReferenceLosses(
        unigram=unigram_loss(train, targets, data.vocab_size, k),
        bigram=bigram_loss(train, contexts, targets, data.vocab_size, k),
        split=split,
        eval_tokens=int(targets.numel()),
        k=k,
    )
