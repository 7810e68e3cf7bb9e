"""Where the command line writes, checked when its options are parsed.

Every option that names a file or a folder to write (`--out`, `--json`, `--png`, `--h5`,
`--trace`, `--trace-dir`, `--keep`) is declared with `type=output_file` or
`type=output_folder`: argparse then checks it, and the default it has, before any rank
starts or any work is done (and again on every rank of a job, which parses the same
options), and a path that cannot be written is one line naming the option, the path and
what is wrong, exit code 2.  Before this, a training run with an unwritable `--out`
trained to the end and then failed on every rank with a traceback (issue 49).

Writability is tried, not inferred from permission bits (root passes those, and a
read-only or pseudo file system does not show in them): a temporary file is created and
removed in the folder that will hold the output; an existing file is opened for writing
without being changed.
"""
from __future__ import annotations

import argparse
import os
import tempfile
from typing import Optional


def _cannot_write_in(folder: str) -> Optional[str]:
    """Why no file can be created in the existing folder `folder` (the system's
    words), or None."""
    try:
        with tempfile.TemporaryFile(dir=folder):
            pass
    except OSError as exc:
        return exc.strerror or str(exc)
    return None


def _existing_ancestor(path: str) -> str:
    """The nearest of `path`'s parents (absolute) that exists: a folder or not."""
    parent = os.path.dirname(path)
    while not os.path.lexists(parent) and parent != os.path.dirname(parent):
        parent = os.path.dirname(parent)
    return parent


def file_problem(path: str) -> Optional[str]:
    """What is wrong with `path` as a file to write, or None: it is a folder, its folder
    does not exist or is a file, or nothing can be written there."""
    if not path:
        return "an empty path; name a file"
    full = os.path.abspath(path)
    if os.path.isdir(full):
        return "is a folder; name a file (in it, say)"
    folder = os.path.dirname(full)
    if not os.path.isdir(folder):
        ancestor = _existing_ancestor(full)
        if os.path.isdir(ancestor):
            return f"folder {folder} does not exist; create it or choose another path"
        return f"{ancestor} is a file, not a folder; choose another path"
    if os.path.exists(full):
        try:
            with open(full, "r+b"):
                pass
        except OSError as exc:
            return f"cannot be written ({exc.strerror}); choose another path"
        return None
    why = _cannot_write_in(folder)
    return f"cannot write in folder {folder} ({why}); choose another path" if why else None


def folder_problem(path: str) -> Optional[str]:
    """What is wrong with `path` as a folder to write in (created, with its parents,
    when missing), or None."""
    if not path:
        return "an empty path; name a folder"
    full = os.path.abspath(path)
    if os.path.isdir(full):
        why = _cannot_write_in(full)
        return f"cannot write in it ({why}); choose another folder" if why else None
    if os.path.lexists(full):
        return "is a file, not a folder; choose another path"
    ancestor = _existing_ancestor(full)
    if not os.path.isdir(ancestor):
        return f"{ancestor} is a file, not a folder; choose another path"
    why = _cannot_write_in(ancestor)
    return (f"cannot be created: cannot write in folder {ancestor} ({why}); choose another "
            f"path") if why else None


def output_file(text: str) -> str:
    """argparse type of an option naming a file to write: the path, or the one-line
    error of file_problem()."""
    problem = file_problem(text)
    if problem:
        raise argparse.ArgumentTypeError(f"{text}: {problem}" if text else problem)
    return text


def output_folder(text: str) -> str:
    """argparse type of an option naming a folder to write in (created when missing):
    the path, or the one-line error of folder_problem()."""
    problem = folder_problem(text)
    if problem:
        raise argparse.ArgumentTypeError(f"{text}: {problem}" if text else problem)
    return text
