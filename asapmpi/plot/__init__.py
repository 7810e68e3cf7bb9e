"""Dependency-free PNG plotting: a NumPy raster canvas and a communication-graph drawer."""
