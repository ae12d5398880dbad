"""The speedrun's data: an offline corpus that ships with the pinned environment, a BPE
tokenizer trained on it, and token streams that never repeat a token.

**The text.** The Python sources of the installed ``torch`` package (``torch/**/*.py``, about
49 MB and 2,350 files for torch 2.14.1; mostly BSD-3-Clause, PyTorch's licence, with a few
vendored files under their own permissive licences: ``torch/_vendor`` Apache-2.0,
``torch/_appdirs.py`` MIT). Every machine
that installs the book's pinned torch has the same bytes, and their SHA-256 goes into every
record, so two records can be compared only when their corpora are the same. Another source
folder can be given (``root``), e.g. the standard library.

**The splits.** Each file goes to one split by a hash of its path, so the splits never share
a file: about 2 % *validation* (held out: the target loss is measured on it and nothing is
tuned on it), 2 % *tune* (for choosing hyperparameters) and the rest *train*.

**The tokens.** A byte-level BPE tokenizer (Hugging Face ``tokenizers``, as GPT-2's) is trained
on the training split only; each split is then encoded once into a flat ``uint16`` memmap
(``train.bin`` ...), as nanoGPT's ``prepare.py`` does, with an end-of-text token between files.

**The batches.** Two orders, behind one interface (``next_batch``, ``state_dict``,
``load_state_dict``): :class:`TokenStream` hands out non-overlapping windows in one shuffled
order fixed by its seed, so a run sees no token twice before it has used the whole split (and
says so when it has); :class:`RandomWindows` draws each window's start at random from the whole
memmap, as nanoGPT's ``get_batch`` does, so windows may overlap and repeat but a run never runs
out. Both can save and restore their position exactly, for a checkpointed run.

**The evaluation.** :func:`evaluation_windows` takes windows at evenly spaced starts over the
whole of a split, so a loss measured on them stands for every file of it, not for the few files
at its start.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from trainfast.validation import check_positive

__all__ = [
    "BATCH_ORDERS",
    "END_OF_TEXT",
    "SPLITS",
    "PreparedData",
    "RandomWindows",
    "TokenStream",
    "batches",
    "corpus_files",
    "evaluation_starts",
    "evaluation_windows",
    "prepare",
    "split_of",
    "torch_sources",
]

END_OF_TEXT = "<|endoftext|>"
SPLITS = ("train", "tune", "validation")
_VALIDATION_PERCENT, _TUNE_PERCENT = 2, 2


def torch_sources() -> Path:
    """The folder of the installed ``torch`` package: the default corpus."""
    return Path(torch.__file__).parent


def _path_hash(relative_path: str) -> int:
    return int(hashlib.sha256(relative_path.encode()).hexdigest(), 16)


def split_of(relative_path: str) -> str:
    """``"validation"``, ``"tune"`` or ``"train"`` for a file, from a hash of its path (stable
    across machines and Python runs, unlike ``hash``)."""
    bucket = _path_hash(relative_path) % 100
    if bucket < _VALIDATION_PERCENT:
        return "validation"
    return "tune" if bucket < _VALIDATION_PERCENT + _TUNE_PERCENT else "train"


def corpus_files(root: Path, max_bytes: int | None = None) -> dict[str, list[Path]]:
    """The corpus's ``*.py`` files under ``root`` by split, each list in the order of a hash of
    its path: a fixed shuffle, so that a stream (and a ``max_bytes`` slice) mixes the folders
    instead of reading one package after another.

    With ``max_bytes`` (a small corpus for tests and the chapter's live run), each split keeps
    its first files up to a share of it: 80 % for training, 10 % each for tuning and
    validation (at least one file each), so that even a small corpus has all three.
    """
    root = Path(root)
    if not root.is_dir():
        raise ValueError(f"Invalid corpus root: {str(root)!r} is not a folder")
    files = sorted(root.rglob("*.py"), key=lambda p: _path_hash(p.relative_to(root).as_posix()))
    by_split: dict[str, list[Path]] = {split: [] for split in SPLITS}
    for path in files:
        by_split[split_of(path.relative_to(root).as_posix())].append(path)
    if max_bytes is not None:
        check_positive("max_bytes", max_bytes)
        shares = {"train": 0.8, "tune": 0.1, "validation": 0.1}
        for split, paths in by_split.items():
            kept, total = [], 0
            for path in paths:
                total += path.stat().st_size
                if total > shares[split] * max_bytes and kept:
                    break
                kept.append(path)
            by_split[split] = kept
    for split, paths in by_split.items():
        if not paths:
            raise ValueError(
                f"Invalid corpus root: {str(root)!r} has no *.py file in the {split} split "
                f"({len(files)} files in all)"
            )
    return by_split


@dataclass(frozen=True)
class PreparedData:
    """Where :func:`prepare` put the tokens, and what they are."""

    folder: Path
    corpus_sha256: str
    vocab_size: int
    tokens: dict[str, int]  # split -> number of tokens

    def path(self, split: str) -> Path:
        if split not in SPLITS:
            raise ValueError(f"Unknown split: {split!r} (expected one of {SPLITS})")
        return self.folder / f"{split}.bin"

    def tokens_of(self, split: str) -> np.memmap:
        """The split's tokens, ``uint16``, mapped from disk (nothing is read until used)."""
        return np.memmap(self.path(split), dtype=np.uint16, mode="r")

    def tokenizer(self):  # -> tokenizers.Tokenizer
        from tokenizers import Tokenizer

        return Tokenizer.from_file(str(self.folder / "tokenizer.json"))


def _train_tokenizer(texts: list[str], vocab_size: int):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=[END_OF_TEXT],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),  # every byte encodable
        show_progress=False,
    )
    tokenizer.train_from_iterator(texts, trainer=trainer)
    return tokenizer


