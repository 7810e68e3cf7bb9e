"""Serial tests of asapmpi.train.data: LIBSVM files, synthetic data, shards, batches."""
import bz2
import gzip
import lzma
import sys
import types

import numpy as np
import pytest
from scipy import sparse

from asapmpi.errors import ConfigError
from asapmpi.train import data
from asapmpi.train.data import (
    Dataset,
    batch_indices,
    digits,
    load,
    load_libsvm,
    load_libsvm_split,
    shard,
    synthetic_images,
    synthetic_svm,
)

SMALL = """\
# a comment line, then a blank line

+1 1:0.5 3:2.0   # trailing comment
-1 2:1.5
-1
+1 1:0.25 4:-1
"""
SMALL_DENSE = np.array([[0.5, 0, 2.0, 0], [0, 1.5, 0, 0], [0, 0, 0, 0], [0.25, 0, 0, -1]],
                       dtype=np.float32)
SMALL_LABELS = np.array([1, 0, 0, 1])


def _write(path, text):
    """Write text to path, compressed according to its extension."""
    opener = {".gz": gzip.open, ".bz2": bz2.open, ".xz": lzma.open}.get(path.suffix, open)
    with opener(path, "wt") as handle:
        handle.write(text)
    return path


# ------------------------------------------------------------------------------------------
# LIBSVM
# ------------------------------------------------------------------------------------------

@pytest.mark.parametrize("suffix", ["", ".gz", ".bz2", ".xz"])
def test_libsvm_parses_comments_blank_lines_and_compression(tmp_path, suffix):
    x, y = load_libsvm(_write(tmp_path / f"small.svm{suffix}", SMALL))
    assert sparse.issparse(x) and x.format == "csr" and x.dtype == np.float32
    assert x.shape == (4, 4) and x.nnz == 5
    np.testing.assert_array_equal(x.toarray(), SMALL_DENSE)
    assert y.dtype == np.int64
    np.testing.assert_array_equal(y, SMALL_LABELS)


@pytest.mark.parametrize("chunk", [2, 3, 20000])
def test_libsvm_bad_line_is_found_in_any_chunk(tmp_path, monkeypatch, chunk):
    # the search for the bad line parses the file a chunk at a time, then halves
    monkeypatch.setattr(data, "_CHUNK_LINES", chunk)
    bad = _write(tmp_path / "bad.svm", SMALL + "-1 2:1\n+1 5:oops\n-1 1:1\n")
    with pytest.raises(ConfigError, match=r"bad\.svm, line 8: .*oops"):
        load_libsvm(bad)


@pytest.mark.parametrize("line", ["+1 3:x", "+1 3", "+1 3:1:2 4", "one 1:2", "+1 0:1",
                                  "+1 1.5:2", "+1 2:1-3", "+1 :2", "+1 2:nan",
                                  "+1 2:1 3:2x", "nan 1:1", "+1 2:inf", "+1 3:1 2:1",
                                  "+1 2:1 2:3"])
def test_libsvm_malformed_line_names_file_and_line(tmp_path, line):
    path = _write(tmp_path / "bad.svm", f"+1 1:1\n\n# comment\n{line}\n-1 2:1\n")
    with pytest.raises(ConfigError, match=r"bad\.svm, line 4\b"):
        load_libsvm(path)


def test_libsvm_more_than_two_labels_is_refused(tmp_path):
    path = _write(tmp_path / "multi.svm", "1 1:1\n2 2:1\n3 1:1\n")
    with pytest.raises(ConfigError, match="binary"):
        load_libsvm(path)


@pytest.mark.parametrize(("labels", "expected"), [
    (["0", "1", "0"], [0, 1, 0]),
    (["2", "1", "1"], [1, 0, 0]),
    (["+1", "+1", "+1"], [1, 1, 1]),
    (["-1", "-1", "-1"], [0, 0, 0]),
    (["7", "3", "7"], [1, 0, 1]),
])
def test_libsvm_label_conventions(tmp_path, labels, expected):
    text = "".join(f"{label} 1:1\n" for label in labels)
    _, y = load_libsvm(_write(tmp_path / "labels.svm", text))
    np.testing.assert_array_equal(y, expected)


