"""Serial tests of the dependency-free PNG canvas and the communication-graph drawer."""
import binascii
import struct
import zlib

import numpy as np
import pytest

from asapmpi.plot.canvas import FONT, Canvas, text_size
from asapmpi.plot.graph_png import NODE_COLOR, draw_graph, node_layout

WHITE = (255, 255, 255)
BLACK = (0, 0, 0)


def decode_png(data: bytes) -> np.ndarray:
    """Decode an 8-bit RGB, unfiltered PNG into (height, width, 3), checking every CRC."""
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    pos, chunks = 8, []
    while pos < len(data):
        (length,) = struct.unpack(">I", data[pos:pos + 4])
        tag, body = data[pos + 4:pos + 8], data[pos + 8:pos + 8 + length]
        (crc,) = struct.unpack(">I", data[pos + 8 + length:pos + 12 + length])
        assert crc == binascii.crc32(tag + body) & 0xFFFFFFFF, tag
        chunks.append((tag, body))
        pos += 12 + length
    assert pos == len(data)
    tags = [tag for tag, _ in chunks]
    assert tags[0] == b"IHDR" and tags[-1] == b"IEND" and b"IDAT" in tags
    width, height, depth, ctype, comp, filt, interlace = struct.unpack(">IIBBBBB", chunks[0][1])
    assert (depth, ctype, comp, filt, interlace) == (8, 2, 0, 0, 0)
    raw = zlib.decompress(b"".join(body for tag, body in chunks if tag == b"IDAT"))
    assert len(raw) == height * (1 + 3 * width)
    rows = np.frombuffer(raw, dtype=np.uint8).reshape(height, 1 + 3 * width)
    assert np.all(rows[:, 0] == 0), "every scanline uses filter type 0"
    return rows[:, 1:].reshape(height, width, 3)


def painted(canvas: Canvas, background=WHITE) -> np.ndarray:
    """Boolean (height, width) mask of the pixels that differ from the background."""
    return np.any(canvas.pixels != np.array(background, dtype=np.uint8), axis=2)


def test_png_round_trip_and_file(tmp_path):
    c = Canvas(37, 21, background=(10, 20, 30))
    c.pixels[5, 7] = (200, 100, 50)
    c.rect(20, 2, 30, 10, "#ff0000")
    decoded = decode_png(c.to_png_bytes())
    assert decoded.shape == (21, 37, 3)
    assert np.array_equal(decoded, c.pixels)
    path = c.save_png(tmp_path / "x.png")
    assert np.array_equal(decode_png(path.read_bytes()), c.pixels)


def test_line_colours_its_pixels_and_nothing_far_away():
    c = Canvas(80, 60)
    x0, y0, x1, y1 = 10.0, 12.0, 70.0, 47.0
    c.line(x0, y0, x1, y1, BLACK)
    for t in np.linspace(0, 1, 25):
        x, y = round(x0 + t * (x1 - x0)), round(y0 + t * (y1 - y0))
        assert painted(c)[y, x], (x, y)
    # Distance of every pixel centre to the segment.
    Y, X = np.mgrid[0:60, 0:80].astype(float)
    dx, dy = x1 - x0, y1 - y0
    t = np.clip(((X - x0) * dx + (Y - y0) * dy) / (dx * dx + dy * dy), 0, 1)
    dist = np.hypot(X - x0 - t * dx, Y - y0 - t * dy)
    assert not painted(c)[dist > 1.5].any()


def test_thick_horizontal_line_has_its_width():
    c = Canvas(60, 40)
    c.line(5, 20, 55, 20, BLACK, width=5)
    column = painted(c)[:, 30]
    assert column[18:23].all() and not column[:17].any() and not column[24:].any()
    assert np.array_equal(c.pixels[20, 30], BLACK)


def test_long_line_pieces_do_not_double_blend():
    # The line is drawn in pieces; a uniform horizontal line must have one shade per row.
    c = Canvas(400, 20)
    c.line(0, 10.5, 399, 10.5, BLACK)
    assert len(np.unique(c.pixels[10, 1:-1, 0])) == 1
    assert len(np.unique(c.pixels[11, 1:-1, 0])) == 1


@pytest.mark.parametrize("anchor", ["left", "center", "right"])
def test_text_stays_inside_its_box(anchor):
    c = Canvas(300, 40)
    box = c.text(150, 10, "Ab1 (x=2%)", (200, 0, 0), scale=2, anchor=anchor)
    x0, y0, x1, y1 = box
    w, h = text_size("Ab1 (x=2%)", 2)
    assert (x1 - x0 + 1, y1 - y0 + 1) == (w, h)
    assert {"left": x0, "center": (x0 + x1) / 2, "right": x1}[anchor] == pytest.approx(150, abs=1)
    mask = painted(c)
    assert mask[y0:y1 + 1, x0:x1 + 1].any()
    mask[y0:y1 + 1, x0:x1 + 1] = False
    assert not mask.any()


