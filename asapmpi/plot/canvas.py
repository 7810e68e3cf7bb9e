"""A small raster canvas on a NumPy uint8 RGB array, written out as PNG with the stdlib only.

    c = Canvas(200, 100)
    c.line(10, 10, 190, 90, (0, 0, 0), width=2)
    c.text(100, 5, "Hello", (200, 0, 0), anchor="center")
    c.save_png("hello.png")

Coordinates are pixels as floats; pixel (i, j) is the unit square centred on (i, j), with
x to the right and y downwards.  Lines, discs, circles, polygons and arrows are
anti-aliased from an exact distance field over their bounding box, so the cost is
proportional to the area they touch.  Anything outside the canvas is clipped; non-finite
coordinates draw nothing.
"""
from __future__ import annotations

import binascii
import math
import os
import struct
import zlib
from typing import Dict, Optional, Sequence, Tuple, Union

import numpy as np

Color = Union[Sequence[int], str]
Box = Tuple[int, int, int, int]

# A 5x7 bitmap font.  Each glyph is 7 rows, top to bottom, written as 14 hex digits: one
# byte per row whose low 5 bits are the pixels, bit 4 being the leftmost column.  The
# lowercase letters follow the HD44780 character ROM, whose descenders fit in the 7 rows.
_FONT_HEX = {
    " ": "00000000000000", "!": "04040404000004", '"': "0A0A0A00000000",
    "#": "0A0A1F0A1F0A0A", "%": "18190204081303", "'": "0C040800000000",
    "(": "02040808080402", ")": "08040202020408", "*": "0004150E150400",
    "+": "0004041F040400", ",": "000000000C0408", "-": "0000001F000000",
    ".": "00000000000C0C", "/": "00010204081000", ":": "000C0C000C0C00",
    ";": "000C0C000C0408", "<": "02040810080402", "=": "00001F001F0000",
    ">": "08040201020408", "?": "0E110102040004", "[": "0E08080808080E",
    "]": "0E02020202020E", "_": "0000000000001F", "|": "04040404040404",
    "0": "0E11131519110E", "1": "040C040404040E", "2": "0E11010204081F",
    "3": "1F02040201110E", "4": "02060A121F0202", "5": "1F101E0101110E",
    "6": "0608101E11110E", "7": "1F010204080808", "8": "0E11110E11110E",
    "9": "0E11110F01020C",
    "A": "0E1111111F1111", "B": "1E11111E11111E", "C": "0E11101010110E",
    "D": "1C12111111121C", "E": "1F10101E10101F", "F": "1F10101E101010",
    "G": "0E11101711110F", "H": "1111111F111111", "I": "0E04040404040E",
    "J": "0702020202120C", "K": "11121418141211", "L": "1010101010101F",
    "M": "111B1515111111", "N": "11111915131111", "O": "0E11111111110E",
    "P": "1E11111E101010", "Q": "0E11111115120D", "R": "1E11111E141211",
    "S": "0F10100E01011E", "T": "1F040404040404", "U": "1111111111110E",
    "V": "11111111110A04", "W": "1111111515150A",
    "X": "11110A040A1111", "Y": "1111110A040404", "Z": "1F01020408101F",
    "a": "00000E010F110F", "b": "1010161911111E", "c": "00000E1010110E",
    "d": "01010D1311110F", "e": "00000E111F100E", "f": "0609081C080808",
    "g": "000F11110F010E", "h": "10101619111111", "i": "04000C0404040E",
    "j": "0200060202120C", "k": "10101214181412",
    "l": "0C04040404040E", "m": "00001A15151111", "n": "00001619111111",
    "o": "00000E1111110E", "p": "00001E111E1010", "q": "00000D130F0101",
    "r": "00001619101010", "s": "00000E100E011E", "t": "08081C08080906",
    "u": "0000111111130D", "v": "00001111110A04",
    "w": "0000111115150A", "x": "0000110A040A11", "y": "000011110F010E",
    "z": "00001F0204081F",
}

GLYPH_W, GLYPH_H = 5, 7
ADVANCE = GLYPH_W + 1  # one blank column between characters

# Long segments are drawn in pieces of about this many pixels so that the distance field
# is evaluated near the segment only, not over its whole (possibly canvas-sized) box.
_PIECE = 32.0


