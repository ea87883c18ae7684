"""Safe report files: atomic writes through temporary files renamed into place (never through a
symbolic link), strict JSON out, and bounded JSON in (size, depth and value caps)."""

from __future__ import annotations

import json
import os
import stat
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from privaudit import _safejson
from privaudit.errors import PrivauditError
from privaudit.results import jsonable

#: Largest results.json read (bytes) and deepest nesting accepted.
MAX_RESULTS_BYTES = 256 * 1024 * 1024


MAX_DEPTH = 64


#: Most JSON values, points and metric names per point a results.json or audit.json may hold
#: (rendering grows with points x metrics, so a small file can ask for a very large report).
MAX_RESULTS_VALUES = 4_000_000


MAX_POINTS = 20_000


MAX_METRICS = 500


def check_target(path: Path) -> None:
    """Refuse an output path that is a symbolic link or exists as anything but a regular file."""
    path = Path(path)
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return
    except OSError as exc:
        raise PrivauditError(f"{path}: cannot be written ({exc.strerror or exc})") from None
    if stat.S_ISLNK(st.st_mode):
        raise PrivauditError(f"{path}: is a symbolic link; privaudit does not write through links (remove it)")
    if not stat.S_ISREG(st.st_mode):
        raise PrivauditError(f"{path}: exists and is not a regular file; privaudit replaces only regular files")


def check_folder(folder: Path) -> None:
    """Refuse an output folder that is a symbolic link or not a folder."""
    folder = Path(folder)
    if folder.is_symlink():
        raise PrivauditError(f"{folder}: is a symbolic link; privaudit does not write through links (remove it)")
    if folder.exists() and not folder.is_dir():
        raise PrivauditError(f"{folder}: exists and is not a folder")


def _umask() -> int:
    """The process's umask (read by setting it and putting it back)."""
    mask = os.umask(0o077)
    os.umask(mask)
    return mask


class Staged:
    """Files written under temporary names, renamed into place by :meth:`commit` (in the order
    staged), removed by :meth:`discard`; an existing file is never removed on failure.

    Temporary files are created by :func:`tempfile.mkstemp` (``O_EXCL``, unpredictable names)
    inside the target folder, then given the mode a plain ``open()`` would (0666 less the
    umask: a shared report is readable as the user's other files are, not mkstemp's 0600); a
    final name that is a symbolic link or not a regular file is refused before anything is
    renamed (``os.replace`` itself never follows a link).
    """

    def __init__(self, folder: Path):
        self.folder = Path(folder)
        self.items: list[tuple[Path, Path]] = []

    def path(self, name: str) -> Path:
        """A new, empty temporary file for ``name`` (same folder, so the rename is atomic)."""
        final = self.folder / name
        check_folder(self.folder)
        check_target(final)
        try:
            fd, tmp = tempfile.mkstemp(prefix=f".{name}.", suffix=f".tmp{final.suffix}", dir=self.folder)
        except OSError as exc:
            raise PrivauditError(f"{final}: cannot be written ({exc.strerror or exc})") from None
        try:
            os.fchmod(fd, 0o666 & ~_umask())
        finally:
            os.close(fd)
        self.items.append((Path(tmp), final))
        return Path(tmp)

    def text(self, name: str, text: str) -> Path:
        tmp = self.path(name)
        with open(tmp, "w", encoding="utf-8") as fh:
            fh.write(text)
        return self.folder / name

    def commit(self) -> list[Path]:
        for _, final in self.items:  # every target checked before the first rename
            check_target(final)
        for tmp, final in self.items:
            os.replace(tmp, final)
        return [final for _, final in self.items]

    def discard(self) -> None:
        for tmp, _ in self.items:
            try:
                tmp.unlink()
            except OSError:
                pass


def write_text_file(path: Path | str, text: str) -> Path:
    """Write ``text`` to ``path`` atomically and safely (see :class:`Staged`)."""
    path = Path(path)
    staged = Staged(path.parent)
    try:
        staged.text(path.name, text)
        staged.commit()
    except BaseException:
        staged.discard()
        raise
    return path


def write_file_from(source: Path | str, path: Path | str) -> Path:
    """Copy the file ``source`` to ``path`` atomically and safely (see :class:`Staged`)."""
    import shutil

    path = Path(path)
    staged = Staged(path.parent)
    try:
        tmp = staged.path(path.name)
        with open(source, "rb") as src, open(tmp, "wb") as dst:
            shutil.copyfileobj(src, dst, 1 << 20)
        staged.commit()
    except BaseException:
        staged.discard()
        raise
    return path


def dumps_json(data: Mapping[str, Any]) -> str:
    """Strict JSON text of ``data`` (NaN -> null), keys in insertion order."""
    return json.dumps(jsonable(data), indent=2, allow_nan=False) + "\n"


def write_json(data: Mapping[str, Any], path: Path) -> Path:
    """Write ``data`` as strict JSON, atomically (a temporary file renamed into place)."""
    return write_text_file(path, dumps_json(data))


def load_json(path: Path, what: str) -> Any:
    """Parse a JSON file with a size cap and a depth cap (:mod:`privaudit._safejson`; one-line errors)."""
    try:  # bounded: size and nesting depth checked before parsing (no RecursionError on hostile files)
        return _safejson.load_file(
            path, max_bytes=MAX_RESULTS_BYTES, max_depth=MAX_DEPTH, max_values=MAX_RESULTS_VALUES
        )
    except _safejson.JSONLimitError as exc:
        raise PrivauditError(f"{path}: not a valid {what} ({exc})") from None
