"""Datasets for the training demos: LIBSVM files, synthetic problems, digits, sharding.

Sparse features are ``scipy.sparse.csr_matrix`` (float32); LIBSVM files are read by
scikit-learn's parser.  Both come with the `train` extra.

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
import io
import lzma
import os
import threading
import zlib
from dataclasses import dataclass
from typing import Callable, Union

import numpy as np

from ..errors import ConfigError
from ..extras import require

sparse = require("scipy.sparse", "train", "asapmpi's training data")

__all__ = [
    "Dataset", "batch_indices", "digits", "is_sparse", "load", "load_libsvm",
    "load_libsvm_split", "shard", "synthetic_images", "synthetic_svm",
]


# ------------------------------------------------------------------------------------------
# Containers
# ------------------------------------------------------------------------------------------

#: dense float32, or a scipy.sparse CSR matrix of float32
Features = Union[np.ndarray, "sparse.csr_matrix"]


def is_sparse(x: Features) -> bool:
    """Whether `x` is a scipy.sparse matrix (rows are taken with x[index])."""
    return sparse.issparse(x)


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
            if x.shape[0] != len(y):
                raise ConfigError(f"dataset {self.name}: x_{part} has {x.shape[0]} rows but "
                                  f"y_{part} has {len(y)} labels; pass one label per row")

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


def _data_lines(path: str):
    """(line number, line) of every line that holds an example (not blank, not only a
    comment), as the parser counts them."""
    with _open_binary(path) as handle:
        for lineno, line in enumerate(handle, 1):
            if line.split(b"#", 1)[0].strip():
                yield lineno, line


def _line_of_row(path: str, row: int) -> int:
    """The line number of example `row` (0-based) of the file."""
    for r, (lineno, _) in enumerate(_data_lines(path)):
        if r == row:
            return lineno
    raise AssertionError(f"{path} has no example {row}")


def _first_bad_line(path: str) -> tuple:
    """(line number, parser message) of the first line the parser refuses, or None: the
    file is parsed _CHUNK_LINES lines at a time, the failing chunk halved down to one."""
    def fails(lines):
        try:
            _parse(io.BytesIO(b"".join(line for _, line in lines)))
        except OverflowError:
            return "a feature index is 2**31 or more, beyond scikit-learn's reader"
        except ValueError as exc:
            return str(exc)
        return None

    chunk = []
    for item in _data_lines(path):
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


def _check_finite(path: str, x, labels: np.ndarray) -> None:
    """Labels and values must be finite numbers (the parser reads nan and inf)."""
    bad_rows = np.flatnonzero(~np.isfinite(labels))
    if len(bad_rows):
        raise _malformed(path, _line_of_row(path, int(bad_rows[0])), "the label is not finite")
    bad = np.flatnonzero(~np.isfinite(x.data))
    if len(bad):
        row = int(np.searchsorted(x.indptr, bad[0], side="right")) - 1
        raise _malformed(path, _line_of_row(path, row), "a feature value is not finite")


def _read_libsvm(path: str, n_features: int | None) -> tuple:
    """(CSR matrix, raw float labels) of a LIBSVM file; columns = n_features or the
    largest index."""
    if n_features is not None and n_features < 1:
        raise ConfigError(f"n_features={n_features}: pass a positive number of columns")
    _reader()           # a missing extra is its own one-line error, not a bad line 1
    try:
        with _open_binary(path) as handle:
            x, labels = _parse(handle)
    except (ValueError, OverflowError) as exc:
        bad = _first_bad_line(path)
        if bad is None:
            raise ConfigError(f"cannot parse LIBSVM file {path}: {exc}; {_FORMAT}") from None
        raise _malformed(path, bad[0], bad[1].rstrip(".")) from None
    except (OSError, EOFError, lzma.LZMAError, zlib.error) as exc:  # a corrupt archive
        raise ConfigError(f"cannot read LIBSVM file {path}: {exc}; check or re-download "
                          f"the file") from exc
    if x.shape[0] == 0:
        raise ConfigError(f"LIBSVM file {path} has no examples; pass a non-empty file")
    _check_finite(path, x, labels)
    if n_features is None:
        return x, labels
    too_big = np.flatnonzero(x.indices >= n_features)
    if len(too_big):
        row = int(np.searchsorted(x.indptr, too_big[0], side="right")) - 1
        raise ConfigError(f"{path}, line {_line_of_row(path, row)}: feature index "
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
    return sparse.csr_matrix((x.data, x.indices, x.indptr), shape=(x.shape[0], n_cols))


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
        train, test = _shuffled_split(x_train.shape[0], test_fraction, seed)
        x_test, y_test = x_train[test], labels[test]
        x_train, y_train = x_train[train], labels[train]
    else:
        test_path = os.fspath(test_path)
        x_test, raw_test = _read_libsvm(test_path, n_features)
        # Map the labels of both files together so a label means the same class in each.
        labels = _binary_labels(np.concatenate([raw_train, raw_test]),
                                f"{train_path} with {test_path}")
        y_train, y_test = labels[:x_train.shape[0]], labels[x_train.shape[0]:]
        n_cols = max(x_train.shape[1], x_test.shape[1])
        x_train, x_test = _with_columns(x_train, n_cols), _with_columns(x_test, n_cols)
    return Dataset(x_train, y_train, x_test, y_test, n_classes=2,
                   name=_dataset_name(train_path), shape=(x_train.shape[1],))


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


def _sparse_rows(rng, n: int, n_features: int, density: float, w_star: np.ndarray):
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
    return sparse.csr_matrix((values.astype(np.float32), cols.astype(np.int32), indptr),
                             shape=(n, n_features))


def _csr_dot(x, w: np.ndarray) -> np.ndarray:
    """x @ w in float64 with sequential (hence reproducible) sums."""
    n = x.shape[0]
    row_ids = np.repeat(np.arange(n, dtype=np.int64), np.diff(x.indptr))
    return np.bincount(row_ids, weights=x.data.astype(np.float64) * w[x.indices],
                       minlength=n)


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
    return Dataset(x[train], y[train], x[test], y[test], n_classes=2,
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
    except ConfigError:
        raise               # the loader's own message says what to change
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
