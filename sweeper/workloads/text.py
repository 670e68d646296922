"""Token streams for language models, packed into sequences of the model's context.

`data=text`: byte-level text (vocabulary 256) from a corpus every machine has without a download, the
Python standard library's own source files, split into train and validation by file.
`data=tokens`: the user's tokenized corpus in nanoGPT's layout, `train.bin` and `val.bin` of token ids:
raw uint16 or uint32 (data.token_dtype; auto: uint16 for a vocabulary up to 65,536), or llm.c's files with
their 1 KiB header, which names the width itself.
"""

from __future__ import annotations

import functools
import glob
import hashlib
import os
import sysconfig
from dataclasses import dataclass
from typing import Dict, List, Optional, Sequence, Tuple

import numpy as np
import torch
from torch.utils.data import Dataset

from sweeper.config import BYTE_VOCAB, TOKEN_DATA, DataConfig
from sweeper.workloads.splits import Splits

TOKEN_FILES = ("train.bin", "val.bin")
TOKEN_DTYPE = np.uint16  # nanoGPT's prepare.py writes GPT-2 BPE ids as uint16, with no header
TOKEN_DTYPES = {"uint16": np.uint16, "uint32": np.uint32}
# llm.c's dev/data/data_common.py: 256 int32s (magic, version, token count, zeros), then the ids; the magic
# names their width (GPT-2's uint16, Llama 3's uint32: a vocabulary of 128,256).
HEADER_BYTES = 256 * 4
HEADER_MAGIC = {20240520: np.uint16, 20240801: np.uint32}
# Ids are checked against the vocabulary in chunks, so a large memmap is never read whole into memory.
_CHUNK = 1 << 24


