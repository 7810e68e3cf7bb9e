"""Build asapmpi's Cython core against MPI.

Which MPI: the compiler wrapper named by ``MPICC``, else the ``mpicc`` on PATH (the PyPI
``mpich`` wheel's on a fresh machine, installed into the build environment by
``_build/backend.py``).  The wrapper's flags are read with ``-show`` (MPICH) or
``--showme`` (Open MPI) and handed to setuptools, so the extension is compiled by the
plain C compiler with exactly the wrapper's include paths and libraries.

Two traps this file avoids:
- an isolated build environment is deleted after the build, so an rpath pointing into
  it would dangle; for the embedded MPI the rpath is made relative to the installed
  extension (``$ORIGIN/../../../..`` is ``<prefix>/lib``, where the mpich wheel puts
  libmpi), and ``asapmpi._core`` loads ``mpi4py.MPI`` first so that libmpi is already
  mapped by soname;
- a wrapper for the MPI standard ABI (``mpicc_abi``) links ``libmpi_abi`` while mpi4py
  may load the MPICH ABI: the ABI we built against is recorded in
  ``asapmpi/_core/_build_config.py`` and checked at import.
"""
import glob
import os
import shlex
import shutil
import subprocess
import sys
import sysconfig

from setuptools import Extension, find_packages, setup
from setuptools.command.build_ext import build_ext

HERE = os.path.dirname(os.path.abspath(__file__))
BASE_REQUIRES = ["mpi4py>=4.0", "numpy>=1.22", "h5py>=3.0"]
EMBEDDED_MPI_REQUIRES = ["mpich>=4.1,<6"]
#: ASAPMPI_OPTIMIZE=0..3 (default 3): the compiler's -O level.  0 compiles in a sixth of
#: the time (slotwin's C: 3.4 s of CPU against 22 s) for a debugger or a build that is
#: only checked, never timed (the build tests); every level rounds alike
#: (-ffp-contract=off, no fast-math)
OPTIMIZE = os.environ.get("ASAPMPI_OPTIMIZE", "3")
if OPTIMIZE not in ("0", "1", "2", "3"):
    sys.exit(f"asapmpi: ASAPMPI_OPTIMIZE={OPTIMIZE!r}: give 0, 1, 2 or 3 (the -O level), "
             f"or leave it unset for 3")
COMPILE_ARGS = [f"-O{OPTIMIZE}", "-ffp-contract=off", "-fno-strict-aliasing", "-std=gnu11"]


def read_extension_list():
    """Return [(module, source)] from the list shared with CMakeLists.txt."""
    path = os.path.join(HERE, "asapmpi", "_core", "extensions.txt")
    pairs = []
    with open(path, encoding="utf-8") as f:
        for raw in f:
            line = raw.split("#", 1)[0].strip()
            if line:
                module, source = line.split()
                pairs.append((module, source))
    return pairs


def find_mpicc():
    """Return (path to the MPI C wrapper, whether it is the embedded default)."""
    named = os.environ.get("MPICC")
    if named:
        path = shutil.which(named) or named
        if not os.path.exists(path):
            sys.exit(f"asapmpi: MPICC={named!r} does not exist; point MPICC at your mpicc")
        return path, False
    # The interpreter's own scripts folder first: that is where the mpich wheel puts
    # mpicc in a virtual environment that is not activated.
    scripts = sysconfig.get_path("scripts")
    path = shutil.which("mpicc", path=os.pathsep.join([scripts, os.environ.get("PATH", "")]))
    if path is None:
        sys.exit(
            "asapmpi: no mpicc found; install the embedded MPI with 'pip install mpich' "
            "or set MPICC=/path/to/mpicc"
        )
    return path, True


def wrapper_flags(mpicc):
    """Return the compiler wrapper's flags as a list (MPICH -show, Open MPI --showme)."""
    for option in ("-show", "--showme"):
        try:
            out = subprocess.run(
                [mpicc, option], check=True, capture_output=True, text=True
            ).stdout
        except (OSError, subprocess.CalledProcessError):
            continue
        words = shlex.split(out)
        if words:
            return words[1:]  # drop the underlying compiler's name
    sys.exit(f"asapmpi: {mpicc} answered neither -show nor --showme; is it an MPI wrapper?")


