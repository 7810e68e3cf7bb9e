"""Datasets for the training demos: LIBSVM files, synthetic problems, digits, sharding.

Every generator here is deterministic: it draws only from ``np.random.default_rng(seed)``
and, beyond the generator's own draws, uses only correctly rounded arithmetic (+ - * /
sqrt, sequential sums), so a seed gives bitwise the same data on any machine (given
NumPy's stable Generator streams).  Minibatches
are a pure function of (seed, rank, iteration), so a resumed run draws exactly the batches
an uninterrupted one would.
"""
from __future__ import annotations

import bz2
import gzip
import inspect
import lzma
import os
import re
import threading
import warnings
from dataclasses import dataclass
from typing import Callable, Union

import numpy as np

from ..errors import ConfigError

__all__ = [
    "CSR", "Dataset", "batch_indices", "digits", "load", "load_libsvm", "load_libsvm_split",
    "shard", "synthetic_images", "synthetic_svm",
]


# ------------------------------------------------------------------------------------------
# Containers
# ------------------------------------------------------------------------------------------

class CSR:
    """A minimal compressed-sparse-row float32 matrix (just what the demos need).

    Row ``i`` holds the values ``data[indptr[i]:indptr[i+1]]`` at the columns
    ``indices[indptr[i]:indptr[i+1]]``.
    """

    __slots__ = ("data", "indices", "indptr", "n_cols")

    def __init__(self, indptr, indices, data, n_cols: int):
        self.indptr = np.ascontiguousarray(indptr, dtype=np.int64)
        self.indices = np.ascontiguousarray(indices)
        if self.indices.dtype not in (np.int32, np.int64):
            self.indices = self.indices.astype(np.int64)
        self.data = np.ascontiguousarray(data, dtype=np.float32)
        self.n_cols = int(n_cols)
        if self.indptr.ndim != 1 or len(self.indptr) == 0 or self.indptr[0] != 0:
            raise ConfigError("CSR indptr must be a 1-d array starting at 0: pass row offsets")
        if len(self.indices) != len(self.data) or self.indptr[-1] != len(self.data):
            raise ConfigError("CSR indices and data must both have indptr[-1] entries")

    def __len__(self) -> int:
        return len(self.indptr) - 1

    def __repr__(self) -> str:
        return f"CSR(shape={self.shape}, nnz={self.nnz})"

    @property
    def shape(self) -> tuple:
        """(rows, columns)."""
        return (len(self), self.n_cols)

    @property
    def nnz(self) -> int:
        """The number of stored values."""
        return len(self.data)

    def _gather(self, index) -> tuple:
        """Row ids (0..len(index)-1) and positions into data of the rows in ``index``."""
        index = np.asarray(index, dtype=np.int64).reshape(-1)
        n = len(self)
        if len(index) and (index.min() < -n or index.max() >= n):
            raise IndexError(f"row index out of range for a CSR with {n} rows")
        index = np.where(index < 0, index + n, index)
        starts = self.indptr[index]
        counts = self.indptr[index + 1] - starts
        # Position k of the output belongs to row r = row_ids[k]; its offset into data is
        # starts[r] plus its rank within the row (k minus where row r begins in the output).
        row_ids = np.repeat(np.arange(len(index), dtype=np.int64), counts)
        out_starts = np.cumsum(counts) - counts
        positions = np.arange(len(row_ids), dtype=np.int64) + (starts - out_starts)[row_ids]
        return row_ids, positions, counts

    def rows(self, index) -> np.ndarray:
        """The rows ``index`` (an array of row numbers) as a dense float32 array."""
        row_ids, positions, counts = self._gather(index)
        out = np.zeros((len(counts), self.n_cols), dtype=np.float32)
        out[row_ids, self.indices[positions]] = self.data[positions]
        return out

    def coo(self, index) -> tuple:
        """The rows ``index`` as coordinates: (row numbers 0..len(index)-1, columns,
        values), row by row (for sparse tensors)."""
        row_ids, positions, _ = self._gather(index)
        return row_ids, self.indices[positions].astype(np.int64), self.data[positions]

    def take(self, index) -> CSR:
        """The rows ``index`` (an array of row numbers) as a new CSR."""
        _, positions, counts = self._gather(index)
        indptr = np.zeros(len(counts) + 1, dtype=np.int64)
        np.cumsum(counts, out=indptr[1:])
        return CSR(indptr, self.indices[positions], self.data[positions], self.n_cols)

    def toarray(self) -> np.ndarray:
        """The whole matrix as a dense float32 array."""
        return self.rows(np.arange(len(self)))


