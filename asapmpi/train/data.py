"""Datasets for the training demos: LIBSVM files, synthetic problems, digits, sharding.

Sparse features are ``scipy.sparse.csr_matrix`` (float32); LIBSVM files are read by
scikit-learn's parser.  Both come with the `train` extra.

Data is loaded per rank, not per job: ``load(name, rank, size)`` gives the training rows
of ``rank``'s shard only, and the whole test set.  The synthetic sparse problems generate
just the blocks of rows of the shard, and a plain LIBSVM training file with a test file
is parsed just in the rank's byte range, so a rank's memory is O(its shard + the model).
The other data (digits, synthetic images, the standard library's text, compressed LIBSVM
files and those whose test set is held out of the training file) is loaded whole, and
the rank keeps its strided shard().

Every generator here is deterministic: it draws only from generators seeded by the seed
(``np.random.default_rng(seed)``, or ``default_rng([seed, ...])`` for a stream or block
of rows) and, beyond the generators' own draws, uses only correctly rounded arithmetic
(+ - * / sqrt, sequential sums), so a seed gives bitwise the same data on any machine
(given NumPy's stable Generator streams), and the same global data set whatever the
number of ranks that share it.  Minibatches are a pure function of (seed, rank,
iteration), so a resumed run draws exactly the batches an uninterrupted one would.
"""
from __future__ import annotations

import bz2
import gzip
import hashlib
import inspect
import io
import lzma
import os
import platform
import sys
import threading
import zlib
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Callable, Optional, Union

import numpy as np

from ..errors import ConfigError
from ..extras import check, require

if TYPE_CHECKING:
    import scipy.sparse

# scipy is checked here (found, not imported: 0.16 s of every start) and imported by the
# first sparse dataset
check(["scipy"], "train", "asapmpi's training data")


def _sparse():
    """scipy.sparse, imported on first use."""
    return require("scipy.sparse", "train", "asapmpi's training data")

__all__ = [
    "Dataset", "batch_indices", "conform", "digits", "is_sparse", "load", "load_libsvm",
    "load_libsvm_split", "shard", "shard_summary", "stdlib_text", "synthetic_images",
    "synthetic_rcv1", "synthetic_svm", "text_files",
]


# ------------------------------------------------------------------------------------------
# Containers
# ------------------------------------------------------------------------------------------

#: dense float32, or a scipy.sparse CSR matrix of float32
Features = Union[np.ndarray, "scipy.sparse.csr_matrix"]


def is_sparse(x: Features) -> bool:
    """Whether `x` is a scipy.sparse matrix (rows are taken with x[index])."""
    # no sparse matrix exists before scipy.sparse was imported
    module = sys.modules.get("scipy.sparse")
    return module is not None and module.issparse(x)


@dataclass(frozen=True, eq=False)
class Dataset:
    """A train/test split: features (dense float32 or CSR) and int64 labels 0..n_classes-1;
    or, for a language model (stdlib_text), windows of bytes (uint8, (n, context)) and
    the bytes that follow each position (uint8, (n, context)), n_classes the 256 bytes.

    ``shape`` is the shape of one example, e.g. ``(n_features,)``, ``(1, 8, 8)`` or
    ``(context,)``.
    The training part may be one shard of a larger set: ``shard`` is (rank, size) and
    ``train_rows_total`` the rows of all shards together (None while unknown to a rank
    alone: a LIBSVM file read by byte ranges, until conform()).  ``label_values`` are the
    raw labels a LIBSVM reader saw (conform() agrees the ranks on them), else None.
    """

    x_train: Features
    y_train: np.ndarray
    x_test: Features
    y_test: np.ndarray
    n_classes: int
    name: str
    shape: tuple
    shard: tuple = (0, 1)
    train_rows_total: Optional[int] = None
    label_values: Optional[tuple] = None
    #: what the data is, for the run's summary (stdlib_text: its files, bytes, digest)
    about: Optional[dict] = None

    def __post_init__(self):
        for part in ("train", "test"):
            x, y = getattr(self, f"x_{part}"), getattr(self, f"y_{part}")
            if x.shape[0] != len(y):
                raise ConfigError(f"dataset {self.name}: x_{part} has {x.shape[0]} rows but "
                                  f"y_{part} has {len(y)} labels; pass one label per row")
        if self.train_rows_total is None and tuple(self.shard) == (0, 1):
            object.__setattr__(self, "train_rows_total", len(self.y_train))

    @property
    def n_features(self) -> int:
        """The number of features of one example (the product of ``shape``)."""
        return int(np.prod(self.shape))


# ------------------------------------------------------------------------------------------
# LIBSVM / SVMlight files
# ------------------------------------------------------------------------------------------

_OPENERS = {".gz": gzip.open, ".bz2": bz2.open, ".xz": lzma.open}
# Lines per parse when a file failed and its first bad line is looked for: bounds the
# memory of that search.
_CHUNK_LINES = 20000
_FORMAT = "expected 'label index:value ...' with indices ascending from 1"


def _compressed(path: str) -> bool:
    """Whether the file is read through a decompressor (no byte ranges then)."""
    return os.path.splitext(path)[1].lower() in _OPENERS


def _open_binary(path: str):
    """Open a plain, .gz, .bz2 or .xz file for reading bytes."""
    opener = _OPENERS.get(os.path.splitext(path)[1].lower(), open)
    try:
        return opener(path, "rb")
    except OSError as exc:
        raise ConfigError(f"cannot open LIBSVM file {path}: {exc.strerror}; check the path")\
            from exc


def _reader():
    """scikit-learn's datasets module (the train extra), or MissingExtra."""
    return require("sklearn.datasets", "train", "reading LIBSVM files")


def _parse(handle) -> tuple:
    """scikit-learn's C parser: (CSR float32, float64 labels), indices 1-based, qid
    ignored; ValueError on a malformed line, OverflowError on an index >= 2**31 (the
    parser keeps indices in a C int)."""
    return _reader().load_svmlight_file(handle, dtype=np.float32, zero_based=False)


def _line_start(handle, offset: int) -> int:
    """The first line start at or after byte ``offset`` of a plain file: a line starts
    at 0 or after a newline (so CRLF lines too)."""
    if offset == 0:
        return 0
    handle.seek(offset - 1)
    handle.readline()           # to the end of the line that holds byte offset - 1
    return handle.tell()


