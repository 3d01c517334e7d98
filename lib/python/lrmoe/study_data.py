"""lrmoe-study's data: real text from the Debian `fortunes` packages
(/usr/share/games/fortunes: plain-text files of fortunes separated by
lines holding a single '%', next to their .dat/.u8 index files), as
byte-level tokens (vocabulary 256).

The split is fixed and does not depend on file order: every
`val_every`-th fortune of the concatenation (files in sorted path order)
goes to validation, the rest to training. Training batches are windows at
offsets drawn from one numpy Generator seeded by the data seed, so every
run of a study sees the same batches in the same order; validation is a
fixed set of windows evaluated in full."""
import os

import numpy as np

DEFAULT_CORPUS = "/usr/share/games/fortunes"
_INDEX_SUFFIXES = (".dat", ".u8")


class CorpusError(Exception):
    """The corpus is missing, unreadable or too small."""


def corpus_files(paths):
    """The text files named by paths (files, or directories whose plain
    files other than the .dat/.u8 indexes are taken), sorted per
    directory. Raises CorpusError for a missing path or an empty set."""
    out = []
    for p in paths:
        if os.path.isdir(p):
            names = sorted(n for n in os.listdir(p) if not n.startswith(".")
                           and not n.endswith(_INDEX_SUFFIXES))
            found = [os.path.join(p, n) for n in names if os.path.isfile(os.path.join(p, n))]
            if not found:
                raise CorpusError(f"{p}: no text files in this directory")
            out += found
        elif os.path.isfile(p):
            out.append(p)
        elif not os.path.exists(p):
            raise CorpusError(f"{p}: no such file or directory (the default corpus comes "
                              "from the Debian package fortunes: apt-get install fortunes)")
        else:
            raise CorpusError(f"{p}: not a regular file or directory")
    if not out:
        raise CorpusError("no corpus given")
    return out


def split_records(blob):
    """Fortunes of a file's bytes: the text between lines holding '%'."""
    recs, cur = [], []
    for line in blob.split(b"\n"):
        if line.strip() == b"%":
            if cur:
                recs.append(b"\n".join(cur) + b"\n")
            cur = []
        else:
            cur.append(line)
    if any(x.strip() for x in cur):
        recs.append(b"\n".join(cur) + b"\n")
    return recs


class Corpus:
    """Train and validation byte arrays (uint8) of a corpus and the files
    they came from."""

    def __init__(self, paths, val_every=20, need_train=0, need_val=0):
        self.files = corpus_files(paths)
        train, val, self.records = [], [], 0
        for f in self.files:
            try:
                with open(f, "rb") as fh:
                    blob = fh.read()
            except OSError as e:
                raise CorpusError(f"{f}: {e.strerror}") from None
            for r in split_records(blob):
                (val if self.records % val_every == val_every - 1 else train).append(r)
                self.records += 1
        self.train = np.frombuffer(b"".join(train), np.uint8)
        self.val = np.frombuffer(b"".join(val), np.uint8)
        what = self.files[0] if len(self.files) == 1 else f"{len(self.files)} files"
        if self.train.size >= need_train and self.val.size < need_val and \
                self.records < val_every:
            # the cause is the format, not the size: too few records for one
            # to go to validation (every val_every-th does)
            binary = any(b"\0" in blob for blob in self._heads())
            raise CorpusError(
                f"{what}: {self.records} record(s) in {self._size()} "
                f"bytes: no validation text, since every {val_every}th record goes to "
                "validation and records are separated by lines holding a single '%' "
                "(the fortune format)"
                + ("; the file holds NUL bytes: is it text at all?" if binary else
                   "; add '%' lines between the texts"))
        if self.train.size < need_train or self.val.size < need_val:
            raise CorpusError(
                f"{what}: too small: {self.train.size} training and {self.val.size} "
                f"validation bytes ({self.records} records, every {val_every}th to "
                f"validation); this study needs at least {need_train} and {need_val} "
                "(lower --seq/--batch/--val-batches or give more text)")

    def _size(self):
        return sum(os.path.getsize(f) for f in self.files)

    def _heads(self, n=65536):
        """The first n bytes of each file (for a binary check)."""
        for f in self.files:
            try:
                with open(f, "rb") as fh:
                    yield fh.read(n)
            except OSError:
                continue

    def batches(self, seed, batch, seq):
        """Endless training batches (inputs (B,S) int64, targets (B,S)),
        the same sequence for the same seed."""
        rng = np.random.Generator(np.random.PCG64(seed))
        hi = self.train.size - seq - 1
        while True:
            off = rng.integers(0, hi + 1, size=batch)
            yield self._windows(self.train, off, seq)

    def validation(self, n, seq):
        """n fixed validation windows, evenly spaced over the split."""
        hi = self.val.size - seq - 1
        off = np.linspace(0, hi, n).astype(np.int64)
        return self._windows(self.val, off, seq)

    @staticmethod
    def _windows(a, off, seq):
        idx = off[:, None] + np.arange(seq + 1)[None, :]
        w = a[idx].astype(np.int64)
        return w[:, :-1], w[:, 1:]