Features = Union[np.ndarray, CSR]


@dataclass(frozen=True, eq=False)
class Dataset:
    """A train/test split: features (dense float32 or CSR) and int64 labels 0..n_classes-1.

    ``shape`` is the shape of one example, e.g. ``(n_features,)`` or ``(1, 8, 8)``.
    """

    x_train: Features
    y_train: np.ndarray
    x_test: Features
    y_test: np.ndarray
    n_classes: int
    name: str
    shape: tuple

    def __post_init__(self):
        for part in ("train", "test"):
            x, y = getattr(self, f"x_{part}"), getattr(self, f"y_{part}")
            if len(x) != len(y):
                raise ConfigError(f"dataset {self.name}: x_{part} has {len(x)} rows but "
                                  f"y_{part} has {len(y)} labels; pass one label per row")

    @property
    def n_features(self) -> int:
        """The number of features of one example (the product of ``shape``)."""
        return int(np.prod(self.shape))


# ------------------------------------------------------------------------------------------
# LIBSVM / SVMlight files
# ------------------------------------------------------------------------------------------

_OPENERS = {".gz": gzip.open, ".bz2": bz2.open, ".xz": lzma.open}
# A line's features: whitespace-separated "index:value" tokens, nothing else.
_PAIRS = re.compile(r"\s*(?:[^\s:]+:[^\s:]+(?:\s+|$))*")
_QID = re.compile(r"\bqid:\S+")
_CHUNK_LINES = 20000  # lines parsed per NumPy call: amortizes the call, bounds the memory


def _open_text(path: str):
    """Open a plain, .gz, .bz2 or .xz text file for reading."""
    ext = os.path.splitext(path)[1].lower()
    opener = _OPENERS.get(ext, open)
    try:
        return opener(path, "rt", encoding="utf-8", errors="replace")
    except OSError as exc:
        raise ConfigError(f"cannot open LIBSVM file {path}: {exc.strerror}; check the path")\
            from exc


def _numbers(text: str) -> np.ndarray:
    """Parse whitespace-separated numbers in C; ValueError on anything else."""
    # On a bad token, recent NumPy raises ValueError but older NumPy only warns
    # (DeprecationWarning) and returns the numbers before it: make that an error too, so no
    # junk is silently dropped.  Callers also check the count of numbers.
    with warnings.catch_warnings():
        warnings.simplefilter("error", DeprecationWarning)
        try:
            return np.fromstring(text, dtype=np.float64, sep=" ")
        except DeprecationWarning as exc:
            raise ValueError(str(exc)) from None


def _malformed(path: str, lineno: int, why: str) -> ConfigError:
    """The error for a bad line: names the file and the line."""
    return ConfigError(f"{path}, line {lineno}: {why}; expected 'label index:value ...' "
                       f"(fix or remove the line)")


