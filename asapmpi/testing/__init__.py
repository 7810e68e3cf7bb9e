"""Test-only helpers: code the tests import and the package itself never does.

Nothing here is offered by name (asapmpi.sync.POLICIES, the command line): a test passes
what it needs directly, such as Exchange(buf, sync=NotifyAckIgnoringAcks).
tests/package/test_imports.py checks that no module outside this package imports it.
"""
from __future__ import annotations

from .policies import NotifyAckIgnoringAcks

__all__ = ["NotifyAckIgnoringAcks"]