def split_flags(words):
    """Split wrapper flags into setuptools' fields."""
    fields = {"include_dirs": [], "library_dirs": [], "libraries": [], "macros": [],
              "rpaths": [], "other_link": []}
    i = 0
    while i < len(words):
        w = words[i]
        if w.startswith("-I"):
            fields["include_dirs"].append(w[2:])
        elif w.startswith("-L"):
            fields["library_dirs"].append(w[2:])
        elif w.startswith("-l"):
            fields["libraries"].append(w[2:])
        elif w.startswith("-D"):
            name, _, value = w[2:].partition("=")
            fields["macros"].append((name, value or None))
        elif w == "-Wl,-rpath" and i + 1 < len(words):
            fields["rpaths"].append(words[i + 1].split(",", 1)[1])
            i += 1
        elif w.startswith("-Wl,-rpath,"):
            fields["rpaths"].append(w.split(",", 2)[2])
        elif w.startswith(("-Wl,", "-pthread")):
            fields["other_link"].append(w)
        i += 1
    return fields


def detect_abi(fields):
    """Name the ABI family the way mpi4py does: mpich, openmpi or mpiabi."""
    if any(name == "MPI_ABI" for name, _ in fields["macros"]) or "mpi_abi" in fields["libraries"]:
        return "mpiabi"
    for inc in fields["include_dirs"]:
        header = os.path.join(inc, "mpi.h")
        if os.path.exists(header):
            with open(header, encoding="utf-8", errors="replace") as f:
                text = f.read()
            if "OPEN_MPI" in text or "OMPI_MAJOR_VERSION" in text:
                return "openmpi"
            return "mpich"
    return "mpich"


def mpi_library_version(mpicc):
    """Return the version string the wrapper reports, for the build record."""
    for cmd in ([os.path.join(os.path.dirname(mpicc), "mpichversion")], [mpicc, "--version"]):
        try:
            out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
            return " ".join(out.split())[:200]
        except (OSError, subprocess.CalledProcessError):
            continue
    return "unknown"


MPICC, EMBEDDED = find_mpicc()
FLAGS = split_flags(wrapper_flags(MPICC))
ABI = detect_abi(FLAGS)


def rpaths():
    if EMBEDDED:
        # <prefix>/lib/pythonX.Y/site-packages/asapmpi/_core -> <prefix>/lib
        return ["$ORIGIN/../../../.."]
    return FLAGS["rpaths"]


class BuildExt(build_ext):
    """Cythonize, compile with the wrapper's flags, and record what MPI we built on."""

    def finalize_options(self):
        super().finalize_options()
        # the extensions compile side by side (slotwin's C alone takes ~17 s of -O3)
        if not self.parallel:
            self.parallel = os.cpu_count() or 1

    def run(self):
        super().run()
        record = (
            '"""Written by the build: the MPI this extension was compiled against."""\n'
            f"MPI_ABI = {ABI!r}\n"
            f"MPICC = {MPICC!r}\n"
            f"EMBEDDED = {EMBEDDED!r}\n"
            f"LIBRARIES = {FLAGS['libraries']!r}\n"
            f"LIBRARY_DIRS = {FLAGS['library_dirs']!r}\n"
            f"VERSION = {mpi_library_version(MPICC)!r}\n"
            f"OPTIMIZE = {OPTIMIZE!r}\n"
            "BUILT_BY = 'setup.py'\n"
        )
        targets = [os.path.join(self.build_lib, "asapmpi", "_core")]
        if self.inplace:
            targets.append(os.path.join(HERE, "asapmpi", "_core"))
        for folder in targets:
            os.makedirs(folder, exist_ok=True)
            with open(os.path.join(folder, "_build_config.py"), "w", encoding="utf-8") as f:
                f.write(record)


def extensions():
    import mpi4py
    from Cython.Build import cythonize

    core = os.path.join("asapmpi", "_core")
    exts = [
        Extension(
            module,
            [source],
            include_dirs=[core, mpi4py.get_include()] + FLAGS["include_dirs"],
            library_dirs=FLAGS["library_dirs"],
            libraries=FLAGS["libraries"],
            runtime_library_dirs=rpaths(),
            define_macros=FLAGS["macros"],
            extra_compile_args=COMPILE_ARGS,
            extra_link_args=FLAGS["other_link"],
            depends=sorted(glob.glob(os.path.join(core, "*.pxi"))
                           + glob.glob(os.path.join(core, "*.h"))),
        )
        for module, source in read_extension_list()
    ]
    return cythonize(
        exts,
        language_level=3,
        compiler_directives={"boundscheck": False, "wraparound": False,
                             "cdivision": True, "initializedcheck": False},
    )


# The PyTorch adapter lives in bindings/torch (the only code that imports torch) and is
# installed as asapmpi.torch.
PACKAGES = [*find_packages(include=["asapmpi", "asapmpi.*"]), "asapmpi.torch"]

setup(
    packages=PACKAGES,
    package_dir={"asapmpi.torch": "bindings/torch"},
    ext_modules=extensions(),
    cmdclass={"build_ext": BuildExt},
    install_requires=BASE_REQUIRES + (EMBEDDED_MPI_REQUIRES if EMBEDDED else []),
)