def prepare(
    folder: str | Path,
    *,
    root: str | Path | None = None,
    vocab_size: int = 4_096,
    max_bytes: int | None = None,
) -> PreparedData:
    """Tokenize the corpus under ``root`` (default :func:`torch_sources`) into ``folder``, once.

    Writes ``tokenizer.json``, ``train.bin``, ``tune.bin``, ``validation.bin`` and
    ``meta.json``. If ``meta.json`` already describes the same corpus (its SHA-256) and
    vocabulary, nothing is done again. The memmaps are written to temporary names and renamed
    when complete, so an interrupted run leaves no half-written split behind.
    """
    check_positive("vocab_size", vocab_size)
    if vocab_size > 2**16:
        raise ValueError(f"Invalid vocab_size: {vocab_size} (uint16 tokens hold at most 65,536)")
    root = Path(root) if root is not None else torch_sources()
    folder = Path(folder)
    by_split = corpus_files(root, max_bytes)
    digest = hashlib.sha256()
    texts: dict[str, list[str]] = {split: [] for split in SPLITS}
    for split, paths in by_split.items():
        for path in paths:
            data = path.read_bytes()
            digest.update(path.relative_to(root).as_posix().encode() + b"\0" + data + b"\0")
            texts[split].append(data.decode("utf-8", errors="replace"))
    sha = digest.hexdigest()
    meta_path = folder / "meta.json"
    outputs = [folder / "tokenizer.json", *(folder / f"{split}.bin" for split in SPLITS)]
    if meta_path.exists() and all(path.exists() for path in outputs):
        meta = json.loads(meta_path.read_text())
        if meta.get("corpus_sha256") == sha and meta.get("vocab_size") == vocab_size:
            return PreparedData(folder, sha, vocab_size, meta["tokens"])
    folder.mkdir(parents=True, exist_ok=True)
    meta_path.unlink(missing_ok=True)  # the files below belong to no corpus until it is back
    tokenizer = _train_tokenizer(texts["train"], vocab_size)
    tokenizer.save(str(folder / "tokenizer.json"))
    end = tokenizer.token_to_id(END_OF_TEXT)
    counts = {}
    for split in SPLITS:
        ids: list[int] = []
        for encoding in tokenizer.encode_batch(texts[split]):
            ids.extend(encoding.ids)
            ids.append(end)
        array = np.asarray(ids, dtype=np.uint16)
        partial = folder / f"{split}.bin.partial"
        array.tofile(partial)
        partial.replace(folder / f"{split}.bin")
        counts[split] = len(ids)
    files = {split: len(paths) for split, paths in by_split.items()}
    meta = {"corpus_sha256": sha, "vocab_size": vocab_size, "tokens": counts, "files": files}
    partial = folder / "meta.json.partial"
    partial.write_text(json.dumps(meta, indent=1))
    partial.replace(meta_path)
    return PreparedData(folder, sha, vocab_size, counts)


def _windows_at(tokens: np.ndarray, starts: np.ndarray, seq_len: int) -> torch.Tensor:
    rows = np.stack([tokens[i : i + seq_len + 1] for i in starts]).astype(np.int64)
    return torch.from_numpy(rows)  # (windows, seq + 1)


class TokenStream:
    """Non-overlapping ``(inputs, targets)`` windows of a token array, in a fixed shuffled order.

    The array is cut into windows of ``seq_len`` input tokens (window ``i`` starts at token
    ``i * seq_len``; its targets are the same tokens shifted by one). Each call of
    :meth:`next_batch` takes the next ``batch`` windows of one permutation of them, fixed by
    ``order_seed`` (a study gives each seed its own), so no input token is trained on twice and
    a batch mixes text from across the split: a run does not meet the corpus file by file,
    whose changes of style would show as bumps in every loss curve (the files of one package
    differ more than the pages of a web crawl). When the windows run out it raises, naming how
    many tokens were used, instead of silently wrapping around.
    """

    def __init__(self, tokens: np.ndarray, batch: int, seq_len: int, order_seed: int = 0) -> None:
        check_positive("batch", batch)
        check_positive("seq_len", seq_len)
        windows = (len(tokens) - 1) // seq_len
        if windows < 1:
            raise ValueError(
                f"Invalid seq_len: {seq_len} (the stream has {len(tokens)} tokens: no window)"
            )
        self.tokens, self.batch, self.seq_len = tokens, batch, seq_len
        self.order = np.random.default_rng(order_seed).permutation(windows)
        self.position = 0  # windows handed out so far
        self.used = 0  # input tokens handed out so far

    def next_batch(self) -> tuple[torch.Tensor, torch.Tensor]:
        if self.position + self.batch > len(self.order):
            raise RuntimeError(
                f"The token stream is used up: {self.used:,} tokens trained on of "
                f"{len(self.tokens):,}; a longer run needs a bigger corpus"
            )
        starts = self.order[self.position : self.position + self.batch] * self.seq_len
        self.position += self.batch
        self.used += self.batch * self.seq_len
        window = _windows_at(self.tokens, starts, self.seq_len)
        return window[:, :-1], window[:, 1:]  # inputs, and targets shifted by one

    def state_dict(self) -> dict[str, int]:
        """Where the stream is: enough, with the same tokens and seed, to go on exactly."""
        return {"position": self.position, "used": self.used}

    def load_state_dict(self, state: dict[str, int]) -> None:
        self.position, self.used = int(state["position"]), int(state["used"])