class _Chunk:
    """Lines of a LIBSVM file split into label and feature text, parsed in one go."""

    def __init__(self):
        self.linenos: list = []
        self.labels: list = []
        self.pairs: list = []   # "index value index value ..." per line
        self.counts: list = []  # pairs per line

    def add(self, lineno: int, label: str, pairs: str, count: int):
        self.linenos.append(lineno)
        self.labels.append(label)
        self.pairs.append(pairs)
        self.counts.append(count)

    def parse(self, path: str) -> tuple:
        """(labels, column indices (1-based float), values, counts) of the whole chunk."""
        try:
            labels = _numbers(" ".join(self.labels))
            numbers = _numbers(" ".join(self.pairs))
        except ValueError:
            numbers = None
        if numbers is None or len(labels) != len(self.labels) \
                or len(numbers) != 2 * sum(self.counts):
            self._raise_first_bad_line(path)
        return labels, numbers[0::2], numbers[1::2], np.asarray(self.counts, dtype=np.int64)

    def _raise_first_bad_line(self, path: str):
        """The chunk failed to parse: find and report its first bad line."""
        for lineno, label, pairs, count in zip(self.linenos, self.labels, self.pairs,
                                               self.counts):
            try:
                ok = len(_numbers(label)) == 1 and len(_numbers(pairs)) == 2 * count
            except ValueError:
                ok = False
            if not ok:
                raise _malformed(path, lineno, "a label or index:value is not a number")
        # Every line parses alone yet the chunk did not: cannot happen, but never pass junk.
        raise _malformed(path, self.linenos[0], "unparsable numbers in this chunk")


def _split_line(path: str, lineno: int, line: str):
    """(label text, pairs text with ':' -> ' ', pair count), or None for a blank line."""
    line = line.split("#", 1)[0]
    parts = line.split(None, 1)
    if not parts:
        return None
    if len(parts) == 1:
        return parts[0], "", 0
    rest = parts[1]
    if "qid:" in rest:  # SVMlight ranking groups: irrelevant to classification
        rest = _QID.sub(" ", rest)
    if not _PAIRS.fullmatch(rest):
        raise _malformed(path, lineno, "a feature is not of the form index:value")
    return parts[0], rest.replace(":", " "), rest.count(":")


def _check_chunk(path: str, chunk: _Chunk, labels, counts, cols, vals):
    """Labels must be finite, indices whole numbers >= 1 and values finite."""
    bad_label = ~np.isfinite(labels)
    if bad_label.any():
        raise _malformed(path, chunk.linenos[np.argmax(bad_label)], "the label is not finite")
    bad = (cols < 1) | (cols != np.floor(cols)) | ~np.isfinite(cols) | ~np.isfinite(vals)
    if bad.any():
        row = np.searchsorted(np.cumsum(counts), np.argmax(bad), side="right")
        raise _malformed(path, chunk.linenos[row],
                         "feature indices must be whole numbers >= 1 and values finite")


def _chunks(path: str):
    """The non-blank lines of a LIBSVM file, _CHUNK_LINES at a time."""
    with _open_text(path) as handle:
        chunk = _Chunk()
        for lineno, line in enumerate(handle, 1):
            split = _split_line(path, lineno, line)
            if split is not None:
                chunk.add(lineno, *split)
                if len(chunk.linenos) >= _CHUNK_LINES:
                    yield chunk
                    chunk = _Chunk()
        if chunk.linenos:
            yield chunk


def _read_libsvm(path: str, n_features: int | None) -> tuple:
    """(CSR, raw float labels) of a LIBSVM file; columns = n_features or the max index."""
    labels, cols, vals, counts, linenos = [], [], [], [], []
    try:
        for chunk in _chunks(path):
            lab, col, val, cnt = chunk.parse(path)
            _check_chunk(path, chunk, lab, cnt, col, val)
            labels.append(lab)
            cols.append(col.astype(np.int64) - 1)
            vals.append(val.astype(np.float32))
            counts.append(cnt)
            linenos.append(np.asarray(chunk.linenos, dtype=np.int64))
    except (OSError, EOFError) as exc:  # e.g. a truncated or corrupt .bz2
        raise ConfigError(f"cannot read LIBSVM file {path}: {exc}; check or re-download "
                          f"the file") from exc
    if not labels:
        raise ConfigError(f"LIBSVM file {path} has no examples; pass a non-empty file")
    cat = np.concatenate
    col, cnt = cat(cols), cat(counts)
    n_cols = _n_columns(path, col, cnt, cat(linenos), n_features)
    indptr = np.zeros(len(cnt) + 1, dtype=np.int64)
    np.cumsum(cnt, out=indptr[1:])
    index_type = np.int32 if n_cols < 2**31 else np.int64
    return CSR(indptr, col.astype(index_type), cat(vals), n_cols), cat(labels)