def test_libsvm_n_features(tmp_path):
    path = _write(tmp_path / "small.svm", SMALL)
    x, _ = load_libsvm(path, n_features=10)
    assert x.shape == (4, 10)
    np.testing.assert_array_equal(x.toarray()[:, :4], SMALL_DENSE)
    with pytest.raises(ConfigError, match=r"line 6: feature index 4 > n_features=3"):
        load_libsvm(path, n_features=3)


def test_libsvm_unreadable_files_and_qid(tmp_path):
    with pytest.raises(ConfigError, match="cannot open"):
        load_libsvm(tmp_path / "missing.svm")
    corrupt = tmp_path / "corrupt.svm.bz2"
    corrupt.write_bytes(bz2.compress(SMALL.encode())[:40])
    with pytest.raises(ConfigError, match="cannot read"):
        load_libsvm(corrupt)
    damaged = bytearray(gzip.compress(SMALL.encode() * 50))
    damaged[30:60] = bytes(30)                 # a broken deflate stream: zlib.error
    (tmp_path / "damaged.svm.gz").write_bytes(bytes(damaged))
    with pytest.raises(ConfigError, match=r"cannot read LIBSVM file .*damaged\.svm\.gz"):
        load_libsvm(tmp_path / "damaged.svm.gz")
    x, y = load_libsvm(_write(tmp_path / "rank.svm", "2 qid:1 1:3\n1 qid:1 2:4\n"))
    np.testing.assert_array_equal(x.toarray(), [[3, 0], [0, 4]])
    np.testing.assert_array_equal(y, [1, 0])


def test_libsvm_split_with_and_without_test_file(tmp_path):
    train = _write(tmp_path / "train.svm.bz2", SMALL)
    test = _write(tmp_path / "test.svm", "+1 6:1\n")
    both = load_libsvm_split(train, test)
    assert both.name == "train.svm" and both.n_classes == 2 and both.shape == (6,)
    assert both.x_train.shape == (4, 6) and both.x_test.shape == (1, 6)
    np.testing.assert_array_equal(both.y_test, [1])
    lines = "".join(f"{1 if i % 3 else -1} {i % 7 + 1}:{i}\n" for i in range(50))
    one = load_libsvm_split(_write(tmp_path / "one.svm", lines), test_fraction=0.2, seed=3)
    assert one.x_train.shape[0] == 40 and one.x_test.shape[0] == 10
    again = load_libsvm_split(tmp_path / "one.svm", test_fraction=0.2, seed=3)
    np.testing.assert_array_equal(one.x_test.toarray(), again.x_test.toarray())
    # The split is a partition of the rows: each row's single value is its line number.
    values = np.concatenate([one.x_train.toarray().sum(1), one.x_test.toarray().sum(1)])
    assert sorted(values.tolist()) == list(range(50))
    assert not np.array_equal(one.x_test.toarray().sum(1), np.arange(10))  # shuffled


# ------------------------------------------------------------------------------------------
# LIBSVM by byte ranges
# ------------------------------------------------------------------------------------------