def _decode_font(table: Dict[str, str]) -> Dict[str, np.ndarray]:
    """Turn the hex glyph table into boolean (GLYPH_H, GLYPH_W) arrays."""
    shifts = np.arange(GLYPH_W - 1, -1, -1)
    font = {}
    for char, digits in table.items():
        rows = np.frombuffer(bytes.fromhex(digits), dtype=np.uint8)
        if rows.size != GLYPH_H:
            raise ValueError(f"glyph {char!r} has {rows.size} rows, expected {GLYPH_H}")
        font[char] = ((rows[:, None] >> shifts) & 1).astype(bool)
    return font


FONT = _decode_font(_FONT_HEX)


def text_size(string: str, scale: int = 2) -> Tuple[int, int]:
    """Return the (width, height) in pixels of `string` drawn at `scale`."""
    if not string:
        return 0, 0
    return (len(string) * ADVANCE - 1) * scale, GLYPH_H * scale


def text_mask(string: str, scale: int = 2) -> np.ndarray:
    """Return the boolean (height, width) pixel mask of `string` drawn at `scale`.

    Characters missing from the font are drawn as '?'.
    """
    width, height = text_size(string, 1)
    mask = np.zeros((height, width), dtype=bool)
    for k, char in enumerate(string):
        glyph = FONT.get(char, FONT["?"])
        mask[:, k * ADVANCE:k * ADVANCE + GLYPH_W] = glyph
    if scale > 1:
        mask = mask.repeat(scale, axis=0).repeat(scale, axis=1)
    return mask


def _rgb(color: Color) -> np.ndarray:
    """Parse (r, g, b) or '#rrggbb' into a float array of three 0..255 values."""
    if isinstance(color, str):
        digits = color.lstrip("#")
        if len(digits) != 6:
            raise ValueError(f"colour strings look like '#rrggbb', got {color!r}")
        color = tuple(bytes.fromhex(digits))
    rgb = np.asarray(color, dtype=np.float64)
    if rgb.shape != (3,) or np.any(rgb < 0) or np.any(rgb > 255):
        raise ValueError(f"colour must be three values in 0..255, got {color!r}")
    return rgb


def _finite(*values: float) -> bool:
    """True when every value is a finite number (NaN or inf coordinates draw nothing)."""
    return all(math.isfinite(v) for v in values)


def _round(value: float) -> int:
    """Round half up; Python's round() rounds half to even, which shifts text unevenly."""
    return math.floor(value + 0.5)


def _clip_segment(x0: float, y0: float, dx: float, dy: float,
                  box: Tuple[float, float, float, float]) -> Optional[Tuple[float, float]]:
    """Liang-Barsky: the parameter range [t0, t1] of p0 + t*d inside `box`, or None."""
    xmin, ymin, xmax, ymax = box
    t0, t1 = 0.0, 1.0
    for p, q in ((-dx, x0 - xmin), (dx, xmax - x0), (-dy, y0 - ymin), (dy, ymax - y0)):
        if p == 0:
            if q < 0:
                return None
        elif p < 0:
            t0 = max(t0, q / p)
        else:
            t1 = min(t1, q / p)
    return (t0, t1) if t0 <= t1 else None


def _segment_distance(X: np.ndarray, Y: np.ndarray, x0: float, y0: float,
                      x1: float, y1: float) -> Tuple[np.ndarray, np.ndarray]:
    """Distance from each (X, Y) to the segment, and the unclamped projection parameter."""
    dx, dy = x1 - x0, y1 - y0
    length2 = dx * dx + dy * dy
    if length2 == 0:
        return np.hypot(X - x0, Y - y0), np.zeros_like(X)
    t = ((X - x0) * dx + (Y - y0) * dy) / length2
    tc = np.clip(t, 0.0, 1.0)
    return np.hypot(X - (x0 + tc * dx), Y - (y0 + tc * dy)), t