def _n_columns(path: str, col, counts, linenos, n_features: int | None) -> int:
    """n_features if every index fits, else a ConfigError naming the first offending line."""
    seen = int(col.max()) + 1 if len(col) else 0
    if n_features is None:
        return seen
    if n_features < 1:
        raise ConfigError(f"n_features={n_features}: pass a positive number of columns")
    if seen > n_features:
        first = int(np.argmax(col >= n_features))
        row = np.searchsorted(np.cumsum(counts), first, side="right")
        raise ConfigError(f"{path}, line {linenos[row]}: feature index {col[first] + 1} > "
                          f"n_features={n_features}; raise n_features or leave it unset")
    return int(n_features)


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
    """Read a binary-classification LIBSVM/SVMlight file (plain, .gz, .bz2 or .xz).

    Returns ``(CSR features, int64 labels in {0, 1})``.  Indices in the file are 1-based;
    ``n_features`` sets the number of columns (default: the largest index seen).
    """
    x, raw = _read_libsvm(os.fspath(path), n_features)
    return x, _binary_labels(raw, os.fspath(path))


def _dataset_name(path: str) -> str:
    """The file name without directories and compression suffix."""
    base = os.path.basename(path)
    stem, ext = os.path.splitext(base)
    return stem if ext.lower() in _OPENERS else base


def _with_columns(x: CSR, n_cols: int) -> CSR:
    """The same rows with ``n_cols`` columns (n_cols >= x.n_cols)."""
    return CSR(x.indptr, x.indices, x.data, n_cols)


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
                      n_features: int | None = None) -> Dataset:
    """A LIBSVM binary problem as a Dataset: the given test file, else a shuffled split."""
    train_path = os.fspath(train_path)
    x_train, raw_train = _read_libsvm(train_path, n_features)
    if test_path is None:
        labels = _binary_labels(raw_train, train_path)
        train, test = _shuffled_split(len(x_train), test_fraction, seed)
        x_test, y_test = x_train.take(test), labels[test]
        x_train, y_train = x_train.take(train), labels[train]
    else:
        test_path = os.fspath(test_path)
        x_test, raw_test = _read_libsvm(test_path, n_features)
        # Map the labels of both files together so a label means the same class in each.
        labels = _binary_labels(np.concatenate([raw_train, raw_test]),
                                f"{train_path} with {test_path}")
        y_train, y_test = labels[:len(x_train)], labels[len(x_train):]
        n_cols = max(x_train.n_cols, x_test.n_cols)
        x_train, x_test = _with_columns(x_train, n_cols), _with_columns(x_test, n_cols)
    return Dataset(x_train, y_train, x_test, y_test, n_classes=2,
                   name=_dataset_name(train_path), shape=(x_train.n_cols,))


# ------------------------------------------------------------------------------------------
# Synthetic sparse binary problem (RCV1-like)
# ------------------------------------------------------------------------------------------

def _seed(seed) -> int:
    """A seed must be a non-negative integer (default_rng's requirement)."""
    if isinstance(seed, (bool, np.bool_)) or not isinstance(seed, (int, np.integer)) \
            or seed < 0:
        raise ConfigError(f"seed={seed!r}: pass a non-negative integer")
    return int(seed)


def _check_positive(**values):
    """Sizes must be at least 1."""
    for key, value in values.items():
        if value < 1:
            raise ConfigError(f"{key}={value}: pass a positive number")


_SUPPORT = 0.25      # fraction of features that carry signal in the hidden w*
_TOPIC_SHARE = 0.15  # fraction of a row's terms drawn from its topic's words