def _ranged_file(path):
    """A plain LIBSVM file of CRLF and LF lines, comments and blank lines whose second
    half starts exactly at byte S/2 (so rank 1 of 2 starts on a line start)."""
    rng = np.random.default_rng(0)
    lines = []
    for i in range(60):
        cols = np.sort(rng.choice(np.arange(1, 40 + i), size=3, replace=False))
        pairs = " ".join(f"{c}:{rng.random():.3f}" for c in cols)
        lines.append(f"{'+1' if rng.random() < 0.5 else '-1'} {pairs}" +
                     (" # note" if i % 7 == 0 else "") + ("\r\n" if i % 3 else "\n"))
        if i % 11 == 0:
            lines.append("# a comment line\n" if i % 2 else "\r\n")
    lines.append("+1 1:1 99:1\r\n")                   # the widest row, the last
    first, second = "".join(lines[:len(lines) // 2]), "".join(lines[len(lines) // 2:])
    pad = len(second) - len(first)
    if pad > 0:
        first += "#" * (pad - 1) + "\n"                # a comment line
    second += "\n" * (len(first) - len(second))        # blank lines
    path.write_bytes((first + second).encode())
    assert len(first) == len(second) and first.endswith("\n")
    return path


def test_libsvm_byte_ranges_concatenate_to_the_whole_file(tmp_path):
    train = _ranged_file(tmp_path / "ranged.svm")
    test = _write(tmp_path / "ranged.t", "-1 2:1\n+1 3:0.5\n")
    whole = load(str(train), test_path=str(test))
    assert whole.shape == (99,)
    for size in (1, 2, 3, 5, 8, 13):
        parts = [load(str(train), rank=r, size=size, test_path=str(test))
                 for r in range(size)]
        # later rows are wider: the parts' columns differ until they agree
        assert size == 1 or parts[0].shape < whole.shape
        summaries = [data.shard_summary(p) for p in parts]
        parts = [data.conform(p, summaries) for p in parts]
        x, y = _concat_train(parts)
        assert _same_csr(x, whole.x_train) and np.array_equal(y, whole.y_train), size
        for part in parts:
            assert part.shape == whole.shape and part.train_rows_total == 61
            assert _same_csr(part.x_test, whole.x_test)
    spans = [data._byte_span(str(train), r, 2) for r in range(2)]
    size_bytes = train.stat().st_size
    assert spans == [(0, size_bytes // 2), (size_bytes // 2, size_bytes)]  # on a line start


def test_libsvm_byte_ranges_agree_on_labels_a_rank_lacks(tmp_path):
    # labels {1, 2}: a rank whose part only has 2s maps them to 0 alone, to 1 with all
    lines = "".join(f"2 {i % 5 + 1}:1\n" for i in range(20)) + \
        "".join(f"{1 + i % 2} {i % 5 + 1}:1\n" for i in range(20))
    train = _write(tmp_path / "labels.svm", lines)
    test = _write(tmp_path / "labels.t", "2 1:1\n")
    whole = load(str(train), test_path=str(test))
    parts = [load(str(train), rank=r, size=2, test_path=str(test)) for r in range(2)]
    assert parts[0].y_train.tolist() == [0] * 20 and parts[0].label_values == (2.0,)
    summaries = [data.shard_summary(p) for p in parts]
    parts = [data.conform(p, summaries) for p in parts]
    _, y = _concat_train(parts)
    assert np.array_equal(y, whole.y_train) and parts[0].y_test.tolist() == [1]
    # two labels in each part, three in the file
    three = _write(tmp_path / "three.svm", "1 1:1\n2 1:1\n" + "3 1:1\n3 1:1\n")
    one = _write(tmp_path / "one.t", "1 1:1\n")
    parts = [load(str(three), rank=r, size=2, test_path=str(one)) for r in range(2)]
    with pytest.raises(ConfigError, match="has 3 distinct labels"):
        data.conform(parts[0], [data.shard_summary(p) for p in parts])


def test_libsvm_byte_range_errors_name_the_files_line(tmp_path):
    good = "".join(f"+1 {i + 1}:1\n" for i in range(10))
    train = _write(tmp_path / "late.svm", good + good + "-1 3:x\n" + good)
    test = _write(tmp_path / "late.t", "+1 1:1\n")
    load(str(train), rank=0, size=2, test_path=str(test))            # its part is fine
    with pytest.raises(ConfigError, match=r"late\.svm, line 21: "):
        load(str(train), rank=1, size=2, test_path=str(test))
    wide = _write(tmp_path / "wide.svm", good + good + "-1 30:1\n" + good)
    with pytest.raises(ConfigError, match=r"wide\.svm, line 21: feature index 30 > "):
        load(str(wide), rank=1, size=2, test_path=str(test), n_features=20)
    tiny = _write(tmp_path / "tiny.svm", "+1 1:1\n-1 2:1\n")
    with pytest.raises(ConfigError, match=r"no examples in bytes .* use fewer ranks"):
        load(str(tiny), rank=1, size=8, test_path=str(test))


@pytest.mark.parametrize("name,with_test", [("whole.svm.gz", True), ("whole.svm", False)])
def test_libsvm_without_byte_ranges_keeps_the_strided_shard(tmp_path, name, with_test):
    # compressed files, and hold-outs shuffled over the whole file, are read whole
    lines = "".join(f"{1 if i % 3 else -1} {i % 7 + 1}:{i}\n" for i in range(50))
    train = _write(tmp_path / name, lines)
    options = {"test_path": str(_write(tmp_path / "t.svm", "+1 1:1\n"))} if with_test \
        else {"seed": 3}
    whole = load(str(train), **options)
    for rank in range(3):
        part = load(str(train), rank=rank, size=3, **options)
        mine = shard(len(whole.y_train), rank, 3)
        assert _same_csr(part.x_train, whole.x_train[mine])
        assert np.array_equal(part.y_train, whole.y_train[mine])
        assert _same_csr(part.x_test, whole.x_test)
        assert part.train_rows_total == len(whole.y_train)


# ------------------------------------------------------------------------------------------
# Synthetic sparse problem
# ------------------------------------------------------------------------------------------

def _same_csr(a, b):
    return (np.array_equal(a.indptr, b.indptr) and np.array_equal(a.indices, b.indices)
            and np.array_equal(a.data, b.data) and a.shape == b.shape)


def test_synthetic_svm_is_deterministic():
    a = synthetic_svm(n_train=600, n_test=200, n_features=300, seed=5)
    b = synthetic_svm(n_train=600, n_test=200, n_features=300, seed=5)
    c = synthetic_svm(n_train=600, n_test=200, n_features=300, seed=6)
    assert _same_csr(a.x_train, b.x_train) and _same_csr(a.x_test, b.x_test)
    assert np.array_equal(a.y_train, b.y_train) and np.array_equal(a.y_test, b.y_test)
    assert not _same_csr(a.x_train, c.x_train)
    assert a.x_train.shape == (600, 300) and a.shape == (300,) and a.n_classes == 2
    assert sparse.issparse(a.x_train) and a.x_train.format == "csr"
    assert a.x_train.data.dtype == np.float32 and (a.x_train.data > 0).all()
    norms = np.sqrt(np.bincount(np.repeat(np.arange(600), np.diff(a.x_train.indptr)),
                                weights=a.x_train.data.astype(np.float64) ** 2))
    np.testing.assert_allclose(norms, 1.0, rtol=1e-5)


def _sparse_ops(x):
    """x @ w and x.T @ g for a CSR matrix, via bincount."""
    rows = np.repeat(np.arange(x.shape[0]), np.diff(x.indptr))
    values = x.data.astype(np.float64)

    def matvec(w):
        return np.bincount(rows, weights=values * w[x.indices], minlength=x.shape[0])

    def rmatvec(g):
        return np.bincount(x.indices, weights=values * g[rows], minlength=x.shape[1])

    return matvec, rmatvec


def test_synthetic_svm_is_learnable_by_a_linear_model():
    d = synthetic_svm()
    assert d.x_train.shape == (16384, 2000) and d.x_test.shape == (4096, 2000)
    assert (np.diff(d.x_train.indptr) == 40).all()        # nnz_per_row's default
    constant = max(d.y_test.mean(), 1 - d.y_test.mean())
    assert constant <= 0.60
    # Logistic regression by full-batch gradient descent (rows are unit-norm: a big step
    # is stable).
    matvec, rmatvec = _sparse_ops(d.x_train)
    w, b = np.zeros(2000), 0.0
    for _ in range(200):
        residual = 1.0 / (1.0 + np.exp(-(matvec(w) + b))) - d.y_train
        w -= 30.0 * rmatvec(residual) / len(residual)
        b -= 30.0 * residual.mean()
    test_matvec, _ = _sparse_ops(d.x_test)
    accuracy = ((test_matvec(w) + b > 0) == d.y_test).mean()
    assert accuracy >= 0.80


# ------------------------------------------------------------------------------------------
# Per-rank loading: each rank generates or reads only its shard
# ------------------------------------------------------------------------------------------

def _concat_train(parts):
    """The training rows of shards in rank order, as one CSR matrix and one label array."""
    return (sparse.vstack([p.x_train for p in parts], format="csr"),
            np.concatenate([p.y_train for p in parts]))


@pytest.mark.parametrize("size", [1, 2, 3, 7, 8])
def test_synthetic_shards_concatenate_to_the_whole_set(monkeypatch, size):
    # small blocks: the 1003 rows span 11 of them, cut anywhere by the shards
    monkeypatch.setattr(data, "_BLOCK_ROWS", 100)
    options = {"n_train": 1003, "n_test": 150, "n_features": 400, "nnz_per_row": 12, "seed": 4}
    whole = synthetic_svm(**options)
    parts = [synthetic_svm(**options, rank=r, size=size) for r in range(size)]
    x, y = _concat_train(parts)
    assert _same_csr(x, whole.x_train) and np.array_equal(y, whole.y_train)
    for r, part in enumerate(parts):
        assert part.shard == (r, size) and part.train_rows_total == 1003
        assert abs(len(part.y_train) - 1003 / size) < 1          # balanced
        assert _same_csr(part.x_test, whole.x_test)              # the whole test set
        assert np.array_equal(part.y_test, whole.y_test)


def test_a_shard_alone_is_its_slice_of_the_whole_set():
    # real block size: shard 3 of 8 of 10000 rows (3750..4999) crosses a block boundary
    options = {"n_train": 10000, "n_test": 100, "n_features": 3000, "seed": 1}
    mine = load("synthetic-svm", rank=3, size=8, **options)
    whole = load("synthetic-svm", **options)
    assert _same_csr(mine.x_train, whole.x_train[3750:5000])
    assert np.array_equal(mine.y_train, whole.y_train[3750:5000])
    rcv1 = load("synthetic-rcv1", rank=1, size=3, n_train=5000, n_test=50)
    assert rcv1.name == "synthetic-rcv1" and rcv1.shape == (1000000,)
    assert rcv1.x_train.shape[0] == 5000 * 2 // 3 - 5000 // 3


@pytest.mark.parametrize(("options", "per_row"), [
    ({"n_features": 2000}, 40), ({"n_features": 50}, 25), ({"n_features": 60,
                                                             "nnz_per_row": 30}, 30),
    ({"n_features": 1000, "density": 0.013}, 13), ({"n_features": 7, "nnz_per_row": 3}, 3),
])
def test_every_row_has_exactly_nnz_per_row_distinct_terms(options, per_row):
    d = synthetic_svm(n_train=500, n_test=40, seed=2, **options)
    for x in (d.x_train, d.x_test):
        assert (np.diff(x.indptr) == per_row).all()
        cols = x.indices.reshape(-1, per_row)
        assert (np.diff(cols, axis=1) > 0).all()              # ascending, distinct
        assert (x.data > 0).all()
        norms = np.sqrt((x.data.astype(np.float64).reshape(-1, per_row) ** 2).sum(1))
        np.testing.assert_allclose(norms, 1.0, rtol=1e-5)


def test_labels_are_balanced_without_a_global_pass():
    # the threshold is the median score of a calibration sample, not of the data set
    d = synthetic_svm(n_train=4000, n_test=2000, noise=0.0, seed=8)
    assert abs(d.y_train.mean() - 0.5) < 0.04 and abs(d.y_test.mean() - 0.5) < 0.04


def test_one_ranks_shard_of_a_million_features_is_small_in_memory():
    tracemalloc = pytest.importorskip("tracemalloc")
    n_train, size, n_features = 262144, 8, 1000000
    tracemalloc.start()
    try:
        mine = data.synthetic_rcv1(n_train=n_train, n_features=n_features, rank=3,
                                   size=size)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    x = mine.x_train
    shard_bytes = x.data.nbytes + x.indices.nbytes + x.indptr.nbytes
    whole_bytes = shard_bytes * size
    # O(shard + n_features): the shard, the test set and a few arrays of n_features
    # (w*, popularity, their cdf), far below all the rows (160 MB here)
    assert peak < 2 * shard_bytes + 64 * n_features, (peak, shard_bytes)
    assert peak < whole_bytes, (peak, whole_bytes)


@pytest.mark.parametrize(("options", "message"), [
    ({"nnz_per_row": 10, "density": 0.01}, "nnz_per_row=10 and density=0.01: pass one"),
    ({"nnz_per_row": 1001}, "nnz_per_row=1001 with n_features=2000: pass at most 1000"),
    ({"nnz_per_row": 0}, "nnz_per_row=0: pass a positive number"),
    ({"density": 0.7}, r"density=0.7: pass a fraction of non-zeros in \(0, 0.5\]"),
    ({"vocabulary": 3000}, "vocabulary=3000 > n_features=2000"),
    ({"support": 0.0}, r"support=0.0: pass the fraction"),
    ({"topic_share": 1.0}, r"topic_share=1.0: pass a fraction of topic terms in \[0, 1\)"),
    ({"idf": "maybe"}, "idf='maybe': pass true or false"),
    ({"n_features": 2 ** 31}, "fewer than 2\\*\\*31"),
    ({"nnz_per_row": "many"}, "bad option value"),
    ({"n_train": 5, "size": 8, "rank": 0}, "5 examples cannot be shared by 8 ranks"),
    ({"rank": 8, "size": 8}, "rank 8 of 8: pass 0 <= rank < size"),
])
def test_bad_synthetic_options_are_one_clear_line(options, message):
    with pytest.raises(ConfigError, match=message) as info:
        load("synthetic-svm", **options)
    assert "\n" not in str(info.value)


def test_loaders_without_native_shards_keep_the_strided_shard():
    whole = load("synthetic-images", n_train=50, n_test=10, seed=1)
    for rank in range(3):
        part = load("synthetic-images", rank=rank, size=3, n_train=50, n_test=10, seed=1)
        mine = shard(50, rank, 3)
        assert np.array_equal(part.x_train, whole.x_train[mine])
        assert np.array_equal(part.y_train, whole.y_train[mine])
        assert np.array_equal(part.x_test, whole.x_test)
        assert part.shard == (rank, 3) and part.train_rows_total == 50


def test_conform_leaves_generated_shards_alone_but_for_the_total():
    parts = [synthetic_svm(n_train=90, n_test=10, n_features=50, rank=r, size=3)
             for r in range(3)]
    summaries = [data.shard_summary(p) for p in parts]
    after = data.conform(parts[1], summaries)
    assert after.train_rows_total == 90 and after.shape == (50,)
    assert after.x_train is parts[1].x_train and after.y_train is parts[1].y_train


# ------------------------------------------------------------------------------------------
# Images
# ------------------------------------------------------------------------------------------

def test_glyph_templates_are_ten_distinct_8x8_bitmaps():
    assert len(data.GLYPHS) == 10
    assert all(len(g) == 8 and all(len(row) == 8 and set(row) <= {"#", "."} for row in g)
               for g in data.GLYPHS)
    flat = data.glyph_templates().reshape(10, 64)
    assert len({row.tobytes() for row in flat}) == 10


def test_synthetic_images_deterministic_shaped_and_learnable():
    a = synthetic_images(n_train=500, n_test=300, seed=2)
    b = synthetic_images(n_train=500, n_test=300, seed=2)
    c = synthetic_images(n_train=500, n_test=300, seed=3)
    assert np.array_equal(a.x_train, b.x_train) and np.array_equal(a.y_test, b.y_test)
    assert not np.array_equal(a.x_train, c.x_train)
    assert a.x_train.shape == (500, 1, 8, 8) and a.x_test.shape == (300, 1, 8, 8)
    assert a.x_train.dtype == np.float32 and a.y_train.dtype == np.int64
    assert a.shape == (1, 8, 8) and a.n_classes == 10
    assert a.x_train.min() >= 0.0 and a.x_train.max() <= 1.0
    assert (np.bincount(a.y_train, minlength=10) == 50).all()
    assert (np.bincount(a.y_test, minlength=10) == 30).all()
    # The nearest training image mostly has the right class; the noise keeps it imperfect.
    train, test = a.x_train.reshape(-1, 64), a.x_test.reshape(-1, 64)
    nearest = ((test[:, None] - train[None]) ** 2).sum(-1).argmin(1)
    accuracy = (a.y_train[nearest] == a.y_test).mean()
    assert 0.85 <= accuracy < 1.0


def _fake_sklearn(monkeypatch):
    """Install a stand-in sklearn.datasets.load_digits: 10 classes of 30 images."""
    rng = np.random.default_rng(0)
    target = np.repeat(np.arange(10), 30)
    images = rng.integers(0, 17, size=(300, 64)).astype(np.float64)
    datasets = types.ModuleType("sklearn.datasets")
    datasets.load_digits = lambda: types.SimpleNamespace(data=images, target=target)
    package = types.ModuleType("sklearn")
    package.datasets = datasets
    monkeypatch.setitem(sys.modules, "sklearn", package)
    monkeypatch.setitem(sys.modules, "sklearn.datasets", datasets)
    return images, target


def test_digits_scales_and_splits_stratified(monkeypatch):
    images, _ = _fake_sklearn(monkeypatch)
    d = digits(test_fraction=0.2, seed=4)
    assert d.x_train.shape == (240, 1, 8, 8) and d.x_test.shape == (60, 1, 8, 8)
    assert (np.bincount(d.y_test, minlength=10) == 6).all()
    # Every image appears once, scaled by 1/16.
    rows = np.concatenate([d.x_train, d.x_test]).reshape(300, 64) * 16
    assert sorted(map(bytes, rows.astype(np.uint8))) == sorted(map(bytes,
                                                                   images.astype(np.uint8)))
    again = digits(test_fraction=0.2, seed=4)
    assert np.array_equal(d.x_train, again.x_train) and np.array_equal(d.y_test, again.y_test)


def test_libsvm_index_beyond_the_readers_int_names_the_line(tmp_path):
    path = _write(tmp_path / "hashed.svm", "1 1:1\n-1 99999999999:1\n")
    with pytest.raises(ConfigError, match=r"hashed\.svm, line 2: a feature index is 2\*\*31"):
        load_libsvm(path)


def test_libsvm_without_sklearn_says_what_to_do(monkeypatch, tmp_path):
    path = _write(tmp_path / "small.svm", SMALL)
    monkeypatch.setitem(sys.modules, "sklearn", None)
    monkeypatch.setitem(sys.modules, "sklearn.datasets", None)
    with pytest.raises(ConfigError) as info:
        load(str(path))
    # the missing extra itself, not a bad line 1 nor a wrapped "bad option value"
    assert str(info.value) == ("reading LIBSVM files needs scikit-learn: pip install "
                               "'asapmpi[train]'"), info.value


def test_digits_without_sklearn_says_what_to_do(monkeypatch):
    monkeypatch.setitem(sys.modules, "sklearn", None)
    monkeypatch.setitem(sys.modules, "sklearn.datasets", None)
    with pytest.raises(ConfigError, match=r"scikit-learn: pip install 'asapmpi\[train\]'"):
        digits()


def test_digits_from_scikit_learn():
    pytest.importorskip("sklearn")
    d = digits()
    assert len(d.x_train) + len(d.x_test) == 1797
    assert d.x_train.shape[1:] == (1, 8, 8) and d.x_train.dtype == np.float32
    assert d.x_train.min() == 0.0 and d.x_train.max() == 1.0 and d.n_classes == 10
    assert abs(len(d.x_test) / 1797 - 0.25) < 0.01


# ------------------------------------------------------------------------------------------
# Shards and batches
# ------------------------------------------------------------------------------------------

@pytest.mark.parametrize(("n", "size"), [(10, 1), (10, 3), (12, 4), (7, 7), (1000, 6)])
def test_shards_partition_the_examples(n, size):
    shards = [shard(n, rank, size) for rank in range(size)]
    assert sorted(np.concatenate(shards).tolist()) == list(range(n))
    assert max(map(len, shards)) - min(map(len, shards)) <= 1


def test_shard_errors():
    with pytest.raises(ConfigError, match="fewer ranks"):
        shard(3, 0, 4)
    with pytest.raises(ConfigError, match="rank"):
        shard(10, 4, 4)


def test_batches_are_a_pure_function_of_their_arguments():
    indices = shard(1000, 1, 4)
    first = batch_indices(indices, 32, 17, seed=9, rank=1)
    for iteration in range(40):  # fill the cache with other epochs
        batch_indices(indices, 32, iteration, seed=9, rank=1)
    data._PERMUTATIONS.clear()
    again = batch_indices(indices, 32, 17, seed=9, rank=1)
    np.testing.assert_array_equal(first, again)
    assert len(first) == 32 and set(first.tolist()) <= set(indices.tolist())
    assert not np.array_equal(first, batch_indices(indices, 32, 17, seed=10, rank=1))
    assert not np.array_equal(first, batch_indices(indices, 32, 17, seed=9, rank=2))


def test_batches_cover_each_epoch_once():
    indices = shard(400, 0, 2)  # 200 examples
    epochs = [np.concatenate([batch_indices(indices, 50, 4 * e + i, 0, 0) for i in range(4)])
              for e in range(3)]
    for epoch in epochs:
        assert sorted(epoch.tolist()) == indices.tolist()
    assert not np.array_equal(epochs[0], epochs[1])  # reshuffled every epoch


def test_batches_wrap_into_the_next_epoch():
    indices = np.arange(10) * 3
    batches = [batch_indices(indices, 4, i, 1, 0) for i in range(5)]  # 20 = two epochs
    assert all(len(b) == 4 for b in batches)
    stream = np.concatenate(batches)
    assert sorted(stream[:10].tolist()) == indices.tolist()
    assert sorted(stream[10:].tolist()) == indices.tolist()
    with pytest.raises(ConfigError, match="batch_size"):
        batch_indices(indices, 11, 0, 1, 0)


# ------------------------------------------------------------------------------------------
# Dispatch and the container
# ------------------------------------------------------------------------------------------

def test_load_dispatches_by_name_and_path(tmp_path):
    images = load("synthetic-images", n_train=20, n_test=10, seed=1)
    assert images.name == "synthetic-images" and len(images.x_train) == 20
    svm = load("synthetic-svm", n_train=50, n_test=10, n_features=100)
    assert svm.x_train.shape == (50, 100)
    path = _write(tmp_path / "small.svm", SMALL)
    from_file = load(str(path), test_path=str(path))
    np.testing.assert_array_equal(from_file.x_test.toarray(), SMALL_DENSE)
    with pytest.raises(ConfigError, match="synthetic-svm, digits, synthetic-images"):
        load("mnist")
    with pytest.raises(ConfigError, match="no option batch"):
        load("synthetic-images", batch=3)
    bad = _write(tmp_path / "bad.svm", "1 1:1\n1 x:y\n")
    with pytest.raises(ConfigError, match=r"^\S*bad\.svm, line 2: ") as info:
        load(str(bad))                  # the loader's own message, not re-wrapped
    assert "bad option value" not in str(info.value)


def test_dataset_checks_lengths():
    x = np.zeros((3, 2), dtype=np.float32)
    with pytest.raises(ConfigError, match="y_train"):
        Dataset(x, np.zeros(2, dtype=np.int64), x, np.zeros(3, dtype=np.int64), 2, "t", (2,))