class Canvas:
    """An RGB raster of `width` x `height` pixels, stored as `pixels[y, x, channel]`."""

    def __init__(self, width: int, height: int, background: Color = (255, 255, 255)):
        """Create a canvas filled with `background`."""
        if int(width) != width or int(height) != height or width < 1 or height < 1:
            raise ValueError(f"canvas size must be positive integers, got {width}x{height}")
        self.width, self.height = int(width), int(height)
        self.pixels = np.empty((self.height, self.width, 3), dtype=np.uint8)
        self.pixels[...] = _rgb(background).astype(np.uint8)

    # -- internals ---------------------------------------------------------------------

    def _grid(self, xmin: float, ymin: float, xmax: float,
              ymax: float) -> Optional[Tuple[int, int, np.ndarray, np.ndarray]]:
        """Pixel-centre coordinate grids of the box clipped to the canvas, or None if empty.

        Returns (ix, iy, X, Y) where (ix, iy) is the top-left pixel of the grids.
        """
        if not _finite(xmin, ymin, xmax, ymax):
            return None
        ix0, iy0 = max(0, math.floor(xmin)), max(0, math.floor(ymin))
        ix1, iy1 = min(self.width - 1, math.ceil(xmax)), min(self.height - 1, math.ceil(ymax))
        if ix0 > ix1 or iy0 > iy1:
            return None
        Y, X = np.mgrid[iy0:iy1 + 1, ix0:ix1 + 1].astype(np.float64)
        return ix0, iy0, X, Y

    def _blend(self, ix: int, iy: int, coverage: np.ndarray, rgb: np.ndarray) -> None:
        """Alpha-blend `rgb` into the block at (ix, iy) with per-pixel `coverage` in 0..1."""
        h, w = coverage.shape
        block = self.pixels[iy:iy + h, ix:ix + w]
        alpha = coverage[..., None]
        block[...] = np.rint(block * (1.0 - alpha) + rgb * alpha).astype(np.uint8)

    def _fill_block(self, x0: int, y0: int, x1: int, y1: int, rgb: np.ndarray) -> None:
        """Set the pixels x0..x1, y0..y1 (inclusive, clipped) to `rgb`."""
        x0, y0 = max(x0, 0), max(y0, 0)
        x1, y1 = min(x1, self.width - 1), min(y1, self.height - 1)
        if x0 <= x1 and y0 <= y1:
            self.pixels[y0:y1 + 1, x0:x1 + 1] = rgb.astype(np.uint8)

    # -- primitives --------------------------------------------------------------------

    def line(self, x0: float, y0: float, x1: float, y1: float, color: Color,
             width: float = 1) -> None:
        """Draw an anti-aliased segment with round caps, `width` pixels thick."""
        if not _finite(x0, y0, x1, y1, width) or width <= 0:
            return
        rgb, r = _rgb(color), width / 2.0
        dx, dy = x1 - x0, y1 - y0
        if not _finite(dx, dy):
            return
        # Only the part of the segment near the canvas can colour anything.
        margin = r + 1.0
        span = _clip_segment(x0, y0, dx, dy, (-margin, -margin, self.width - 1 + margin,
                                              self.height - 1 + margin))
        if span is None:
            return
        t_lo, t_hi = span
        # Thick lines get longer pieces: each piece's box is at least 2*margin wide anyway.
        piece = max(_PIECE, 4 * margin)
        pieces = max(1, math.ceil(math.hypot(dx, dy) * (t_hi - t_lo) / piece))
        for k in range(pieces):
            ta = t_lo + (t_hi - t_lo) * k / pieces
            tb = t_lo + (t_hi - t_lo) * (k + 1) / pieces
            ax, ay, bx, by = x0 + ta * dx, y0 + ta * dy, x0 + tb * dx, y0 + tb * dy
            grid = self._grid(min(ax, bx) - margin, min(ay, by) - margin,
                              max(ax, bx) + margin, max(ay, by) + margin)
            if grid is None:
                continue
            ix, iy, X, Y = grid
            dist, t = _segment_distance(X, Y, x0, y0, x1, y1)
            coverage = np.clip(r + 0.5 - dist, 0.0, 1.0)
            # The piece boxes overlap; give each pixel to exactly one piece (by where it
            # projects onto the segment) so that no pixel is blended twice.
            if k > 0:
                coverage[t < ta] = 0.0
            if k < pieces - 1:
                coverage[t >= tb] = 0.0
            self._blend(ix, iy, coverage, rgb)

    def disc(self, x: float, y: float, r: float, color: Color) -> None:
        """Draw a filled, anti-aliased disc of radius `r` centred on (x, y)."""
        if not _finite(x, y, r) or r <= 0:
            return
        grid = self._grid(x - r - 1, y - r - 1, x + r + 1, y + r + 1)
        if grid is None:
            return
        ix, iy, X, Y = grid
        coverage = np.clip(r + 0.5 - np.hypot(X - x, Y - y), 0.0, 1.0)
        self._blend(ix, iy, coverage, _rgb(color))

    def circle(self, x: float, y: float, r: float, color: Color, width: float = 1) -> None:
        """Draw an anti-aliased circle outline of radius `r`, `width` pixels thick."""
        if not _finite(x, y, r, width) or r < 0 or width <= 0:
            return
        reach = r + width / 2 + 1
        grid = self._grid(x - reach, y - reach, x + reach, y + reach)
        if grid is None:
            return
        ix, iy, X, Y = grid
        ring = np.abs(np.hypot(X - x, Y - y) - r)
        self._blend(ix, iy, np.clip(width / 2 + 0.5 - ring, 0.0, 1.0), _rgb(color))

    def polygon(self, points: Sequence[Tuple[float, float]], color: Color) -> None:
        """Fill a convex polygon, anti-aliased; the vertex order may be either way round."""
        pts = np.asarray(points, dtype=np.float64).reshape(-1, 2)
        if len(pts) < 3 or not np.all(np.isfinite(pts)):
            return
        # Twice the signed area tells the winding, so "inside" is the same side of every edge.
        nxt = np.roll(pts, -1, axis=0)
        area2 = float(np.sum(pts[:, 0] * nxt[:, 1] - nxt[:, 0] * pts[:, 1]))
        edges = nxt - pts
        lengths = np.hypot(edges[:, 0], edges[:, 1])
        if area2 == 0 or np.any(lengths == 0):
            return
        grid = self._grid(pts[:, 0].min() - 1, pts[:, 1].min() - 1,
                          pts[:, 0].max() + 1, pts[:, 1].max() + 1)
        if grid is None:
            return
        ix, iy, X, Y = grid
        inside = np.full(X.shape, np.inf)
        sign = 1.0 if area2 > 0 else -1.0
        for (px, py), (ex, ey), length in zip(pts, edges, lengths):
            # Signed distance to the edge's line, positive on the polygon's side.
            dist = sign * (ex * (Y - py) - ey * (X - px)) / length
            np.minimum(inside, dist, out=inside)
        self._blend(ix, iy, np.clip(inside + 0.5, 0.0, 1.0), _rgb(color))

    def arrow(self, x0: float, y0: float, x1: float, y1: float, color: Color,
              head: float = 8, shorten: float = 0, width: float = 1,
              both: bool = False) -> None:
        """Draw an arrow from (x0, y0) to (x1, y1), the head at (x1, y1).

        Both ends are pulled in by `shorten` pixels (so arrows between node circles stop
        at the circles); `head` is the head's length; `both` puts a head at each end.
        Nothing is drawn when the shortened arrow has no length left.
        """
        if not _finite(x0, y0, x1, y1, head, shorten, width):
            return
        length = math.hypot(x1 - x0, y1 - y0)
        left = length - 2 * shorten
        if not math.isfinite(length) or left <= 0:
            return
        ux, uy = (x1 - x0) / length, (y1 - y0) / length
        ax, ay = x0 + ux * shorten, y0 + uy * shorten
        bx, by = x1 - ux * shorten, y1 - uy * shorten
        # Heads never grow past the arrow itself (half of it each when there are two).
        head = max(0.0, min(head, left / 2 if both else left))
        # The shaft stops inside the head, not at its tip, so a thick shaft cannot blunt it.
        back = 0.6 * head
        front = back if both else 0.0
        self.line(ax + ux * front, ay + uy * front, bx - ux * back, by - uy * back, color, width)
        self._head(bx, by, ux, uy, head, color)
        if both:
            self._head(ax, ay, -ux, -uy, head, color)

    def _head(self, tx: float, ty: float, ux: float, uy: float, head: float,
              color: Color) -> None:
        """Draw a triangular arrowhead with its tip at (tx, ty) pointing along (ux, uy)."""
        if head <= 0:
            return
        half = 0.45 * head
        cx, cy = tx - ux * head, ty - uy * head
        self.polygon([(tx, ty), (cx - uy * half, cy + ux * half),
                      (cx + uy * half, cy - ux * half)], color)

    def rect(self, x0: float, y0: float, x1: float, y1: float, color: Color,
             fill: bool = True) -> None:
        """Draw the pixels whose centres lie in the rectangle; filled or a 1-pixel outline."""
        if not _finite(x0, y0, x1, y1):
            return
        # Clamp before converting so that huge coordinates stay cheap integers.
        lo_x = max(-1, math.ceil(min(x0, x1)))
        lo_y = max(-1, math.ceil(min(y0, y1)))
        hi_x = min(self.width, math.floor(max(x0, x1)))
        hi_y = min(self.height, math.floor(max(y0, y1)))
        if lo_x > hi_x or lo_y > hi_y:
            return
        rgb = _rgb(color)
        if fill:
            self._fill_block(lo_x, lo_y, hi_x, hi_y, rgb)
            return
        for bx0, by0, bx1, by1 in ((lo_x, lo_y, hi_x, lo_y), (lo_x, hi_y, hi_x, hi_y),
                                   (lo_x, lo_y, lo_x, hi_y), (hi_x, lo_y, hi_x, hi_y)):
            self._fill_block(bx0, by0, bx1, by1, rgb)

    def text(self, x: float, y: float, string: str, color: Color, scale: int = 2,
             anchor: str = "left", valign: str = "top") -> Box:
        """Draw `string` in the built-in 5x7 font, each font pixel `scale` pixels square.

        `anchor` ("left", "center", "right") says which part of the text sits at x;
        `valign` ("top", "middle", "bottom") which part sits at y.  Returns the text's
        pixel box (x0, y0, x1, y1), inclusive, before clipping.
        """
        offsets = {"left": 0.0, "center": 0.5, "right": 1.0}
        voffsets = {"top": 0.0, "middle": 0.5, "bottom": 1.0}
        if anchor not in offsets or valign not in voffsets:
            raise ValueError(f"anchor must be one of {sorted(offsets)} and valign one of "
                             f"{sorted(voffsets)}, got {anchor!r}, {valign!r}")
        scale = int(scale)
        if scale < 1:
            raise ValueError(f"text scale must be a positive integer, got {scale}")
        rgb = _rgb(color)
        w, h = text_size(string, scale)
        if not _finite(x, y) or w == 0:
            return 0, 0, -1, -1
        left = _round(x - offsets[anchor] * (w - 1))
        top = _round(y - voffsets[valign] * (h - 1))
        self._stamp(left, top, text_mask(string, scale), rgb)
        return left, top, left + w - 1, top + h - 1

    def _stamp(self, left: int, top: int, mask: np.ndarray, rgb: np.ndarray) -> None:
        """Set the pixels where `mask` is true, with the mask's top-left at (left, top)."""
        h, w = mask.shape
        x0, y0 = max(left, 0), max(top, 0)
        x1, y1 = min(left + w, self.width), min(top + h, self.height)
        if x0 >= x1 or y0 >= y1:
            return
        sub = mask[y0 - top:y1 - top, x0 - left:x1 - left]
        self.pixels[y0:y1, x0:x1][sub] = rgb.astype(np.uint8)

    # -- output ------------------------------------------------------------------------

    def to_png_bytes(self, level: int = 6) -> bytes:
        """Encode the canvas as an 8-bit RGB PNG (IHDR, one IDAT, IEND)."""
        # Filter type 0 (none) on every scanline: a zero byte in front of each row.
        rows = np.zeros((self.height, 1 + 3 * self.width), dtype=np.uint8)
        rows[:, 1:] = self.pixels.reshape(self.height, 3 * self.width)
        # width, height, bit depth 8, colour type 2 (RGB), compression, filter, interlace
        ihdr = struct.pack(">IIBBBBB", self.width, self.height, 8, 2, 0, 0, 0)
        return b"".join([b"\x89PNG\r\n\x1a\n", _chunk(b"IHDR", ihdr),
                         _chunk(b"IDAT", zlib.compress(rows.tobytes(), level)),
                         _chunk(b"IEND", b"")])

    def save_png(self, path: Union[str, os.PathLike]) -> Union[str, os.PathLike]:
        """Write the canvas to `path` as a PNG file and return `path`."""
        with open(path, "wb") as f:
            f.write(self.to_png_bytes())
        return path


def _chunk(tag: bytes, data: bytes) -> bytes:
    """One PNG chunk: length, tag, data, and the CRC-32 of tag + data."""
    crc = binascii.crc32(tag + data) & 0xFFFFFFFF
    return struct.pack(">I", len(data)) + tag + data + struct.pack(">I", crc)
