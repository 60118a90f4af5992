"""Reading an --inputs .npz: a regular file, opened once, every array sized before it is read.

Why: ``np.load`` follows the path wherever it leads (a FIFO blocks for ever) and decompresses
whatever a member declares (a 389 KB file asked for 400 MB).  Here the file is opened once
(non-blocking, so a FIFO cannot hold the open), must be a regular file, and every member's
declared size (the zip's and the .npy header's) counts against `limits.INPUT_BYTES` before
anything is decompressed.
"""

from __future__ import annotations

import math
import os
import stat
import zipfile

import numpy as np

from dmlopt import limits
from dmlopt.errors import InputError, printable


def read_npz(path: str | os.PathLike, cap: int = limits.INPUT_BYTES) -> dict[str, np.ndarray]:
    """The arrays of the .npz at `path` by name (the member name without ``.npy``)."""
    shown = printable(os.fspath(path))
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_BINARY", 0))
    except FileNotFoundError:
        raise InputError(f"{shown}: no such inputs file") from None
    except OSError as e:
        raise InputError(f"{shown}: cannot read the inputs file: {e.strerror or e}") from None
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise InputError(f"{shown}: the inputs file is not a regular file (a folder, FIFO, device or socket)")
    with os.fdopen(fd, "rb") as f:
        try:
            with zipfile.ZipFile(f) as archive:
                return _arrays(archive, shown, cap)
        except InputError:
            raise
        except (zipfile.BadZipFile, ValueError, OSError, EOFError, KeyError) as e:
            raise InputError(f"{shown}: not a readable .npz file of inputs ({printable(str(e))[:200]})") from None


def _arrays(archive: zipfile.ZipFile, shown: str, cap: int) -> dict[str, np.ndarray]:
    members = archive.infolist()
    total = sum(m.file_size for m in members)
    if total > cap:
        raise InputError(f"{shown}: its arrays declare {total / 2**30:.3g} GiB uncompressed, over the "
                         f"{cap / 2**30:.3g} GiB limit for inputs")
    arrays, declared = {}, 0
    for member in members:
        if not member.filename.endswith(".npy"):
            raise InputError(f"{shown}: member '{printable(member.filename)}' is not a .npy array")
        with archive.open(member) as stream:
            version = np.lib.format.read_magic(stream)
            read_header = np.lib.format.read_array_header_1_0 if version == (1, 0) \
                else np.lib.format.read_array_header_2_0
            shape, _fortran, dtype = read_header(stream)
            if dtype.hasobject:
                raise InputError(f"{shown}: array '{printable(member.filename)}' holds Python objects, "
                                 "which are not read (no pickles)")
            nbytes = math.prod(shape) * dtype.itemsize
            declared += nbytes
            if nbytes > member.file_size or declared > cap:
                raise InputError(f"{shown}: array '{printable(member.filename)}' of shape {list(shape)} "
                                 f"({dtype}) does not fit its {member.file_size} bytes or the "
                                 f"{cap / 2**30:.3g} GiB limit for inputs")
        with archive.open(member) as stream:
            arrays[member.filename[:-4]] = np.lib.format.read_array(stream, allow_pickle=False)
    return arrays