def _byte_span(path: str, rank: int, size: int) -> tuple:
    """(start, end) bytes of ``rank``'s lines of a plain file of S bytes: the lines whose
    first byte lies in [rank*S//size, (rank+1)*S//size)."""
    total = os.path.getsize(path)
    with _open_binary(path) as handle:
        return tuple(_line_start(handle, total * r // size) for r in (rank, rank + 1))


def _read_span(path: str, span: tuple) -> bytes:
    """The bytes [start, end) of a plain file."""
    with _open_binary(path) as handle:
        handle.seek(span[0])
        return handle.read(span[1] - span[0])


def _data_lines(path: str, span: tuple | None = None):
    """(line number, line) of every line that holds an example (not blank, not only a
    comment), as the parser counts them; only the lines that start in byte span
    [start, end) if one is given, still numbered from the top of the file."""
    with _open_binary(path) as handle:
        first, position, end = 1, 0, None
        if span is not None:
            position, end = span
            while handle.tell() < position:     # count the lines before the span
                chunk = handle.read(min(1 << 20, position - handle.tell()))
                if not chunk:
                    break
                first += chunk.count(b"\n")
        for lineno, line in enumerate(handle, first):
            if end is not None and position >= end:
                return
            position += len(line)
            if line.split(b"#", 1)[0].strip():
                yield lineno, line


def _line_of_row(path: str, row: int, span: tuple | None = None) -> int:
    """The line number of example `row` (0-based) of the file (or of its byte span)."""
    for r, (lineno, _) in enumerate(_data_lines(path, span)):
        if r == row:
            return lineno
    raise AssertionError(f"{path} has no example {row}")


def _first_bad_line(path: str, span: tuple | None = None) -> tuple:
    """(line number, parser message) of the first line the parser refuses, or None: the
    file (or its byte span) is parsed _CHUNK_LINES lines at a time, the failing chunk
    halved down to one."""
    def fails(lines):
        try:
            _parse(io.BytesIO(b"".join(line for _, line in lines)))
        except OverflowError:
            return "a feature index is 2**31 or more, beyond scikit-learn's reader"
        except ValueError as exc:
            return str(exc)
        return None

    chunk = []
    for item in _data_lines(path, span):
        chunk.append(item)
        if len(chunk) == _CHUNK_LINES:
            if fails(chunk):
                break
            chunk = []
    if not chunk or not fails(chunk):
        return None
    while len(chunk) > 1:
        half = chunk[:len(chunk) // 2]
        chunk = half if fails(half) else chunk[len(chunk) // 2:]
    return chunk[0][0], fails(chunk)


def _malformed(path: str, lineno: int, why: str) -> ConfigError:
    """The error for a bad line: names the file and the line."""
    return ConfigError(f"{path}, line {lineno}: {why}; {_FORMAT} (fix or remove the line)")


def _check_finite(path: str, x, labels: np.ndarray, span: tuple | None) -> None:
    """Labels and values must be finite numbers (the parser reads nan and inf)."""
    bad_rows = np.flatnonzero(~np.isfinite(labels))
    if len(bad_rows):
        raise _malformed(path, _line_of_row(path, int(bad_rows[0]), span),
                         "the label is not finite")
    bad = np.flatnonzero(~np.isfinite(x.data))
    if len(bad):
        row = int(np.searchsorted(x.indptr, bad[0], side="right")) - 1
        raise _malformed(path, _line_of_row(path, row, span), "a feature value is not finite")


def _read_libsvm(path: str, n_features: int | None, span: tuple | None = None) -> tuple:
    """(CSR matrix, raw float labels) of a LIBSVM file, or of the lines starting in byte
    span [start, end) of a plain one; columns = n_features or the largest index."""
    if n_features is not None and n_features < 1:
        raise ConfigError(f"n_features={n_features}: pass a positive number of columns")
    _reader()           # a missing extra is its own one-line error, not a bad line 1
    try:
        if span is None:
            with _open_binary(path) as handle:
                x, labels = _parse(handle)
        else:
            x, labels = _parse(io.BytesIO(_read_span(path, span)))
    except (ValueError, OverflowError) as exc:
        bad = _first_bad_line(path, span)
        if bad is None:
            raise ConfigError(f"cannot parse LIBSVM file {path}: {exc}; {_FORMAT}") from None
        raise _malformed(path, bad[0], bad[1].rstrip(".")) from None
    except (OSError, EOFError, lzma.LZMAError, zlib.error) as exc:  # a corrupt archive
        raise ConfigError(f"cannot read LIBSVM file {path}: {exc}; check or re-download "
                          f"the file") from exc
    if x.shape[0] == 0:
        if span is not None:
            raise ConfigError(f"LIBSVM file {path} has no examples in bytes {span[0]}-"
                              f"{span[1]}, this rank's part of it; use fewer ranks")
        raise ConfigError(f"LIBSVM file {path} has no examples; pass a non-empty file")
    _check_finite(path, x, labels, span)
    if n_features is None:
        return x, labels
    too_big = np.flatnonzero(x.indices >= n_features)
    if len(too_big):
        row = int(np.searchsorted(x.indptr, too_big[0], side="right")) - 1
        raise ConfigError(f"{path}, line {_line_of_row(path, row, span)}: feature index "
                          f"{x.indices[too_big[0]] + 1} > n_features={n_features}; raise "
                          f"n_features or leave it unset")
    return _with_columns(x, n_features), labels


def _binary_labels(raw: np.ndarray, what: str) -> np.ndarray:
    """Map a binary problem's labels to 0/1: {-1,+1} and {0,1} keep their sign's meaning,
    any other pair (e.g. {1,2}) maps its smaller label to 0."""
    distinct = np.unique(raw)
    if len(distinct) > 2:
        raise ConfigError(f"{what} has {len(distinct)} distinct labels but the SVM demo is "
                          f"binary: pass a two-class LIBSVM file")
    # A one-class file (e.g. a small test file) stays consistent with its two-class
    # companion when its labels follow the {-1,+1} or {0,1} conventions.
    found = set(distinct.tolist())
    if found <= {-1.0, 1.0} or found <= {0.0, 1.0}:
        return (raw > 0).astype(np.int64)
    return (raw > distinct[0]).astype(np.int64)


def load_libsvm(path: str, n_features: int | None = None) -> tuple:
    """Read a binary-classification LIBSVM/SVMlight file (plain, .gz, .bz2 or .xz) with
    scikit-learn's parser.

    Returns ``(scipy.sparse.csr_matrix float32 features, int64 labels in {0, 1})``.
    Indices in the file are 1-based and ascending within a line; ``n_features`` sets the
    number of columns (default: the largest index seen).
    """
    x, raw = _read_libsvm(os.fspath(path), n_features)
    return x, _binary_labels(raw, os.fspath(path))


def _dataset_name(path: str) -> str:
    """The file name without directories and compression suffix."""
    base = os.path.basename(path)
    stem, ext = os.path.splitext(base)
    return stem if ext.lower() in _OPENERS else base


def _with_columns(x, n_cols: int):
    """The same rows with ``n_cols`` columns (n_cols >= x.shape[1])."""
    return _sparse().csr_matrix((x.data, x.indices, x.indptr), shape=(x.shape[0], n_cols))


def _shuffled_split(n: int, test_fraction: float, seed: int) -> tuple:
    """(train indices, test indices) of a deterministic shuffled split."""
    if not 0.0 < test_fraction < 1.0:
        raise ConfigError(f"test_fraction={test_fraction}: pass a fraction between 0 and 1")
    n_test = round(n * test_fraction)
    if not 0 < n_test < n:
        raise ConfigError(f"test_fraction={test_fraction} of {n} examples leaves an empty "
                          f"train or test set: pass a test file or change test_fraction")
    perm = np.random.default_rng(_seed(seed)).permutation(n)
    return perm[n_test:], perm[:n_test]


def load_libsvm_split(train_path: str, test_path: str | None = None,
                      test_fraction: float = 0.2, seed: int = 0,
                      n_features: int | None = None, rank: int = 0,
                      size: int = 1) -> Dataset:
    """A LIBSVM binary problem as a Dataset: the given test file, else a shuffled split;
    the training part is ``rank``'s shard of ``size``.

    With a test file and a plain (uncompressed) training file, rank r parses only the
    lines whose first byte lies in [r*S//size, (r+1)*S//size) of the file's S bytes, so
    the shards, in rank order, are the file's rows in order.  A rank alone then knows
    neither the file's widest row nor (for labels other than {-1,+1} and {0,1}) both of
    its labels: pass ``n_features``, or let the ranks agree with conform() (the trainer
    does).  Without a test file the hold-out is a shuffle of all the rows, so every rank
    reads the whole file and keeps its strided shard(), as compressed files do.
    """
    _check_rank(rank, size)
    train_path = os.fspath(train_path)
    by_bytes = size > 1 and test_path is not None and not _compressed(train_path)
    span = _byte_span(train_path, rank, size) if by_bytes else None
    x_train, raw_train = _read_libsvm(train_path, n_features, span)
    if test_path is None:
        labels = _binary_labels(raw_train, train_path)
        train, test = _shuffled_split(x_train.shape[0], test_fraction, seed)
        x_test, y_test = x_train[test], labels[test]
        x_train, y_train = x_train[train], labels[train]
        raw = raw_train
    else:
        test_path = os.fspath(test_path)
        x_test, raw_test = _read_libsvm(test_path, n_features)
        # Map the labels of both files together so a label means the same class in each.
        raw = np.concatenate([raw_train, raw_test])
        labels = _binary_labels(raw, f"{train_path} with {test_path}")
        y_train, y_test = labels[:x_train.shape[0]], labels[x_train.shape[0]:]
        n_cols = max(x_train.shape[1], x_test.shape[1])
        x_train, x_test = _with_columns(x_train, n_cols), _with_columns(x_test, n_cols)
    total = None if by_bytes else len(y_train)
    if size > 1 and not by_bytes:
        mine = shard(len(y_train), rank, size)
        x_train, y_train = x_train[mine], y_train[mine]
    return Dataset(x_train, y_train, x_test, y_test, n_classes=2,
                   name=_dataset_name(train_path), shape=(x_train.shape[1],),
                   shard=(rank, size), train_rows_total=total,
                   label_values=tuple(np.unique(raw).tolist()))


# ------------------------------------------------------------------------------------------
# Synthetic sparse binary problems (RCV1-like), generated block by block
# ------------------------------------------------------------------------------------------

def _seed(seed) -> int:
    """A seed must be a non-negative integer (default_rng's requirement)."""
    if isinstance(seed, (bool, np.bool_)) or not isinstance(seed, (int, np.integer)) \
            or seed < 0:
        raise ConfigError(f"seed={seed!r}: pass a non-negative integer")
    return int(seed)


def _check_positive(**values):
    """Sizes must be integers (TypeError: load() words it as a bad option value) of at
    least 1."""
    for key, value in values.items():
        if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, np.integer)):
            raise TypeError(f"{key} must be an integer, got {value!r}")
        if value < 1:
            raise ConfigError(f"{key}={value}: pass a positive number")


def _check_rank(rank, size) -> None:
    """A shard is named by 0 <= rank < size."""
    if isinstance(size, bool) or not isinstance(size, (int, np.integer)) or size < 1 \
            or isinstance(rank, bool) or not isinstance(rank, (int, np.integer)) \
            or not 0 <= rank < size:
        raise ConfigError(f"rank {rank} of {size}: pass 0 <= rank < size")


def _row_range(n: int, rank: int, size: int) -> tuple:
    """(first, end) of ``rank``'s contiguous rows: sizes differ by at most one."""
    _check_rank(rank, size)
    if n < size:
        raise ConfigError(f"{n} examples cannot be shared by {size} ranks: use a bigger "
                          f"dataset or fewer ranks")
    return n * rank // size, n * (rank + 1) // size


#: rows per block: a rank generates the blocks its rows lie in, each from a generator of
#: its own, so a row does not depend on how many ranks share the problem
_BLOCK_ROWS = 4096
#: rows whose median score is the label threshold (odd: the median is one row's score);
#: a sample of its own stream, the same on every rank, so no rank needs all the scores
_CALIBRATION_ROWS = 8191
# A stream's generator is default_rng([seed, _TAG, stream, block]).  Four words: the
# batches' [seed, rank, epoch] is padded with a zero word by SeedSequence, so it could
# only meet these keys at rank _TAG.
_TAG = 0x53564D00
_HIDDEN, _CALIBRATION, _TRAIN, _TEST = 1, 2, 3, 4
# The held-out sample of stdlib_text: default_rng([seed, _TEXT_TAG]), apart from the
# split's default_rng(seed)
_TEXT_TAG = 0x54455854
_NNZ_PER_ROW = 40     # synthetic-svm's default: the 2% of its 2000 features it had


def _stream(seed: int, stream: int, block: int = 0):
    """The generator of one stream (and block) of a synthetic problem."""
    return np.random.default_rng([seed, _TAG, stream, block])


class _Vocabulary:
    """What the rows of a synthetic problem are drawn from, made from the seed alone (so
    every rank has the same): the terms' Zipf-like popularity, the hidden sparse
    Gaussian w* and the two topics' words.  O(n_features) memory.

    Most terms follow the popularity (a few frequent terms, a long tail of rare ones, as
    in text).  w* is nonzero on a fraction ``support`` of the ``vocabulary`` most
    frequent terms; rarer terms carry no signal.  Each row also has a latent topic, one
    sign of w*, and draws a share ``topic_share`` of its terms among the words of that
    sign: as in categorized news, the classes then differ in vocabulary and have a margin
    (without topics the best linear fit of synthetic-svm stays near 84% test accuracy).
    """

    def __init__(self, n_features: int, nnz_per_row: int, support: float,
                 topic_share: float, vocabulary: int, idf: bool, seed: int):
        rng = _stream(seed, _HIDDEN)
        self.n_features, self.k, self.topic_share = n_features, nnz_per_row, topic_share
        self.columns = rng.permutation(n_features)      # popularity rank -> column
        self.w_star = np.zeros(n_features)
        self.w_star[self.columns[:vocabulary]] = rng.standard_normal(vocabulary) * (
            rng.random(vocabulary) < support)
        popularity = 1.0 / (np.arange(n_features) + 10.0)
        self.cdf = np.cumsum(popularity)                # sequential: reproducible
        self.idf = None
        if idf:
            # tf-idf-like: rarer terms weigh more (idf ~ 1/sqrt(popularity), no log so
            # the values are bitwise reproducible)
            self.idf = np.empty(n_features)
            self.idf[self.columns] = 1.0 / np.sqrt(popularity * n_features)
        self.words = (np.flatnonzero(self.w_star < 0), np.flatnonzero(self.w_star > 0))

    def draw(self, rng, topic: np.ndarray) -> np.ndarray:
        """One term (column) for each entry of ``topic`` (the 0/1 topic of its row)."""
        m = len(topic)
        ranks = np.searchsorted(self.cdf, rng.random(m) * self.cdf[-1], side="right")
        cols = self.columns[np.minimum(ranks, self.n_features - 1)]  # u*cdf[-1] == cdf[-1]
        negative, positive = self.words
        if len(negative) and len(positive):  # tiny problems may lack one sign: no topics
            on_topic = rng.random(m) < self.topic_share
            word = rng.random(m)
            topic_cols = np.where(topic == 1,
                                  positive[(word * len(positive)).astype(np.int64)],
                                  negative[(word * len(negative)).astype(np.int64)])
            cols = np.where(on_topic, topic_cols, cols)
        return cols

    def rows(self, rng, n: int) -> tuple:
        """(columns, float32 values), both (n, k): k distinct terms per row, ascending,
        with positive tf-idf-like values, each row L2-normalized as in RCV1."""
        k = self.k
        topic = rng.integers(0, 2, size=n)
        cols = self.draw(rng, np.repeat(topic, k)).reshape(n, k)
        while True:
            cols.sort(axis=1)
            again = np.flatnonzero(cols[:, 1:] == cols[:, :-1])
            if not len(again):
                break
            # A term drawn twice in a row is drawn again, topic and all, so that every
            # row has exactly k terms.  Ends: a popularity draw can hit any of the
            # >= n_features - k >= k unused columns (k <= n_features / 2).
            again = again // (k - 1) * k + again % (k - 1) + 1
            cols.flat[again] = self.draw(rng, topic[again // k])
        values = 1.0 + 3.0 * rng.random((n, k))        # the term frequency
        if self.idf is not None:
            values *= self.idf[cols]
        row_ids = np.repeat(np.arange(n), k)
        norms = np.sqrt(np.bincount(row_ids, weights=(values * values).ravel(), minlength=n))
        return cols, (values / norms[:, None]).astype(np.float32)

    def scores(self, cols: np.ndarray, values: np.ndarray) -> np.ndarray:
        """x . w* of rows (columns, values), in float64 with sequential sums."""
        n = len(cols)
        return np.bincount(np.repeat(np.arange(n), self.k), minlength=n,
                           weights=(values.astype(np.float64) * self.w_star[cols]).ravel())


def _threshold(vocab: _Vocabulary, seed: int) -> float:
    """The median score of _CALIBRATION_ROWS rows of the calibration stream: the labels'
    threshold, so the classes are about balanced."""
    scores = []
    for block, first in enumerate(range(0, _CALIBRATION_ROWS, _BLOCK_ROWS)):
        rng = _stream(seed, _CALIBRATION, block)
        scores.append(vocab.scores(*vocab.rows(rng, min(_BLOCK_ROWS,
                                                         _CALIBRATION_ROWS - first))))
    scores = np.sort(np.concatenate(scores))
    return float(scores[len(scores) // 2])


def _generate(vocab: _Vocabulary, stream: int, seed: int, n: int, first: int, end: int,
              threshold: float, noise: float) -> tuple:
    """(CSR float32, int64 labels) of rows first..end-1 of a stream of n rows: only the
    blocks holding them are generated, each whole, from its own generator."""
    k, parts = vocab.k, []
    for block in range(first // _BLOCK_ROWS, -(-end // _BLOCK_ROWS)):
        start = block * _BLOCK_ROWS
        rng = _stream(seed, stream, block)
        cols, values = vocab.rows(rng, min(_BLOCK_ROWS, n - start))
        labels = (vocab.scores(cols, values) > threshold).astype(np.int64)
        labels ^= rng.random(len(labels)) < noise      # the noisy labels
        keep = slice(max(first, start) - start, min(end, start + _BLOCK_ROWS) - start)
        parts.append((cols[keep].astype(np.int32), values[keep], labels[keep]))
    m = end - first
    x = _sparse().csr_matrix((np.concatenate([p[1] for p in parts]).ravel(),
                              np.concatenate([p[0] for p in parts]).ravel(),
                              np.arange(0, m * k + 1, k, dtype=np.int64)),
                             shape=(m, vocab.n_features))
    return x, np.concatenate([p[2] for p in parts])


def _nonzeros(n_features: int, nnz_per_row, density) -> int:
    """The nonzeros per row from nnz_per_row or density (at most one of them)."""
    if nnz_per_row is not None and density is not None:
        raise ConfigError(f"nnz_per_row={nnz_per_row} and density={density}: pass one of "
                          f"them (nnz_per_row: nonzeros per row, density: their fraction "
                          f"of the features)")
    most = max(1, n_features // 2)
    if density is not None:
        if not 0.0 < density <= 0.5:
            raise ConfigError(f"density={density}: pass a fraction of non-zeros in "
                              f"(0, 0.5], or nnz_per_row")
        return min(most, max(1, round(density * n_features)))
    if nnz_per_row is None:
        return min(_NNZ_PER_ROW, most)
    _check_positive(nnz_per_row=nnz_per_row)
    if nnz_per_row > most:
        raise ConfigError(f"nnz_per_row={nnz_per_row} with n_features={n_features}: pass "
                          f"at most {most} (rows draw distinct terms among at most half "
                          f"the features) or more features")
    return int(nnz_per_row)


def _sparse_problem(name: str, n_train: int, n_test: int, n_features: int, nnz_per_row,
                    density, noise: float, topic_share: float, support: float,
                    vocabulary, idf: bool, seed: int, rank: int, size: int) -> Dataset:
    """The synthetic sparse problem of synthetic_svm and synthetic_rcv1 (see there)."""
    _check_positive(n_train=n_train, n_test=n_test, n_features=n_features)
    if n_features >= 2 ** 31:
        raise ConfigError(f"n_features={n_features}: pass fewer than 2**31 (int32 column "
                          f"indices)")
    k = _nonzeros(n_features, nnz_per_row, density)
    if vocabulary is None:
        vocabulary = n_features
    _check_positive(vocabulary=vocabulary)
    if vocabulary > n_features:
        raise ConfigError(f"vocabulary={vocabulary} > n_features={n_features}: pass at most "
                          f"the number of features")
    for key, value, low, high, what in (
            ("noise", noise, 0.0, 0.5, "a label-flip fraction in [0, 0.5)"),
            ("topic_share", topic_share, 0.0, 1.0, "a fraction of topic terms in [0, 1)")):
        if not low <= value < high:
            raise ConfigError(f"{key}={value}: pass {what}")
    if not 0.0 < support <= 1.0:
        raise ConfigError(f"support={support}: pass the fraction of the vocabulary with "
                          f"signal in (0, 1]")
    if not isinstance(idf, (bool, np.bool_)):
        raise ConfigError(f"idf={idf!r}: pass true or false")
    first, end = _row_range(n_train, rank, size)
    seed = _seed(seed)
    vocab = _Vocabulary(n_features, k, support, topic_share, int(vocabulary), bool(idf),
                        seed)
    threshold = _threshold(vocab, seed)
    x_train, y_train = _generate(vocab, _TRAIN, seed, n_train, first, end, threshold, noise)
    x_test, y_test = _generate(vocab, _TEST, seed, n_test, 0, n_test, threshold, noise)
    return Dataset(x_train, y_train, x_test, y_test, n_classes=2, name=name,
                   shape=(n_features,), shard=(rank, size), train_rows_total=n_train)


def synthetic_svm(n_train: int = 16384, n_test: int = 4096, n_features: int = 2000,
                  nnz_per_row: int | None = None, density: float | None = None,
                  noise: float = 0.05, topic_share: float = 0.15, support: float = 0.25,
                  vocabulary: int | None = None, idf: bool = True, seed: int = 0,
                  rank: int = 0, size: int = 1) -> Dataset:
    """A deterministic RCV1-like sparse binary problem that a linear model learns well;
    its training part is ``rank``'s shard of ``size``: rows
    ``n_train*rank//size .. n_train*(rank+1)//size - 1`` (the whole set at size 1).

    Every row has exactly ``nnz_per_row`` (default 40, at most n_features/2) positive
    values, L2-normalized: a term frequency times, if ``idf``, an idf-like weight that
    grows with the term's rarity; ``density`` (a fraction of n_features) may size the
    rows instead.  A share ``topic_share`` of each row's terms comes from its latent
    topic's words (see _Vocabulary).  The label is ``x . w* > t`` for a hidden Gaussian
    ``w*`` nonzero on a fraction ``support`` of the ``vocabulary`` (default: all) most
    frequent terms, ``t`` the median score of a calibration sample (so the classes are
    about balanced), then each label is flipped with probability ``noise``.

    Rows are generated in blocks of _BLOCK_ROWS from generators of (seed, block), so the
    global set is the same for any ``size``, and a rank's memory and time are
    O(its shard's nonzeros + n_features); each rank generates the whole test set.
    """
    return _sparse_problem("synthetic-svm", n_train, n_test, n_features, nnz_per_row,
                           density, noise, topic_share, support, vocabulary, idf, seed,
                           rank, size)


def synthetic_rcv1(n_train: int = 262144, n_test: int = 4096, n_features: int = 1000000,
                   nnz_per_row: int | None = 76, density: float | None = None,
                   noise: float = 0.05, topic_share: float = 0.12, support: float = 1.0,
                   vocabulary: int | None = 2000, idf: bool = False, seed: int = 0,
                   rank: int = 0, size: int = 1) -> Dataset:
    """synthetic_svm at RCV1's scale: a million features (a 4 MB float32 linear model),
    76 nonzeros per row as RCV1 averages; the workload where communication matters.

    Its signal lies in the 2000 most frequent terms, the long tail of rare terms (about
    half of each row) is noise, and values are term frequencies (an idf over a million
    terms would give the rare tail most of each row's norm).  The frequencies of the
    signal terms put many of their weights where the L2 term (lambda 1e-4) and the data
    weigh alike, so with the demo's SGD test accuracy keeps rising for thousands of
    iterations: 8 ranks of batch 32 at lr 4 measured about 83% at iteration 250, 88% at
    2000 and 89% at 4000 (asapmpi.train.config.DATA_DEFAULTS has its lr and target).
    """
    return _sparse_problem("synthetic-rcv1", n_train, n_test, n_features, nnz_per_row,
                           density, noise, topic_share, support, vocabulary, idf, seed,
                           rank, size)


# ------------------------------------------------------------------------------------------
# Images: scikit-learn's digits, or an offline synthetic stand-in
# ------------------------------------------------------------------------------------------

def _stratified_split(y: np.ndarray, test_fraction: float, seed: int) -> tuple:
    """(train, test) indices: each class split in proportion, then both orders shuffled."""
    if not 0.0 < test_fraction < 1.0:
        raise ConfigError(f"test_fraction={test_fraction}: pass a fraction between 0 and 1")
    rng = np.random.default_rng(_seed(seed))
    train, test = [], []
    for label in np.unique(y):
        members = rng.permutation(np.flatnonzero(y == label))
        n_test = round(len(members) * test_fraction)
        test.append(members[:n_test])
        train.append(members[n_test:])
    train, test = np.concatenate(train), np.concatenate(test)
    return rng.permutation(train), rng.permutation(test)


def digits(test_fraction: float = 0.25, seed: int = 0) -> Dataset:
    """scikit-learn's bundled 8x8 handwritten digits (1797 images, no download), scaled to
    [0, 1], shape (1, 8, 8), with a deterministic stratified shuffled split."""
    bunch = require("sklearn.datasets", "train", "the digits dataset",
                    otherwise="or pass --data synthetic-images").load_digits()
    x = (np.asarray(bunch.data, dtype=np.float32) / np.float32(16.0)).reshape(-1, 1, 8, 8)
    y = np.asarray(bunch.target, dtype=np.int64)
    train, test = _stratified_split(y, test_fraction, seed)
    return Dataset(x[train], y[train], x[test], y[test], n_classes=10, name="digits",
                   shape=(1, 8, 8))


# Hand-drawn 8x8 templates of the ten digits ('#' = stroke).
GLYPHS = (
    ("........", "..####..", ".#....#.", ".#....#.", ".#....#.", ".#....#.", "..####..",
     "........"),
    ("........", "...##...", "..#.#...", "....#...", "....#...", "....#...", "..#####.",
     "........"),
    ("........", "..####..", ".#....#.", "......#.", "....##..", "..##....", ".######.",
     "........"),
    ("........", ".#####..", "......#.", "..####..", "......#.", "......#.", ".#####..",
     "........"),
    ("........", "....##..", "...#.#..", "..#..#..", ".######.", ".....#..", ".....#..",
     "........"),
    ("........", ".######.", ".#......", ".#####..", "......#.", "......#.", ".#####..",
     "........"),
    ("........", "..####..", ".#......", ".#####..", ".#....#.", ".#....#.", "..####..",
     "........"),
    ("........", ".######.", "......#.", ".....#..", "....#...", "...#....", "...#....",
     "........"),
    ("........", "..####..", ".#....#.", "..####..", ".#....#.", ".#....#.", "..####..",
     "........"),
    ("........", "..####..", ".#....#.", ".#....#.", "..#####.", "......#.", "..####..",
     "........"),
)


def glyph_templates() -> np.ndarray:
    """The ten digit templates as a float32 array (10, 8, 8) of 0s and 1s."""
    return np.array([[[c == "#" for c in row] for row in glyph] for glyph in GLYPHS],
                    dtype=np.float32)


def _glyph_images(rng, labels: np.ndarray) -> np.ndarray:
    """One noisy, shifted, random-intensity rendering of each label's template."""
    n = len(labels)
    padded = np.pad(glyph_templates(), ((0, 0), (1, 1), (1, 1)))  # shifts bring in zeros
    dy, dx = rng.integers(-1, 2, size=(2, n))
    ii = (1 - dy)[:, None] + np.arange(8)  # (n, 8) source rows of each output row
    jj = (1 - dx)[:, None] + np.arange(8)
    images = padded[labels[:, None, None], ii[:, :, None], jj[:, None, :]]
    intensity = 0.5 + 0.5 * rng.random((n, 1, 1))
    images = images * intensity + 0.2 * rng.standard_normal((n, 8, 8))
    return np.clip(images, 0.0, 1.0).astype(np.float32).reshape(n, 1, 8, 8)


def synthetic_images(n_train: int = 4096, n_test: int = 1024, seed: int = 0) -> Dataset:
    """A deterministic offline stand-in for digits: 10 classes of 8x8 glyphs, each example
    a template shifted by -1..1 pixel, with random stroke intensity and Gaussian noise,
    clipped to [0, 1], shape (1, 8, 8)."""
    _check_positive(n_train=n_train, n_test=n_test)
    rng = np.random.default_rng(_seed(seed))
    # Balanced classes in both splits.
    labels = np.concatenate([rng.permutation(np.arange(n_train, dtype=np.int64) % 10),
                             rng.permutation(np.arange(n_test, dtype=np.int64) % 10)])
    x = _glyph_images(rng, labels)
    return Dataset(x[:n_train], labels[:n_train], x[n_train:], labels[n_train:],
                   n_classes=10, name="synthetic-images", shape=(1, 8, 8))


# ------------------------------------------------------------------------------------------
# Text: the interpreter's own standard library sources, bytes as characters
# ------------------------------------------------------------------------------------------

#: folders of the standard library's tree that hold no standard library (installed
#: packages, in some layouts inside it) or no sources
_NOT_STDLIB = frozenset({"site-packages", "dist-packages", "__pycache__"})
#: the byte values: the language model's vocabulary (no vocabulary file)
VOCABULARY = 256


def stdlib_root() -> str:
    """The folder of the running interpreter's standard library sources."""
    import sysconfig

    return sysconfig.get_paths()["stdlib"]


def _missing_sources(root: str) -> ConfigError:
    """The refusal when `root` holds no .py files: what to install, or pass instead."""
    version = f"{sys.version_info.major}.{sys.version_info.minor}"
    return ConfigError(
        f"no Python sources (.py files) under {root}: this Python's standard library "
        f"sources were stripped; install them (Debian/Ubuntu: apt install "
        f"libpython{version}-stdlib; or a full CPython from python.org, pyenv, uv or "
        f"conda) or pass --data-option root=DIR, a folder of .py files")


def text_files(root: str) -> list:
    """The .py files under `root` as relative POSIX paths in byte order (the same list
    on every machine with the same tree), leaving out installed packages
    (site-packages, dist-packages) and caches; ConfigError when there is none."""
    root = os.fspath(root)
    found = []
    for folder, subfolders, files in os.walk(root):
        # pruned in place (os.walk then skips them); the walk's own order does not
        # matter: the list is sorted below
        subfolders[:] = [d for d in subfolders if d not in _NOT_STDLIB]
        found += [os.path.relpath(os.path.join(folder, f), root).replace(os.sep, "/")
                  for f in files if f.endswith(".py")]
    if not found:
        raise _missing_sources(root)
    return sorted(found, key=lambda rel: rel.encode("utf-8", "surrogateescape"))


def _read_corpus(root: str, files: list, max_bytes: int) -> list:
    """[(relative path, bytes)] of the files in order until `max_bytes` in all: whole
    files, the last one cut at the cap."""
    out, total = [], 0
    for rel in files:
        if total >= max_bytes:
            break
        try:
            with open(os.path.join(root, rel), "rb") as handle:
                content = handle.read(max_bytes - total)
        except OSError as exc:
            raise ConfigError(f"cannot read {os.path.join(root, rel)}: {exc.strerror}; "
                              f"check the folder's permissions or pass --data-option "
                              f"root=DIR") from exc
        if content:
            out.append((rel, content))
            total += len(content)
    return out


def _windows(text: bytes, context: int) -> tuple:
    """(inputs, next bytes): the text cut into windows of `context` bytes one after
    another, each paired with the same window shifted by one byte (so every byte but
    the first is predicted once), as uint8 arrays (n, context)."""
    n = (len(text) - 1) // context
    data = np.frombuffer(text, dtype=np.uint8)
    return (data[:n * context].reshape(n, context),
            data[1:n * context + 1].reshape(n, context))


def stdlib_text(context: int = 64, max_bytes: int = 4 << 20, heldout: float = 0.1,
                eval_windows: int = 128, seed: int = 0, root: Optional[str] = None,
                rank: int = 0, size: int = 1) -> Dataset:
    """A character-level language modelling corpus that ships with the interpreter: the
    .py files of its standard library (``sysconfig.get_paths()["stdlib"]``, or of the
    folder `root`), read as bytes (the vocabulary is the 256 byte values: no vocabulary
    file, nothing to download).

    The corpus is the files in byte order of their relative paths (text_files: no
    site-packages), whole, until `max_bytes` (default 4 MiB; the last file cut there).
    A fraction `heldout` of those files, drawn with `seed` (a data option, not the run's
    --seed, so every run of a study evaluates on the same text), is held out: training
    and held-out text never share a file.  Each part is cut into windows of `context`
    bytes (x_train (n, context) uint8, y_train the next bytes, uint8); the held-out
    sample is `eval_windows` of the held-out windows drawn with `seed`, the same for
    every rank and run.  The training windows are sharded by rank (strided, disjoint).

    Which corpus: the files of one Python release (3.11.7, 3.12.3, ...) as installed;
    minor releases add and remove modules (3.11 and 3.12 differ from the first files
    on), patch releases change a few files, and distributions may patch some (Debian's
    sysconfig), so compare runs by the ``about`` digest (sha256 of the corpus), which
    the training summary reports.  Without the sources (stripped by some
    distributions) it refuses in one line, naming what to install.
    """
    _check_rank(rank, size)
    _check_positive(context=context, max_bytes=max_bytes, eval_windows=eval_windows)
    if context < 2:
        raise ConfigError(f"context={context}: pass at least 2 characters")
    if not 0.0 < heldout < 1.0:
        raise ConfigError(f"heldout={heldout}: pass a fraction of the files between 0 "
                          f"and 1")
    root = os.path.abspath(os.fspath(root) if root is not None else stdlib_root())
    if not os.path.isdir(root):
        raise _missing_sources(root)
    corpus = _read_corpus(root, text_files(root), max_bytes)
    n_held = round(len(corpus) * heldout)
    if not 0 < n_held < len(corpus):
        raise ConfigError(f"heldout={heldout} of the corpus's {len(corpus)} files leaves "
                          f"no training or no held-out file; change heldout or raise "
                          f"max_bytes")
    held = set(np.random.default_rng(_seed(seed)).permutation(len(corpus))[:n_held]
               .tolist())
    train_text = b"".join(c for i, (_, c) in enumerate(corpus) if i not in held)
    test_text = b"".join(c for i, (_, c) in enumerate(corpus) if i in held)
    x_train, y_train = _windows(train_text, context)
    x_test, y_test = _windows(test_text, context)
    if len(x_test) == 0:
        raise ConfigError(f"the held-out files hold {len(test_text)} bytes, less than one "
                          f"window of context={context}; raise heldout or max_bytes")
    pick = np.sort(np.random.default_rng([_seed(seed), _TEXT_TAG]).permutation(
        len(x_test))[:eval_windows])
    digest = hashlib.sha256(b"".join(c for _, c in corpus)).hexdigest()
    about = {"root": root, "python": platform.python_version(), "files": len(corpus),
             "heldout_files": n_held, "bytes": len(train_text) + len(test_text),
             "train_bytes": len(train_text), "heldout_bytes": len(test_text),
             "eval_chars": len(pick) * context, "sha256": digest}
    ds = Dataset(x_train, y_train, x_test[pick], y_test[pick], n_classes=VOCABULARY,
                 name="stdlib", shape=(context,), about=about)
    return ds if size == 1 else _strided(ds, rank, size)


# ------------------------------------------------------------------------------------------
# Sharding and minibatches
# ------------------------------------------------------------------------------------------

def shard(n: int, rank: int, size: int) -> np.ndarray:
    """The example indices of ``rank``'s shard: rank, rank + size, ... (strided, so every
    example is in exactly one shard and shard sizes differ by at most one)."""
    if size < 1 or not 0 <= rank < size:
        raise ConfigError(f"rank {rank} of {size}: pass 0 <= rank < size")
    if n < size:
        raise ConfigError(f"{n} examples cannot be shared by {size} ranks: use a bigger "
                          f"dataset or fewer ranks")
    return np.arange(rank, n, size, dtype=np.int64)


_PERMUTATIONS: dict = {}  # (seed, rank, shard length, epoch) -> read-only permutation
_PERMUTATIONS_KEPT = 4
_PERMUTATIONS_LOCK = threading.Lock()  # a data-loading thread may share the cache


def _epoch_permutation(seed: int, rank: int, m: int, epoch: int) -> np.ndarray:
    """The permutation of positions 0..m-1 used in ``epoch`` (cached, read-only)."""
    key = (seed, rank, m, epoch)
    with _PERMUTATIONS_LOCK:
        perm = _PERMUTATIONS.get(key)
    if perm is None:
        perm = np.random.default_rng([seed, rank, epoch]).permutation(m)
        perm.setflags(write=False)  # shared by later calls: nobody may shuffle it in place
        with _PERMUTATIONS_LOCK:
            if len(_PERMUTATIONS) >= _PERMUTATIONS_KEPT:
                _PERMUTATIONS.pop(next(iter(_PERMUTATIONS)))  # oldest first
            _PERMUTATIONS[key] = perm
    return perm


def batch_indices(shard_indices: np.ndarray, batch_size: int, iteration: int, seed: int,
                  rank: int) -> np.ndarray:
    """The minibatch (example indices) of 0-based ``iteration``: a pure function of its
    arguments.

    Iteration i takes the examples at positions i*batch_size .. (i+1)*batch_size - 1 of the
    concatenation of per-epoch permutations of the shard (epoch e drawn from
    ``default_rng([seed, rank, e])``), so batches wrap into the next epoch when the shard
    size is not a multiple of batch_size and every batch has exactly batch_size examples.
    """
    if iteration < 0:
        raise ConfigError(f"iteration={iteration}: pass a non-negative iteration")
    return batch_span(shard_indices, int(iteration) * int(batch_size), batch_size, seed,
                      rank)


def batch_span(shard_indices: np.ndarray, start: int, size: int, seed: int,
               rank: int) -> np.ndarray:
    """The ``size`` examples at positions start .. start+size-1 of the same concatenation
    of per-epoch permutations as batch_indices (a pure function of its arguments).

    A rank whose batch size changes from step to step (load balancing) passes the
    number of examples it drew before (its cursor) as ``start``: it still sweeps its
    shard epoch by epoch, each example once per epoch, and the batch is determined by
    (seed, rank, cursor, size); with a fixed size the cursor is iteration * size and the
    batch that of batch_indices.  A batch never exceeds the shard (1 <= size <= shard).
    """
    shard_indices = np.asarray(shard_indices)
    m = len(shard_indices)
    if not 1 <= size <= m:
        raise ConfigError(f"batch_size={size} with a shard of {m} examples: pass "
                          f"1 <= batch_size <= shard size (or use fewer ranks)")
    if start < 0:
        raise ConfigError(f"start={start}: pass a non-negative position")
    if rank < 0:
        raise ConfigError(f"rank={rank}: pass the non-negative rank of this process")
    seed, rank = _seed(seed), int(rank)
    start = int(start)  # Python ints: no overflow
    end = start + int(size)
    epoch = start // m
    offset = start - epoch * m
    head = _epoch_permutation(seed, rank, m, epoch)[offset:min(end - epoch * m, m)]
    if end <= (epoch + 1) * m:
        return shard_indices[head]
    tail = _epoch_permutation(seed, rank, m, epoch + 1)[:end - (epoch + 1) * m]
    return shard_indices[np.concatenate([head, tail])]


# ------------------------------------------------------------------------------------------
# Agreement of the ranks' shards
# ------------------------------------------------------------------------------------------

def shard_summary(ds: Dataset) -> dict:
    """What the ranks sharing a data set must agree on, small enough to allgather: the
    shape of an example, the raw labels seen (LIBSVM) and the training rows."""
    return {"shape": tuple(ds.shape), "labels": ds.label_values, "rows": len(ds.y_train)}


def conform(ds: Dataset, summaries: list) -> Dataset:
    """This rank's shard made consistent with every rank's (``summaries``: each rank's
    shard_summary(), in rank order), as if all had read the whole file.

    A rank's byte range of a LIBSVM file may lack the file's widest row, so every rank
    takes the most columns any rank saw; it may also lack one of two labels that follow
    neither {-1,+1} nor {0,1} (whose mapping to 0/1 depends on both), so the labels are
    mapped again by the union of all ranks'.  ``train_rows_total`` becomes the sum of
    the shards.  Other data sets come out unchanged but for that total.
    """
    changes = {"train_rows_total": sum(int(s["rows"]) for s in summaries)}
    shapes = sorted({tuple(s["shape"]) for s in summaries})
    if len(shapes) > 1:
        if any(len(s) != 1 for s in shapes):
            raise ConfigError(f"dataset {ds.name}: the ranks' examples have different "
                              f"shapes {shapes}; give every rank the same data")
        n_cols = shapes[-1][0]
        changes.update(x_train=_with_columns(ds.x_train, n_cols),
                       x_test=_with_columns(ds.x_test, n_cols), shape=(n_cols,))
    if ds.label_values is not None:
        union = sorted(set().union(*(s["labels"] or () for s in summaries)))
        merged = dict(zip(union, _binary_labels(np.array(union),
                                                f"{ds.name} (all ranks' parts)").tolist()))
        local = sorted(ds.label_values)
        # Both mappings are thresholds: with two raw labels class c is local[c], with
        # one every example has it.
        raw_of = dict(zip(_binary_labels(np.array(local), ds.name).tolist(), local))
        remap = np.array([merged[raw_of[c]] if c in raw_of else c for c in (0, 1)])
        if not np.array_equal(remap, [0, 1]):
            changes.update(y_train=remap[ds.y_train], y_test=remap[ds.y_test])
        changes["label_values"] = tuple(union)
    return replace(ds, **changes)


# ------------------------------------------------------------------------------------------
# Dispatch
# ------------------------------------------------------------------------------------------

_LOADERS: dict = {
    "synthetic-svm": synthetic_svm,
    "digits": digits,
    "synthetic-images": synthetic_images,
    "synthetic-rcv1": synthetic_rcv1,
    "stdlib": stdlib_text,
}
#: what the loaders take that is not an option of the data set
_SHARD_ARGUMENTS = ("rank", "size")


def _call(loader: Callable, what: str, options: dict, **fixed) -> Dataset:
    """Call a loader, turning an unknown option into a ConfigError that lists the valid."""
    allowed = [p for p in inspect.signature(loader).parameters
               if p not in fixed and p not in _SHARD_ARGUMENTS]
    unknown = sorted(set(options) - set(allowed))
    if unknown:
        raise ConfigError(f"dataset {what} has no option {', '.join(unknown)}: use "
                          f"{', '.join(allowed)}")
    try:
        return loader(**fixed, **options)
    except ConfigError:
        raise               # the loader's own message says what to change
    except (TypeError, ValueError) as exc:
        # a value of the wrong type from --data-option (n_train=abc, n_features=2.5)
        raise ConfigError(f"dataset {what}: bad option value ({exc}); check "
                          f"{', '.join(f'{k}={v!r}' for k, v in options.items())}") from None


def _strided(ds: Dataset, rank: int, size: int) -> Dataset:
    """``rank``'s strided shard() of a whole data set's training part."""
    mine = shard(len(ds.y_train), rank, size)
    return replace(ds, x_train=ds.x_train[mine], y_train=ds.y_train[mine],
                   shard=(rank, size), train_rows_total=len(ds.y_train))


def load(name: str, rank: int = 0, size: int = 1, **options) -> Dataset:
    """The data set ``name``, with only ``rank``'s shard of ``size`` of its training
    rows (and the whole test set): "synthetic-svm", "digits", "synthetic-images",
    "synthetic-rcv1", "stdlib" (text for the language model: stdlib_text), or the path
    of a LIBSVM file (options: test_path, test_fraction, seed, n_features).

    The synthetic sparse problems and LIBSVM files with a plain training file and a
    test file load only the shard (contiguous rows; see synthetic_svm and
    load_libsvm_split); the others load everything and keep the strided shard().
    """
    _check_rank(rank, size)
    loader = _LOADERS.get(name)
    if loader is None:
        path = os.fspath(name)
        if not os.path.isfile(path):
            raise ConfigError(f"unknown dataset {name!r}: choose {', '.join(_LOADERS)} or "
                              f"the path of a LIBSVM file")
        return _call(load_libsvm_split, path, options, train_path=path, rank=rank,
                     size=size)
    if set(_SHARD_ARGUMENTS) <= set(inspect.signature(loader).parameters):
        return _call(loader, name, options, rank=rank, size=size)
    ds = _call(loader, name, options)
    return ds if size == 1 else _strided(ds, rank, size)
