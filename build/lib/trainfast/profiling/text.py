"""The case study's input pipeline: real text, tokenized on the fly, the way quick scripts do it.

The text is the help pages of Python's own documentation (``pydoc_data.topics``, which ships
with every CPython, so nothing downloads; about 0.5 MB of English and code). The tokenizer is a
word-level one: a regular expression splits words and punctuation, a dictionary of the most
common ones maps them to ids, everything else becomes ``<unk>``.

:class:`TokenWindows` does the tokenizing inside ``__getitem__``, in Python, every time a sample
is read. That is the "slow loader" of the profiling chapter: real work (tens of microseconds per
sample) on the same thread as the training step unless a ``DataLoader`` moves it to worker
processes. The lasting fix is to tokenize once, ahead of training, and read token ids from
disk, as nanoGPT's ``prepare.py`` does; workers only hide the cost.

When not to use it: for a language model you care about, use a subword tokenizer (BPE) and
pre-tokenized shards.
"""

from __future__ import annotations

import re
from collections import Counter

import torch
from torch.utils.data import Dataset

from trainfast.validation import check_int

__all__ = ["TokenWindows", "WordTokenizer", "python_docs_text"]

_WORD = re.compile(r"\w+|[^\w\s]")  # a run of letters/digits/underscores, or one punctuation mark


def python_docs_text() -> str:
    """The text of Python's built-in help topics (``pydoc_data.topics``), in a fixed order."""
    try:
        from pydoc_data.topics import topics
    except ImportError as error:  # some distributions split the docs into a separate package
        raise RuntimeError(
            "pydoc_data is missing from this Python; install your distribution's full standard "
            "library (e.g. Debian's libpython3-stdlib) to get the case study's text"
        ) from error
    return "\n\n".join(topics[key] for key in sorted(topics))


class WordTokenizer:
    """Words and punctuation to ids: the ``vocab_size - 1`` most common, and ``<unk>`` (last)."""

    def __init__(self, text: str, vocab_size: int) -> None:
        if vocab_size < 2:
            raise ValueError(f"Invalid vocab_size: {vocab_size} (need at least 2)")
        common = Counter(_WORD.findall(text)).most_common(vocab_size - 1)
        self.ids = {word: i for i, (word, _) in enumerate(common)}
        self.unk = vocab_size - 1
        self.vocab_size = vocab_size

    def encode(self, text: str) -> list[int]:
        return [self.ids.get(word, self.unk) for word in _WORD.findall(text)]


class TokenWindows(Dataset):
    """Non-overlapping windows of ``seq_len + 1`` tokens: ``(tokens, targets)`` shifted by one.

    Only the character offsets of the windows are kept; ``__getitem__`` cuts the window's text
    and tokenizes it, every time. Both tensors are ``(seq_len,)`` int64.
    """

    def __init__(self, text: str, tokenizer: WordTokenizer, seq_len: int) -> None:
        check_int("seq_len", seq_len, minimum=1)
        starts = [match.start() for match in _WORD.finditer(text)]  # where each word begins
        n_words = len(starts)
        starts.append(len(text))  # the end of the last word's window
        n_windows = (n_words - 1) // seq_len
        if n_windows < 1:
            raise ValueError(f"Text too short: {n_words} words for seq_len {seq_len}")
        # window i: words i*seq_len .. (i+1)*seq_len, inclusive (seq_len + 1 tokens)
        self.bounds = [
            (starts[i * seq_len], starts[(i + 1) * seq_len + 1]) for i in range(n_windows)
        ]
        self.text, self.tokenizer, self.seq_len = text, tokenizer, seq_len

    def __len__(self) -> int:
        return len(self.bounds)

    def __getitem__(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        start, end = self.bounds[index]
        ids = torch.tensor(self.tokenizer.encode(self.text[start:end]))  # (seq_len + 1,)
        return ids[:-1], ids[1:]
