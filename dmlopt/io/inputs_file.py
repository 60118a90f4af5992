"""Reading an --inputs .npz: a regular file, opened once, every array sized before it is read.

Why: ``np.load`` follows the path wherever it leads (a FIFO blocks for ever) and decompresses
whatever a member declares (a 389 KB file asked for 400 MB).  Here the file is opened once
(non-blocking, so a FIFO cannot hold the open), must be a regular file, and every member's
declared size (the zip's and the .npy header's) counts against `limits.INPUT_BYTES` before
anything is decompressed.  Against a model (``Archive.arrays(model)``), the members named like
its inputs are compared with them by header before their data is decompressed, the others are
never read.
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
    """Every array of the .npz at `path` by name (the member name without ``.npy``)."""
    archive = open_npz(path, cap)
    try:
        return archive.arrays()
    finally:
        archive.close()


def open_npz(path: str | os.PathLike, cap: int = limits.INPUT_BYTES) -> "Archive":
    """The .npz at `path`, opened once, its members' .npy headers read and sized, no data read."""
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
    f = os.fdopen(fd, "rb")
    try:
        archive = zipfile.ZipFile(f)
        return Archive(archive, f, shown, _headers(archive, shown, cap))
    except InputError:
        f.close()
        raise
    except (zipfile.BadZipFile, ValueError, OSError, EOFError, KeyError) as e:
        f.close()
        raise InputError(f"{shown}: not a readable .npz file of inputs ({printable(str(e))[:200]})") from None


class Archive:
    """An opened --inputs .npz whose members are known by their .npy headers (name -> shape,
    dtype).  `arrays(model)` compares the members named like the model's inputs with them before
    decompressing those, and leaves the others (reference outputs saved beside) unread: a 389 KB
    file inflating to 400 MB for a [2, 3] input is refused from its header."""

    def __init__(self, archive: zipfile.ZipFile, file, shown: str, headers: dict[str, tuple]):
        self._archive, self._file, self.shown, self.headers = archive, file, shown, headers
        self._read: dict[str, np.ndarray] = {}

    @property
    def names(self) -> list[str]:
        return list(self.headers)

    def __bool__(self) -> bool:
        return bool(self.headers)

    def arrays(self, model=None) -> dict[str, np.ndarray]:
        """The arrays named like `model`'s runtime inputs (every array without a model), each
        checked against the input's declared dtype and static dims before it is decompressed."""
        wanted = None if model is None else {v.name: v for v in model.graph.inputs
                                               if v.name not in model.graph.initializers}
        out = {}
        for name, (member, shape, dtype) in self.headers.items():
            if wanted is not None:
                if name not in wanted:
                    continue
                _check_against(self.shown, name, shape, dtype, wanted[name])
            if name not in self._read:
                try:
                    with self._archive.open(member) as stream:
                        self._read[name] = np.lib.format.read_array(stream, allow_pickle=False)
                except (zipfile.BadZipFile, ValueError, OSError, EOFError) as e:
                    raise InputError(f"{self.shown}: array '{printable(name)}' cannot be read "
                                     f"({printable(str(e))[:200]})") from None
            out[name] = self._read[name]
        return out

    def close(self) -> None:
        self._archive.close()
        self._file.close()


def _check_against(shown: str, name: str, shape: tuple, dtype: np.dtype, value) -> None:
    """The array's header against the model input `value` (an onnx_ir Value)."""
    where = f"{shown}: array '{printable(name)}' of shape {list(shape)} ({dtype})"
    want = value.dtype.numpy() if value.dtype is not None else None
    if want is not None and np.dtype(want) != dtype:
        raise InputError(f"{where} is not the model's input '{printable(name)}', which is {np.dtype(want)}")
    if value.shape is None:
        return
    dims = list(value.shape.dims)
    if len(dims) != len(shape) or any(isinstance(d, int) and d != s for d, s in zip(dims, shape)):
        declared = ", ".join(str(d) if isinstance(d, int) else (d.value or "?") for d in dims)
        raise InputError(f"{where} does not fit the model's input '{printable(name)}' of shape [{declared}]")


def _headers(archive: zipfile.ZipFile, shown: str, cap: int) -> dict[str, tuple]:
    members = archive.infolist()
    total = sum(m.file_size for m in members)
    if total > cap:
        raise InputError(f"{shown}: its arrays declare {total / 2**30:.3g} GiB uncompressed, over the "
                         f"{cap / 2**30:.3g} GiB limit for inputs")
    headers, declared = {}, 0
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
        headers[member.filename[:-4]] = (member, shape, dtype)
    return headers