class PackedSequences(Dataset):
    """A token stream cut into non-overlapping sequences of `context` tokens: sample i is the tokens
    at [i*context, (i+1)*context) and, as its targets, each one's next token (so the stream needs one
    token more than the sequences it yields). Index order is the stream's; the sampler shuffles."""

    def __init__(self, tokens: np.ndarray, context: int):
        self.tokens, self.context = tokens, context

    def __len__(self) -> int:
        return max(0, (len(self.tokens) - 1) // self.context)

    def __getitem__(self, index: int) -> Tuple[torch.Tensor, torch.Tensor]:
        if not 0 <= index < len(self):
            raise IndexError(index)
        begin = index * self.context
        chunk = torch.from_numpy(np.asarray(self.tokens[begin: begin + self.context + 1], dtype=np.int64))
        return chunk[:-1], chunk[1:]


@dataclass(frozen=True)
class Corpus:
    """The standard library's sources (every file read once, ~4.7 MB), split by file."""

    train_files: List[str]
    val_files: List[str]
    root: str
    digest: str  # sha256 over every file's name and bytes, in order: the dataset's identity
    contents: Dict[str, bytes]

    def read(self, files: List[str]) -> np.ndarray:
        return np.frombuffer(b"".join(self.contents[f] for f in files), dtype=np.uint8)

    def size(self, files: List[str]) -> int:
        return sum(len(self.contents[f]) for f in files)


@functools.lru_cache(maxsize=2)
def stdlib_corpus(val_fraction: float) -> Corpus:
    """The top-level `.py` files of this interpreter's standard library, sorted by name; a file is in
    validation when the hash of its name falls under `val_fraction`, so the split is the same on
    every machine with the same files and moves no file when others are added. Cached: the driver
    checks the corpus and then loads it."""
    root = sysconfig.get_paths()["stdlib"]
    files = sorted(os.path.basename(f) for f in glob.glob(os.path.join(root, "*.py")))
    contents = {name: _read(os.path.join(root, name)) for name in files}
    digest = hashlib.sha256()
    for name in files:
        digest.update(name.encode() + b"\0" + contents[name] + b"\0")
    val = [f for f in files if _unit_hash(f) < val_fraction]
    return Corpus([f for f in files if f not in val], val, root, digest.hexdigest(), contents)


def _unit_hash(name: str) -> float:
    return int.from_bytes(hashlib.sha256(name.encode()).digest()[:8], "big") / 2**64


def _read(path: str) -> bytes:
    with open(path, "rb") as f:
        return f.read()


def unigram_entropy_bits(tokens: np.ndarray, vocab_size: int) -> float:
    """The entropy of the stream's token frequencies (its first 2^24 tokens), in bits per token: the
    loss of a model that knows which tokens are common and nothing of their order (a guess that
    knows only the vocabulary scores log2(vocabulary))."""
    counts = np.bincount(np.asarray(tokens[:_CHUNK], dtype=np.int64), minlength=vocab_size).astype(np.float64)
    p = counts[counts > 0] / counts.sum()
    return float(-(p * np.log2(p)).sum())


@dataclass(frozen=True)
class TokenLayout:
    """How a token file holds its ids: their width, and where they begin (after llm.c's header, or at 0)."""

    dtype: type
    offset_bytes: int = 0
    header: bool = False

    @property
    def itemsize(self) -> int:
        return np.dtype(self.dtype).itemsize


def auto_dtype(vocab_size: Optional[int]) -> type:
    """The narrowest width that holds every id below `vocab_size`: uint16 up to 65,536 ids (nanoGPT's
    GPT-2 files), else uint32."""
    return np.uint16 if vocab_size is None or vocab_size <= np.iinfo(np.uint16).max + 1 else np.uint32


def token_layout(path: str, token_dtype: str = "auto", vocab_size: Optional[int] = None) -> TokenLayout:
    """The file's layout: llm.c's header when its first int32 is a known magic and the header's token count
    matches the file's size, else raw ids of data.token_dtype (auto: by `vocab_size`)."""
    size = os.path.getsize(path)
    if size >= HEADER_BYTES:
        header = np.fromfile(path, dtype=np.int32, count=3)
        dtype = HEADER_MAGIC.get(int(header[0]))
        if dtype is not None and HEADER_BYTES + int(header[2]) * np.dtype(dtype).itemsize == size:
            return TokenLayout(dtype, HEADER_BYTES, True)
    return TokenLayout(TOKEN_DTYPES.get(token_dtype) or auto_dtype(vocab_size))


def token_file(folder: str, name: str, token_dtype: str = "auto", vocab_size: Optional[int] = None) -> np.ndarray:
    path = os.path.join(folder, name)
    layout = token_layout(path, token_dtype, vocab_size)
    if os.path.getsize(path) == layout.offset_bytes:
        return np.zeros(0, layout.dtype)
    return np.memmap(path, dtype=layout.dtype, mode="r", offset=layout.offset_bytes)


def check_tokens(folder: Optional[str], vocab_size: Optional[int], context: int,
                 token_dtype: str = "auto") -> List[str]:
    """Problems with a nanoGPT-layout corpus: the folder and both files, their size (whole ids of their
    width), at least one sequence each, and every id below `vocab_size`."""
    if not folder:
        return ["data.path is not set: data=tokens needs the folder holding train.bin and val.bin, "
                "e.g. data.path=data/shakespeare"]
    if vocab_size is None or vocab_size < 2:
        return [f"data.vocab_size={vocab_size}: data=tokens needs the vocabulary its ids are below, "
                "e.g. data.vocab_size=50304 for GPT-2's tokenizer"]
    if vocab_size > np.iinfo(np.uint32).max + 1:
        return [f"data.vocab_size={vocab_size}: token ids are at most uint32, so at most 4294967296"]
    if token_dtype == "uint16" and vocab_size > np.iinfo(np.uint16).max + 1:
        return [f"data.vocab_size={vocab_size} with data.token_dtype=uint16: uint16 ids reach 65535 only; write "
                "the ids as uint32 and set data.token_dtype=uint32 (or auto)"]
    problems = []
    for name in TOKEN_FILES:
        path = os.path.join(os.path.abspath(folder), name)
        if not os.path.isfile(path):
            problems.append(f"data.path={folder!r} has no {name} ({path}): data=tokens reads nanoGPT's "
                            "train.bin and val.bin (uint16 or uint32 token ids) from that folder")
            continue
        problem = _file_problem(folder, name, path, vocab_size, context, token_dtype)
        if problem:
            problems.append(problem)
    return problems


def _file_problem(folder: str, name: str, path: str, vocab_size: int, context: int, token_dtype: str) -> Optional[str]:
    layout = token_layout(path, token_dtype, vocab_size)
    width = np.dtype(layout.dtype).name
    if layout.header and token_dtype != "auto" and TOKEN_DTYPES[token_dtype] is not layout.dtype:
        return (f"data.path={folder!r}: {name} has llm.c's header, which says its ids are {width}, not "
                f"data.token_dtype={token_dtype}: set data.token_dtype=auto (or {width})")
    size = os.path.getsize(path) - layout.offset_bytes
    if size % layout.itemsize:
        return (f"data.path={folder!r}: {name} is {size} bytes, not a whole number of {width} token ids "
                f"({layout.itemsize} bytes each): write it with numpy's {width} "
                f"(np.array(ids, dtype=np.{width}).tofile) or set data.token_dtype to the width it was written in")
    tokens = token_file(folder, name, token_dtype, vocab_size)
    if len(tokens) < context + 1:
        return (f"data.path={folder!r}: {name} holds {len(tokens)} tokens, fewer than one sequence of "
                f"model.context={context} plus its next token: give more tokens or a smaller model.context")
    top = max(int(tokens[i: i + _CHUNK].max()) for i in range(0, len(tokens), _CHUNK))
    if top >= vocab_size:
        return (f"data.path={folder!r}: {name} holds token id {top}, not below data.vocab_size={vocab_size}: set "
                f"data.vocab_size to at least {top + 1}" + (f" (read as {width}: if the file is another width, set "
                                                           "data.token_dtype)" if not layout.header else ""))
    return None


def check_text(val_fraction: float, context: int) -> List[str]:
    corpus = stdlib_corpus(val_fraction)
    problems = []
    for split, files in (("train", corpus.train_files), ("validation", corpus.val_files)):
        size = corpus.size(files)
        if size < context + 1:
            total = len(corpus.train_files) + len(corpus.val_files)
            problems.append(
                f"data=text: the {split} split holds {size} bytes ({len(files)} of the {total} standard library "
                f"files in {corpus.root}), fewer than one sequence of model.context={context} plus its "
                "next byte: use a smaller model.context or change data.val_fraction")
    return problems


NAMES = TOKEN_DATA


def check(cfg: DataConfig, context: int = 0) -> List[str]:
    """Problems that would stop `load`: found without loading anything. `context`: the language model's
    sequence length, which the data must hold at least one sequence of."""
    if cfg.name == "tokens":
        return check_tokens(cfg.path, cfg.vocab_size, context, cfg.token_dtype)
    return check_text(cfg.val_fraction, context)


def source(cfg: DataConfig) -> str:
    """Where the data comes from, as MLflow's dataset input names it."""
    if cfg.name == "text":
        return "the Python standard library's source files (sweeper.text)"  # recorded as before the move
    return f"nanoGPT token files ({os.path.abspath(cfg.path) if cfg.path else 'data.path'})"


def load(cfg: DataConfig, input_shape: Sequence[int]) -> Splits:
    context = int(input_shape[0])
    return _text(cfg, context) if cfg.name == "text" else _tokens(cfg, context)


def _text(cfg: DataConfig, context: int) -> Splits:
    corpus = stdlib_corpus(cfg.val_fraction)
    train = corpus.read(corpus.train_files)
    return Splits(PackedSequences(train, context), PackedSequences(corpus.read(corpus.val_files), context),
                  num_classes=BYTE_VOCAB, byte_level=True,
                  unigram_entropy_bits=unigram_entropy_bits(train, BYTE_VOCAB),
                  identity=f"sha256:{corpus.digest}")


def _tokens(cfg: DataConfig, context: int) -> Splits:
    train, val = (token_file(os.path.abspath(cfg.path), name, cfg.token_dtype, cfg.vocab_size) for name in TOKEN_FILES)
    return Splits(PackedSequences(train, context), PackedSequences(val, context),
                  num_classes=int(cfg.vocab_size),
                  unigram_entropy_bits=unigram_entropy_bits(train, cfg.vocab_size), shareable=False)