class RandomWindows:
    """``(inputs, targets)`` windows whose starts are drawn uniformly from the whole array.

    nanoGPT's ``get_batch``: ``torch.randint(len(data) - block_size, (batch_size,))``, here with
    a NumPy generator of its own (seeded by ``order_seed``), so the draws do not depend on how
    many random numbers the model's initialisation took. Windows can overlap and a token can be
    trained on twice in one run; in return the stream never runs out. ``used`` counts the input
    tokens handed out, repeats included.
    """

    def __init__(self, tokens: np.ndarray, batch: int, seq_len: int, order_seed: int = 0) -> None:
        check_positive("batch", batch)
        check_positive("seq_len", seq_len)
        if len(tokens) < seq_len + 1:
            raise ValueError(
                f"Invalid seq_len: {seq_len} (the array has {len(tokens)} tokens: no window)"
            )
        self.tokens, self.batch, self.seq_len = tokens, batch, seq_len
        self.generator = np.random.default_rng(order_seed)
        self.used = 0

    def next_batch(self) -> tuple[torch.Tensor, torch.Tensor]:
        starts = self.generator.integers(0, len(self.tokens) - self.seq_len, size=self.batch)
        self.used += self.batch * self.seq_len
        window = _windows_at(self.tokens, starts, self.seq_len)
        return window[:, :-1], window[:, 1:]

    def state_dict(self) -> dict:
        return {"generator": self.generator.bit_generator.state, "used": self.used}

    def load_state_dict(self, state: dict) -> None:
        self.generator.bit_generator.state = state["generator"]
        self.used = int(state["used"])


#: The batch orders a run can take its windows in (:func:`batches`).
BATCH_ORDERS = ("stream", "random")


def batches(
    order: str, tokens: np.ndarray, batch: int, seq_len: int, order_seed: int = 0
) -> TokenStream | RandomWindows:
    """The batch source called ``order``: ``"stream"`` (:class:`TokenStream`) or ``"random"``
    (:class:`RandomWindows`)."""
    if order == "stream":
        return TokenStream(tokens, batch, seq_len, order_seed)
    if order == "random":
        return RandomWindows(tokens, batch, seq_len, order_seed)
    raise ValueError(f"Invalid batch order: {order!r} (expected one of {BATCH_ORDERS})")


def evaluation_starts(length: int, seq_len: int, eval_tokens: int) -> np.ndarray:
    """Where the ``eval_tokens // seq_len`` evaluation windows of a split of ``length`` tokens
    start: evenly spaced from its first token to the last window (with its target) that fits.
    ``ValueError`` if they would overlap (ask for fewer)."""
    check_positive("seq_len", seq_len)
    check_positive("eval_tokens", eval_tokens)
    count = eval_tokens // seq_len
    if count < 1:
        raise ValueError(
            f"Invalid eval_tokens: {eval_tokens} (fewer than one window of {seq_len} tokens)"
        )
    last = length - seq_len - 1  # the last start whose window (with its target) fits
    if last < 0 or (count > 1 and last // (count - 1) < seq_len):
        raise ValueError(
            f"Invalid eval_tokens: {eval_tokens} ({count} windows of {seq_len} tokens do not "
            f"fit without overlapping targets in a split of {length:,} tokens)"
        )
    return np.arange(count) * last // max(count - 1, 1)  # 0, ..., last: at least seq_len apart


def evaluation_windows(tokens: np.ndarray, seq_len: int, eval_tokens: int) -> torch.Tensor:
    """``eval_tokens // seq_len`` windows of ``seq_len + 1`` tokens (inputs and the targets one
    later), at the starts :func:`evaluation_starts` spreads over the whole split, so that every
    part of it counts, unlike its first ``eval_tokens`` tokens (a few files). ``ValueError`` if
    they would overlap (ask for fewer).

    Returns an int64 tensor of shape ``(windows, seq_len + 1)``; the reference losses of
    :mod:`trainfast.speedrun.references` and the harness's evaluation both read these windows.
    """
    starts = evaluation_starts(len(tokens), seq_len, eval_tokens)
    return _windows_at(tokens, starts, seq_len)
