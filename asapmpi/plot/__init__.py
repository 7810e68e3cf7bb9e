"""asapmpi's plots, drawn with matplotlib on its Agg canvas (no display needed): line
charts, grouped bars and communication graphs, all as PNG in one style.

Needs the `plot` extra: pip install 'asapmpi[plot]'.
"""
from ..extras import require

# Fail at the package import, in one line, before any submodule imports matplotlib.
require("matplotlib", "plot", "asapmpi's plots")