def _draw_terms(rng, n: int, n_features: int, density: float, w_star: np.ndarray) -> tuple:
    """(row ids, columns) of about density*n_features terms per row.

    Most terms follow a Zipf-like popularity (a few frequent terms, a long tail of rare
    ones, as in text).  Each row also has a latent topic, one sign of w*, and draws a share
    of its terms among the words of that sign: as in categorized news, the classes then
    differ in vocabulary and have a margin, so a linear model can learn them from 16k rows
    (without topics the best linear fit stays near 84% test accuracy).
    """
    per_row = density * n_features
    low, high = max(1, round(per_row / 2)), max(1, round(per_row * 1.5))
    counts = rng.integers(low, high + 1, size=n)
    rows = np.repeat(np.arange(n, dtype=np.int64), counts)
    popularity = 1.0 / (np.arange(n_features) + 10.0)
    popularity = popularity[rng.permutation(n_features)]  # ranks -> random columns
    cdf = np.cumsum(popularity)
    cols = np.searchsorted(cdf, rng.random(len(rows)) * cdf[-1], side="right")
    cols = np.minimum(cols, n_features - 1)  # guards the u*cdf[-1] == cdf[-1] edge
    positive, negative = np.flatnonzero(w_star > 0), np.flatnonzero(w_star < 0)
    topic = rng.integers(0, 2, size=n)[rows]
    on_topic = rng.random(len(rows)) < _TOPIC_SHARE
    if len(positive) and len(negative):  # tiny problems may lack one sign: no topics
        word = rng.random(len(rows))
        topic_cols = np.where(topic == 1, positive[(word * len(positive)).astype(np.int64)],
                              negative[(word * len(negative)).astype(np.int64)])
        cols = np.where(on_topic, topic_cols, cols)
    return rows, cols, popularity


def _sparse_rows(rng, n: int, n_features: int, density: float, w_star: np.ndarray) -> CSR:
    """The rows of the synthetic problem: positive tf-idf-like values, L2-normalized as in
    RCV1."""
    rows, cols, popularity = _draw_terms(rng, n, n_features, density, w_star)
    # A term drawn twice in a row counts once: unique (row, column) keys, sorted row-major.
    keys = np.sort(rows * n_features + cols)
    keys = keys[np.concatenate([[True], keys[1:] != keys[:-1]])]
    rows, cols = keys // n_features, keys % n_features
    # tf-idf-like: rarer terms weigh more (idf ~ 1/sqrt(popularity), no log so the values
    # are bitwise reproducible), times a random term frequency.
    idf = 1.0 / np.sqrt(popularity * n_features)
    values = idf[cols] * (1.0 + 3.0 * rng.random(len(keys)))
    norms = np.sqrt(np.bincount(rows, weights=values * values, minlength=n))
    values = values / norms[rows]
    indptr = np.zeros(n + 1, dtype=np.int64)
    np.cumsum(np.bincount(rows, minlength=n), out=indptr[1:])
    return CSR(indptr, cols.astype(np.int32), values.astype(np.float32), n_features)


def _csr_dot(x: CSR, w: np.ndarray) -> np.ndarray:
    """x @ w in float64 with sequential (hence reproducible) sums."""
    row_ids = np.repeat(np.arange(len(x), dtype=np.int64), np.diff(x.indptr))
    return np.bincount(row_ids, weights=x.data.astype(np.float64) * w[x.indices],
                       minlength=len(x))