def test_font_covers_the_required_characters():
    import string
    required = string.digits + string.ascii_letters + " .,:-+=()/%_"
    assert set(required) <= set(FONT)
    for char in required:
        assert FONT[char].shape == (7, 5)
        assert FONT[char].any() == (char != " "), char
    # Different characters must look different.
    shapes = {FONT[ch].tobytes() for ch in required}
    assert len(shapes) == len(required)


def test_unknown_characters_draw_something():
    c = Canvas(40, 20)
    c.text(2, 2, "\u00e9", BLACK, scale=1)
    assert painted(c).any()


def test_arrow_points_at_its_end_and_is_shortened():
    c = Canvas(80, 40)
    c.arrow(10, 20, 70, 20, BLACK, head=10, shorten=5)
    mask = painted(c)

    def span(x):
        return int(mask[:, x].sum())

    # The head widens toward the start of the head, behind the (shortened) tip at x=65.
    assert span(57) > 3 and span(20) <= 2
    assert not mask[:, :13].any() and not mask[:, 67:].any()


def test_double_headed_arrow():
    c = Canvas(80, 40)
    c.arrow(10, 20, 70, 20, BLACK, head=10, both=True)
    mask = painted(c)
    assert mask[:, 15].sum() > 3 and mask[:, 65].sum() > 3 and mask[:, 40].sum() <= 2


def test_shapes_fill_where_expected():
    c = Canvas(60, 60)
    c.disc(20, 20, 8, BLACK)
    c.circle(45, 45, 10, BLACK)
    c.rect(2, 50, 10, 58, BLACK, fill=False)
    assert np.array_equal(c.pixels[20, 20], BLACK) and np.array_equal(c.pixels[26, 20], BLACK)
    assert not painted(c)[20, 30]
    assert painted(c)[45, 55] and not painted(c)[45, 45]
    assert painted(c)[50, 6] and painted(c)[54, 2] and not painted(c)[54, 6]


def test_drawing_outside_the_canvas_is_clipped_without_errors():
    c = Canvas(30, 20)
    far = 1e12
    c.line(-far, -far, -far + 5, -far, BLACK, width=3)
    c.line(-far, 10, far, 10, BLACK)                    # crosses the whole canvas
    c.line(float("nan"), 0, 5, 5, BLACK)
    c.arrow(-500, -500, 1000, 1000, BLACK, head=20, shorten=3)
    c.disc(-1000, 5, 3, BLACK)
    c.disc(0, 0, 5, BLACK)                              # a quarter is visible
    c.circle(15, 10, 1e6, BLACK)
    c.rect(-far, -far, far, -far / 2, BLACK)
    c.rect(-5, -5, 2, 2, BLACK, fill=False)
    c.polygon([(-100, -100), (-90, -100), (-95, -80)], BLACK)
    c.text(-50, -50, "far away", BLACK, scale=3)
    c.text(25, 15, "edge", BLACK, scale=3)
    assert np.array_equal(c.pixels[0, 0], BLACK) and np.array_equal(c.pixels[10, 15], BLACK)
    assert c.pixels.shape == (20, 30, 3)


def test_layout_puts_node_zero_on_top_and_goes_clockwise():
    centres, node_r, _ = node_layout(8, 400, title="t")
    assert np.argmin(centres[:, 1]) == 0
    assert centres[0, 0] == pytest.approx(200)
    assert centres[2, 0] > centres[0, 0] and centres[2, 1] == pytest.approx(centres[6, 1])
    gaps = np.hypot(*(centres - np.roll(centres, -1, axis=0)).T)
    assert np.all(gaps > 2 * node_r)


@pytest.mark.parametrize("n", [1, 6, 25, 200])
def test_draw_graph_writes_a_png_with_nodes(tmp_path, n):
    edges = [(i, (i + 1) % n) for i in range(n)] + [(i, (i + 2) % n) for i in range(n)]
    edges += [(0, n - 1)] if n > 1 else []   # with ring edge (n-1, 0): a two-way pair
    path = draw_graph(n, edges, tmp_path / f"g{n}.png", title=f"n = {n}", size=320)
    pixels = decode_png(path.read_bytes())
    assert pixels.shape == (320, 320, 3)
    is_node = np.all(pixels == np.array(NODE_COLOR, dtype=np.uint8), axis=2)
    assert is_node.any()
    centres, node_r, labels = node_layout(n, 320, title=f"n = {n}")
    # Node 0 is drawn where the layout says (checked away from its label).
    x, y = centres[0]
    probe_y = y + (0.85 * node_r if labels else 0)
    assert is_node[round(probe_y), round(x)]


def test_draw_graph_rejects_bad_edges(tmp_path):
    with pytest.raises(ValueError, match="outside"):
        draw_graph(4, [(0, 4)], tmp_path / "bad.png")
