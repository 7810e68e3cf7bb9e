"""Serial tests of the plots: matplotlib PNGs of the asked size, round ticks, the
communication-graph drawer's layout and arrows."""
import struct
import zlib

import numpy as np
import pytest
from matplotlib.figure import Figure
from matplotlib.image import imread

from asapmpi.plot.bars import bar_chart
from asapmpi.plot.graph_png import NODE_COLOR, arrow_geometry, draw_graph, node_layout
from asapmpi.plot.lines import line_chart, line_panels
from asapmpi.plot.style import round_ticks


def png_info(path):
    """(width, height, {tEXt key: value}) of a PNG, checking its signature and CRCs."""
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    pos, text, size = 8, {}, None
    while pos < len(data):
        (length,) = struct.unpack(">I", data[pos:pos + 4])
        tag, body = data[pos + 4:pos + 8], data[pos + 8:pos + 8 + length]
        (crc,) = struct.unpack(">I", data[pos + 8 + length:pos + 12 + length])
        assert crc == zlib.crc32(tag + body) & 0xFFFFFFFF, tag
        if tag == b"IHDR":
            size = struct.unpack(">II", body[:8])
        elif tag == b"tEXt":
            key, _, value = body.partition(b"\0")
            text[key.decode()] = value.decode("latin-1")
        pos += 12 + length
    return size[0], size[1], text


def assert_matplotlib_png(path, width, height):
    """A PNG of exactly width x height pixels, written by matplotlib, not blank."""
    w, h, text = png_info(path)
    assert (w, h) == (width, height)
    assert text["Software"].startswith("Matplotlib")
    pixels = imread(path)[..., :3]
    assert len(np.unique(pixels.reshape(-1, 3), axis=0)) > 20  # lines, text, antialiasing


def test_line_chart_is_a_matplotlib_png_of_the_asked_size(tmp_path):
    t = np.linspace(0, 67.91, 50)
    path = line_chart({"a": (t, 22.64 + t), "b": (t, 2 * t)}, tmp_path / "c.png",
                      title="t", xlabel="s", ylabel="it", width=640, height=400)
    assert_matplotlib_png(path, 640, 400)


def test_line_panels_share_one_legend_and_take_panel_y_labels(tmp_path):
    over_time = {"x": ([0, 1, 2], [1, 2, 3]), "y": ([0, 1], [3, 1])}
    over_iters = {"y": ([0, 10], [1, 1])}
    path = line_panels([(over_time, "time (s)"), (over_iters, "iterations", "loss")],
                       tmp_path / "p.png", title="two", ylabel="accuracy", panel_width=300,
                       height=240)
    assert_matplotlib_png(path, 600, 240)
    with pytest.raises(ValueError, match="3 x values but 2 y values"):
        line_chart({"bad": ([0, 1, 2], [1, 2])}, tmp_path / "bad.png")
    with pytest.raises(ValueError, match="at least one panel"):
        line_panels([], tmp_path / "none.png")


def test_many_series_still_draw(tmp_path):
    series = {f"rank {r}": (np.arange(100) * (1 + r / 50), np.arange(100)) for r in range(64)}
    assert_matplotlib_png(line_chart(series, tmp_path / "many.png"), 800, 480)


@pytest.mark.parametrize(("low", "high"), [(0, 67.91), (22.64, 91.3), (0, 1e-3), (3, 4)])
def test_ticks_are_round_numbers(low, high):
    ax = Figure().add_subplot()
    ax.plot([low, high], [low, high])
    round_ticks(ax)
    ticks = [t for t in ax.get_yticks() if low <= t <= high]
    assert len(ticks) >= 3
    step = ticks[1] - ticks[0]
    mantissa = step / 10 ** np.floor(np.log10(step))
    assert any(np.isclose(mantissa, m) for m in (1, 2, 2.5, 5))
    assert all(np.isclose(t / step, round(t / step)) for t in ticks)


def test_bar_chart(tmp_path):
    path = bar_chart(["0", "1", "2"], {"a": [10, 20, 70], "b": [0, 0, 100]},
                     tmp_path / "b.png", title="t", ylabel="%", xlabel="k", ymax=100,
                     width=500, height=300)
    assert_matplotlib_png(path, 500, 300)
    with pytest.raises(ValueError, match="2 values for 3 categories"):
        bar_chart(["0", "1", "2"], {"a": [1, 2]}, tmp_path / "x.png")


def test_layout_puts_node_zero_on_top_and_goes_clockwise():
    centres, node_r, _ = node_layout(8, 400, title="t")
    assert np.argmin(centres[:, 1]) == 0
    assert centres[0, 0] == pytest.approx(200)
    assert centres[2, 0] > centres[0, 0] and centres[2, 1] == pytest.approx(centres[6, 1])
    gaps = np.hypot(*(centres - np.roll(centres, -1, axis=0)).T)
    assert np.all(gaps > 2 * node_r)


def test_labels_only_while_they_fit():
    assert node_layout(8, 640)[2] > 0
    assert node_layout(1000, 640)[2] == 0


def test_arrows_stop_short_of_the_nodes_and_mutual_pairs_get_two_heads():
    centres = np.array([[0.0, 0.0], [100.0, 0.0], [0.0, 100.0]])
    shafts, heads = arrow_geometry(centres, [(0, 1, False), (0, 2, True)], node_r=10)
    assert shafts.shape == (2, 2, 2) and heads.shape == (3, 3, 2)
    tips = heads[:, 0]
    # The one-way arrow points at node 1, 10 px radius + 2 px gap before its centre.
    assert tips[0] == pytest.approx([88, 0])
    # The mutual pair has a head at each end.
    assert sorted(map(tuple, tips[1:].round(6))) == [(0, 12), (0, 88)]
    assert shafts[0, 0] == pytest.approx([12, 0])


@pytest.mark.parametrize("n", [1, 6, 25, 200])
def test_draw_graph_writes_a_png_with_nodes(tmp_path, n):
    edges = [(i, (i + 1) % n) for i in range(n)] + [(i, (i + 2) % n) for i in range(n)]
    edges += [(0, n - 1)] if n > 1 else []   # with ring edge (n-1, 0): a two-way pair
    path = draw_graph(n, edges, tmp_path / f"g{n}.png", title=f"n = {n}", size=320)
    assert_matplotlib_png(path, 320, 320)
    pixels = np.round(imread(path)[..., :3] * 255).astype(int)
    is_node = np.all(pixels == np.array(NODE_COLOR), axis=2)
    centres, node_r, labels = node_layout(n, 320, title=f"n = {n}")
    # Node 0 is drawn where the layout says (checked away from its label).
    x, y = centres[0]
    probe_y = y + (0.85 * node_r if labels else 0)
    assert is_node[int(probe_y), int(x)]
    assert not is_node[5, 5]


def test_draw_graph_rejects_bad_edges(tmp_path):
    with pytest.raises(ValueError, match="outside"):
        draw_graph(4, [(0, 4)], tmp_path / "bad.png")
