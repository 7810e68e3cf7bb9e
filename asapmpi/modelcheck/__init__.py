"""Explicit-state model checking of the slot protocols (docs/MODELCHECK.md)."""
