"""Putting a finished artifact at its path without ever losing the old one, and cleaning up after
runs that were killed.

- `check_replaceable`: what `--overwrite` may replace: an existing qoq artifact or an empty directory,
  never the input model or a directory that contains it.
- `replace_dir`: at every instant the path holds the old or the new artifact. Linux swaps the two
  atomically (renameat2 RENAME_EXCHANGE); elsewhere the old one is renamed aside, the new one renamed
  in, and the old one renamed back if that fails.
- `make_temp_dir` / `sweep_stale`: temp dirs are named `.NAME.tmp-*` (and `.NAME.old-*` for an old
  artifact set aside) beside the output; ones older than a day are removed on the next run, and an
  old artifact whose path is empty (the process was killed mid-swap) is put back.
"""

from __future__ import annotations

import ctypes
import errno
import os
import shutil
import tempfile
import time
from pathlib import Path
from typing import Iterable

MANIFEST = "qoq.json"
MARKER = ".qoq-partial"  # inside a temp dir while it is being written
TMP_TAG, OLD_TAG = ".tmp-", ".old-"
STALE_SECONDS = 24 * 3600


class ReplaceError(OSError):
    """The output path holds something `--overwrite` must not replace."""


def check_replaceable(out: Path, overwrite: bool, protect: Iterable[Path] = ()) -> None:
    """Refuse an output path whose current content must not be deleted (see the module docstring)."""
    out = Path(out)
    if not out.exists() and not out.is_symlink():
        return
    if not overwrite:
        raise FileExistsError(f"output {out} already exists (pass --overwrite to replace an existing artifact)")
    real = out.resolve()
    for p in protect:
        p = Path(p).resolve()
        if p == real or real in p.parents:
            raise ReplaceError(f"refusing to overwrite {out}: it is or contains the input model; "
                               "pick another --output")
    if out.is_symlink() or not out.is_dir():
        raise ReplaceError(f"refusing to overwrite {out}: it is not a directory (a file or a link); "
                           "remove it yourself or pick another --output")
    if (out / MANIFEST).is_file() or not any(out.iterdir()):
        return
    raise ReplaceError(f"refusing to overwrite {out}: it is not a qoq artifact (no {MANIFEST}) and not "
                       "empty; remove it yourself or pick another --output")


def user_modes(root: Path) -> None:
    """Give a finished temp dir the modes a normal mkdir/open would have (mkdtemp makes it 0700)."""
    mask = os.umask(0)
    os.umask(mask)
    os.chmod(root, 0o777 & ~mask)
    for p in root.rglob("*"):
        os.chmod(p, (0o777 if p.is_dir() else 0o666) & ~mask)


def make_temp_dir(out: Path) -> Path:
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}{TMP_TAG}", dir=out.parent))
    (tmp / MARKER).write_text(f"pid {os.getpid()}\n")
    return tmp


def _rename(src: Path, dst: Path) -> None:  # one place for tests to inject a failure
    os.rename(src, dst)


def _exchange(a: Path, b: Path) -> bool:
    """Swap two paths atomically (Linux renameat2); False where the system or filesystem cannot."""
    try:
        fn = ctypes.CDLL(None, use_errno=True).renameat2
    except (OSError, AttributeError):
        return False
    fn.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_int, ctypes.c_char_p, ctypes.c_uint]
    at_fdcwd, rename_exchange = -100, 2
    if fn(at_fdcwd, os.fsencode(a), at_fdcwd, os.fsencode(b), rename_exchange) == 0:
        return True
    err = ctypes.get_errno()
    if err in (errno.ENOSYS, errno.EINVAL, errno.EOPNOTSUPP):
        return False
    raise OSError(err, os.strerror(err), str(b))


def replace_dir(new: Path, out: Path) -> None:
    """Move the finished dir `new` to `out`, replacing what is there; see the module docstring."""
    (new / MARKER).unlink(missing_ok=True)
    if not out.exists():
        _rename(new, out)
        return
    if _exchange(new, out):  # `new` now holds the old artifact
        _remove_quietly(new)
        return
    aside = Path(tempfile.mkdtemp(prefix=f".{out.name}{OLD_TAG}", dir=out.parent))
    aside.rmdir()  # only its unique name is wanted
    _rename(out, aside)
    try:
        _rename(new, out)
    except BaseException:
        _rename(aside, out)  # put the old artifact back
        raise
    _remove_quietly(aside)


def _remove_quietly(old: Path) -> None:
    """The new artifact is in place: failing to delete the old one is not an error (sweep_stale
    removes it on a later run)."""
    try:
        shutil.rmtree(old)
    except OSError:
        pass


def _age(p: Path) -> float:
    st = p.stat()
    return time.time() - max(st.st_mtime, st.st_ctime)  # a rename updates ctime


def sweep_stale(parent: Path, max_age: float = STALE_SECONDS) -> list[str]:
    """Remove this tool's temp dirs in `parent` older than `max_age` seconds; put back an old artifact
    whose path is empty. Returns one line per action, for the caller to report."""
    notes: list[str] = []
    if not parent.is_dir():
        return notes
    for p in sorted(parent.glob(".*")):
        tmp, old = TMP_TAG in p.name, OLD_TAG in p.name
        if not (tmp or old) or not p.is_dir() or p.is_symlink():
            continue
        if not ((p / MARKER).exists() or (p / MANIFEST).exists()):
            continue  # not recognisably ours
        name = p.name[1:].rsplit(OLD_TAG if old else TMP_TAG, 1)[0]
        try:
            if old and (p / MANIFEST).exists() and not (parent / name).exists():
                _rename(p, parent / name)
                notes.append(f"restored {parent / name} from {p.name} (left by a run killed mid-replace)")
            elif _age(p) > max_age:
                shutil.rmtree(p)
                notes.append(f"removed stale temp dir {p} (left by an interrupted run)")
        except OSError as e:
            notes.append(f"could not clean up stale temp dir {p}: {e.strerror or e}")
    return notes
