"""Tokenizers: text → token ids, each document opened by a document-start id, with the bytes of
text each token covers (for bits per byte).

* ``bytes``: UTF-8 bytes as ids 0–255, document start 256;
* ``bpe``: a byte-level BPE trained with Hugging Face ``tokenizers`` on the training split only,
  kept in ``ablate.cache.cache_dir()/lm`` under a digest of that text and its options, and used
  again only while its content has the SHA-256 written beside it;
* ``file``: the user's ``tokenizer.json``.

A token's bytes are those of the text between the end of the previous token and its own end (its
character offsets, in bytes): they sum to each document's UTF-8 length, so bits per byte counts
every byte once, whatever the tokenizer. The document-start token covers none.
"""

from __future__ import annotations

import hashlib
import os
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ablate import stopping
from ablate.cache import cache_dir, entry_problem, keep_entry
from ablate.errors import DataError, first_line, warn
from ablate.kernels.build import Unavailable, private_folder

from .options import BPETokenizer, BytesTokenizer, FileTokenizer

DOC = "<|doc|>"
BOS_CANDIDATES = (DOC, "<|endoftext|>", "<s>", "<|im_start|>", "[BOS]", "<bos>")
ENCODE_CHUNK = 256  # documents per encode_batch call between stop-request checks


@dataclass
class Encoded:
    """One document: ``ids [L]`` (``ids[0]`` the document start) and ``nbytes [L]``."""

    ids: np.ndarray
    nbytes: np.ndarray


def char_byte_ends(text: str) -> np.ndarray:
    """``[len(text) + 1]``: the UTF-8 byte offset of each character boundary."""
    codes = np.frombuffer(text.encode("utf-32-le"), dtype=np.uint32)
    widths = 1 + (codes >= 0x80) + (codes >= 0x800) + (codes >= 0x10000)
    return np.concatenate([[0], np.cumsum(widths)])


class ByteTokens:
    kind = "bytes"
    vocab_size = 257
    bos = 256

    def encode(self, docs: list[str]) -> list[Encoded]:
        out = []
        for doc in docs:
            raw = np.frombuffer(doc.encode(), dtype=np.uint8)
            ids = np.concatenate([[self.bos], raw]).astype(np.int32)
            out.append(Encoded(ids, np.concatenate([[0], np.ones(len(raw), np.int32)]).astype(np.int32)))
        return out


class HFTokens:
    """A Hugging Face ``tokenizers.Tokenizer`` with its document-start id; ``source`` names it in
    an error (the user's file)."""

    def __init__(self, tokenizer, bos: int, kind: str, source: str = "the trained BPE"):
        self.tokenizer, self.bos, self.kind, self.source = tokenizer, bos, kind, source
        self.vocab_size = tokenizer.get_vocab_size(with_added_tokens=True)

    def encode(self, docs: list[str]) -> list[Encoded]:
        out = []
        for first in range(0, len(docs), ENCODE_CHUNK):
            stopping.check()
            chunk = docs[first : first + ENCODE_CHUNK]
            encodings = self._encode_guarded(chunk)
            for doc, enc in zip(chunk, encodings, strict=True):
                ends = char_byte_ends(doc)
                if enc.offsets:
                    token_ends = np.maximum.accumulate(ends[np.array([e for _, e in enc.offsets])])
                else:
                    token_ends = np.zeros(0, np.int64)
                nbytes = np.diff(np.concatenate([[0], token_ends]))
                if len(nbytes):
                    nbytes[-1] += ends[-1] - token_ends[-1]  # text after the last token's end
                ids = np.concatenate([[self.bos], np.asarray(enc.ids)]).astype(np.int32)
                out.append(Encoded(ids, np.concatenate([[0], nbytes]).astype(np.int32)))
        return out

    def _encode_guarded(self, chunk: list[str]) -> list:
        """``encode_batch``, where a panic in the library (a user's pattern that backtracks past
        its regex engine's limit) is one line: each of its threads' panic reports, backtraces
        and all, went to the terminal (1,500 lines), then a PanicException, not an ``Exception``.
        What else it writes to fd 2 is passed on after."""
        sys.stderr.flush()
        with tempfile.TemporaryFile() as held:
            saved = os.dup(2)
            os.dup2(held.fileno(), 2)
            try:
                return self.tokenizer.encode_batch(chunk, add_special_tokens=False)
            except BaseException as exc:
                if type(exc).__name__ != "PanicException":
                    raise
                held.truncate(0)  # the panic's reports: its message is said below
                raise DataError(
                    f"{self.source}: the tokenizer failed on the text ({first_line(exc)}): a pattern of "
                    f"its normalizer or pre_tokenizer that backtracks without end? (tokenizer.path)"
                ) from None
            finally:
                os.dup2(saved, 2)
                os.close(saved)
                held.seek(0)
                if said := held.read():
                    os.write(2, said)