def synthetic_svm(n_train: int = 16384, n_test: int = 4096, n_features: int = 2000,
                  density: float = 0.02, noise: float = 0.05, seed: int = 0) -> Dataset:
    """A deterministic RCV1-like sparse binary problem that a linear model learns well.

    Rows have about ``density * n_features`` positive tf-idf-like values, L2-normalized,
    with a share of each row's terms from a latent topic's vocabulary (see _draw_terms).
    The label is ``x . w* > median(x . w*)`` for a hidden sparse Gaussian ``w*`` (so the
    classes are balanced), then a ``noise`` fraction of labels is flipped.
    """
    _check_positive(n_train=n_train, n_test=n_test, n_features=n_features)
    if not 0.0 < density <= 1.0:
        raise ConfigError(f"density={density}: pass a fraction of non-zeros in (0, 1]")
    if not 0.0 <= noise < 0.5:
        raise ConfigError(f"noise={noise}: pass a label-flip fraction in [0, 0.5)")
    rng = np.random.default_rng(_seed(seed))
    n = n_train + n_test
    w_star = rng.standard_normal(n_features) * (rng.random(n_features) < _SUPPORT)
    x = _sparse_rows(rng, n, n_features, density, w_star)
    score = _csr_dot(x, w_star)
    y = (score > np.median(score)).astype(np.int64)
    flip = rng.permutation(n)[:round(noise * n)]
    y[flip] = 1 - y[flip]
    train, test = np.arange(n_train), np.arange(n_train, n)
    return Dataset(x.take(train), y[train], x.take(test), y[test], n_classes=2,
                   name="synthetic-svm", shape=(n_features,))


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
    try:
        from sklearn.datasets import load_digits  # optional: imported only here
    except ImportError:
        raise ConfigError("the digits dataset ships with scikit-learn: pip install "
                          "scikit-learn, or pass --data synthetic") from None
    bunch = load_digits()
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
    shard_indices = np.asarray(shard_indices)
    m = len(shard_indices)
    if not 1 <= batch_size <= m:
        raise ConfigError(f"batch_size={batch_size} with a shard of {m} examples: pass "
                          f"1 <= batch_size <= shard size (or use fewer ranks)")
    if iteration < 0:
        raise ConfigError(f"iteration={iteration}: pass a non-negative iteration")
    if rank < 0:
        raise ConfigError(f"rank={rank}: pass the non-negative rank of this process")
    seed, rank = _seed(seed), int(rank)
    start = int(iteration) * int(batch_size)  # Python ints: no overflow
    end = start + int(batch_size)
    epoch = start // m
    offset = start - epoch * m
    head = _epoch_permutation(seed, rank, m, epoch)[offset:min(end - epoch * m, m)]
    if end <= (epoch + 1) * m:
        return shard_indices[head]
    tail = _epoch_permutation(seed, rank, m, epoch + 1)[:end - (epoch + 1) * m]
    return shard_indices[np.concatenate([head, tail])]


# ------------------------------------------------------------------------------------------
# Dispatch
# ------------------------------------------------------------------------------------------

_LOADERS: dict = {
    "synthetic-svm": synthetic_svm,
    "digits": digits,
    "synthetic-images": synthetic_images,
}


def _call(loader: Callable, what: str, options: dict, **fixed) -> Dataset:
    """Call a loader, turning an unknown option into a ConfigError that lists the valid."""
    allowed = [p for p in inspect.signature(loader).parameters if p not in fixed]
    unknown = sorted(set(options) - set(allowed))
    if unknown:
        raise ConfigError(f"dataset {what} has no option {', '.join(unknown)}: use "
                          f"{', '.join(allowed)}")
    try:
        return loader(**fixed, **options)
    except (TypeError, ValueError) as exc:
        # a value of the wrong type from --data-option (n_train=abc, n_features=2.5)
        raise ConfigError(f"dataset {what}: bad option value ({exc}); check "
                          f"{', '.join(f'{k}={v!r}' for k, v in options.items())}") from None


def load(name: str, **options) -> Dataset:
    """The dataset ``name``: "synthetic-svm", "digits", "synthetic-images", or the path of
    a LIBSVM file (options: test_path, test_fraction, seed, n_features)."""
    loader = _LOADERS.get(name)
    if loader is not None:
        return _call(loader, name, options)
    path = os.fspath(name)
    if os.path.isfile(path):
        return _call(load_libsvm_split, path, options, train_path=path)
    raise ConfigError(f"unknown dataset {name!r}: choose {', '.join(_LOADERS)} or the path "
                      f"of a LIBSVM file")