def train_bpe(options: BPETokenizer, docs: list[str]):
    """A byte-level BPE learned from ``docs`` (ids: ``<|doc|>`` 0, then the 256 bytes, then merges)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=options.vocab_size,
        min_frequency=options.min_frequency,
        special_tokens=[DOC],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(docs, trainer=trainer, length=len(docs))
    return tokenizer


def bpe_digest(options: BPETokenizer, docs: list[str]) -> str:
    import tokenizers

    head = f"bpe {options.vocab_size} {options.min_frequency} {tokenizers.__version__}\n"
    digest = hashlib.sha256(head.encode())
    for doc in docs:
        digest.update(hashlib.sha256(doc.encode()).digest())
    return digest.hexdigest()[:24]


def cached_bpe(options: BPETokenizer, docs: list[str]) -> HFTokens:
    """The BPE for these training documents, from the cache or trained and kept there. A kept one
    is used only where its content has the digest written beside it, in a folder of this user's
    own that no one else can write (else it is trained again, with a warning)."""
    from tokenizers import Tokenizer

    path = cache_dir() / "lm" / f"bpe-{bpe_digest(options, docs)}.json"
    try:
        private_folder(path.parent)
    except Unavailable as exc:
        warn(f"not using the tokenizer cache ({exc})")
        tokenizer = train_bpe(options, docs)
        return HFTokens(tokenizer, tokenizer.token_to_id(DOC), "bpe")
    tokenizer = None
    if path.is_file():
        problem = entry_problem(path)
        try:
            tokenizer = None if problem else Tokenizer.from_file(str(path))
        except Exception as exc:  # noqa: BLE001 - the tokenizers library's refusals vary: train again
            problem = f"not a tokenizer ({first_line(exc)})"
        if problem:
            warn(f"{path}: a kept tokenizer not used, {problem}: trained again")
    if tokenizer is None:
        tokenizer = train_bpe(options, docs)
        partial = path.with_suffix(f".{os.getpid()}.part")
        try:
            tokenizer.save(str(partial))
            keep_entry(partial, path)
        except OSError as exc:
            warn(f"{path}: the tokenizer could not be kept in the cache ({exc.strerror or exc})")
    return HFTokens(tokenizer, tokenizer.token_to_id(DOC), "bpe")


def file_tokenizer(options: FileTokenizer, base: Path) -> HFTokens:
    from tokenizers import Tokenizer

    path = base / Path(options.path).expanduser()
    if not path.is_file():
        raise DataError(f"{path}: tokenizer file not found (tokenizer.path)")
    try:
        tokenizer = Tokenizer.from_file(str(path))
    except Exception as exc:
        raise DataError(f"{path}: not a tokenizers tokenizer.json ({str(exc).splitlines()[0]})") from None
    names = [options.bos] if options.bos is not None else list(BOS_CANDIDATES)
    for name in names:
        bos = tokenizer.token_to_id(name)
        if bos is not None:
            return HFTokens(tokenizer, bos, "file", str(path))
    raise DataError(
        f"{path}: the tokenizer has no document-start token ({', '.join(names)}); set tokenizer.bos to "
        f"one it has"
    )


# ``tokenizer.kind`` → the tokenizer, given its options, the training documents and the study's folder.
TOKENIZERS = {
    "bytes": lambda options, train, base: ByteTokens(),
    "bpe": lambda options, train, base: cached_bpe(options, train),
    "file": lambda options, train, base: file_tokenizer(options, base),
}


def make_tokenizer(options: BytesTokenizer | BPETokenizer | FileTokenizer, train: list[str], base: Path):
    """The tokenizer ``options`` name, fitted to the training documents where it learns."""
    return TOKENIZERS[options.kind](options, train, base)
