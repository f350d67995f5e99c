"""Files in and out: input text read with one clear error, and atomic, durable output.

Output readers see the old file or the complete new one, never half of it: content is fsync'd before
the rename and the folder after it, so a power loss cannot leave an empty or truncated file under the
final name.
"""

from __future__ import annotations

import ctypes
import errno
import hashlib
import json
import os
import shutil
import stat
import sys
import tempfile
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import IO, Any

from qgmem_train.errors import InputError, ModelUnavailableError

_RENAME_EXCHANGE = 2
"""renameat2 flag (Linux): swap two paths in one atomic step."""
_AT_FDCWD = -100


def read_text(path: str | os.PathLike, *, kind: str = "file") -> str:
    """The UTF-8 text of the file ``path`` (a leading byte-order mark dropped).

    A missing, folder-valued or unreadable file, or bytes that are not UTF-8, is an :class:`InputError`
    naming the file (and, for bad bytes, the line); ``kind`` names what was expected ("config file").
    """
    try:
        data = Path(path).read_bytes()
    except FileNotFoundError:
        raise InputError(str(path), f"{kind} not found") from None
    except IsADirectoryError:
        raise InputError(str(path), f"expected a {kind}, got a folder") from None
    except OSError as exc:
        raise InputError(str(path), f"cannot read: {exc.strerror or exc}") from None
    return decode_text(data, str(path))


NOT_REGULAR = "not a regular file (a FIFO, device or socket, whose reading could block for ever); refusing to open it"


def open_regular(path: str | os.PathLike, mode: str = "rb") -> IO[Any]:
    """``path`` opened to read (``rb``, ``r``) or append (``ab``, ``a``: made when missing) when it is a regular file;
    anything else (a FIFO, a device) is an :class:`InputError` before any read or write can block on it."""
    flags = os.O_RDONLY if mode.startswith("r") else os.O_WRONLY | os.O_APPEND | os.O_CREAT
    try:
        fd = os.open(path, flags | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0), 0o644)
    except OSError as exc:
        if exc.errno == errno.ENXIO:  # a FIFO no one reads, opened to write
            raise InputError(str(path), NOT_REGULAR) from None
        raise
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise InputError(str(path), NOT_REGULAR)
        os.set_blocking(fd, True)
        return os.fdopen(fd, mode, **({} if "b" in mode else {"encoding": "utf-8"}))
    except BaseException:
        os.close(fd)
        raise


def require_regular(path: str | os.PathLike) -> None:
    """Refuse ``path`` when it exists and is not a regular file (a FIFO, a device), without opening it."""
    try:
        info = os.stat(path)
    except FileNotFoundError:
        return
    if not stat.S_ISREG(info.st_mode):
        raise InputError(str(path), NOT_REGULAR)


def decode_text(data: bytes, where: str) -> str:
    """``data`` (the bytes of the file ``where``) as UTF-8 text, a leading byte-order mark dropped; bad bytes are an
    :class:`InputError` naming the line."""
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        line = data.count(b"\n", 0, exc.start) + 1
        raise InputError(f"{where}: line {line}", f"not valid UTF-8 (byte {exc.start} of the file: {exc.reason})") from None


def parse_json(text: str | bytes, where: str) -> Any:
    """``text`` parsed as JSON; malformed JSON, or nesting too deep for the parser, is an :class:`InputError` naming ``where``."""
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise InputError(where, f"not valid JSON: {exc}") from None
    except RecursionError:
        raise InputError(where, "not readable JSON: nested too deeply") from None
    except ValueError:  # an integer past Python's limit on digits in a conversion
        raise InputError(where, f"not readable JSON: a number longer than {sys.get_int_max_str_digits()} digits") from None


def fsync_dir(path: Path) -> None:
    """Flush a folder's entries (new names, renames) to disk; a no-op where folders cannot be opened."""
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def fsync_tree(root: Path) -> None:
    """Flush every file below ``root``, then every folder, so a later rename publishes content that is on disk."""
    for folder, _, files in os.walk(root):
        for name in files:
            fd = os.open(os.path.join(folder, name), os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
        fsync_dir(Path(folder))


@contextmanager
def atomic_output(path: Path, mode: str = "w") -> Iterator[IO[Any]]:
    """A file handle whose content replaces ``path`` only when the block completes (fsync'd before the rename)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, staging = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        with os.fdopen(fd, mode) as handle:
            yield handle
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(staging, path)
    except BaseException:
        Path(staging).unlink(missing_ok=True)
        raise
    fsync_dir(path.parent)


def _exchange(a: Path, b: Path) -> bool:
    """Swap two existing paths atomically (Linux renameat2); False where the system or filesystem cannot."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        renameat2 = ctypes.CDLL(None, use_errno=True).renameat2
    except (OSError, AttributeError):
        return False
    return renameat2(_AT_FDCWD, os.fsencode(a), _AT_FDCWD, os.fsencode(b), _RENAME_EXCHANGE) == 0


def replace_folder(staging: Path, path: Path) -> None:
    """Publish the finished folder ``staging`` as ``path``, replacing any folder there; ``staging`` is consumed.

    The content is fsync'd first. An existing folder is swapped with the new one in one atomic step, so
    ``path`` always holds a complete folder; where the system cannot swap, the old folder is renamed
    aside, the new one renamed in (the old one is put back if that fails), and only then is the old one
    deleted.
    """
    staging, path = Path(staging), Path(path)
    fsync_tree(staging)
    if not path.exists():
        os.replace(staging, path)
    elif _exchange(staging, path):
        shutil.rmtree(staging)
    else:
        aside = Path(tempfile.mkdtemp(prefix=f".{path.name}.old.", dir=path.parent))
        os.replace(path, aside)
        try:
            os.replace(staging, path)
        except BaseException:
            os.replace(aside, path)
            raise
        shutil.rmtree(aside)
    fsync_dir(path.parent)


OUTPUT_MARKER = ".qgmem-output"
"""File a command writes into every output folder it publishes: the proof that a later run may replace that folder."""


def holds_output_marker(folder: Path) -> bool:
    """Whether ``folder`` holds :data:`OUTPUT_MARKER`, so a command of this project wrote it."""
    return (folder / OUTPUT_MARKER).is_file()


def refuse_foreign_folder(path: Path, ours: Callable[[Path], bool] = holds_output_marker, what: str = f"an output folder of QGMem (it holds no {OUTPUT_MARKER})") -> None:
    """Refuse ``path`` as an output folder unless it is missing, an empty folder, or one ``ours`` recognises as written
    by this project: replacing it would delete the user's files. Called before the work and again before publishing."""
    if not path.exists() and not path.is_symlink():
        return
    if path.is_dir() and not path.is_symlink() and (ours(path) or not any(path.iterdir())):
        return
    raise InputError(str(path), f"exists and is not {what}; choose a new folder, or remove it yourself")


def publish_output_folder(staging: Path, path: Path, command: str) -> None:
    """Publish ``staging`` as the output folder ``path`` of ``command`` (:func:`replace_folder`), marked as written by it;
    a folder there that no command of this project wrote is refused and left as it is."""
    refuse_foreign_folder(path)
    (staging / OUTPUT_MARKER).write_text(f"written by {command}; a later run may replace this folder\n", encoding="utf-8")
    replace_folder(staging, path)


@contextmanager
def staging_beside(path: Path) -> Iterator[Path]:
    """A new empty folder beside ``path`` (the same filesystem, so :func:`replace_folder` or a rename can publish it),
    removed on exit unless it was published."""
    path.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{path.name}.", dir=path.parent))
    try:
        yield staging
    finally:
        shutil.rmtree(staging, ignore_errors=True)


def publish_folder_once(final: Path, write: Callable[[Path], None]) -> Path:
    """``final``, written by ``write(staging)`` into a temporary folder beside it and renamed into place, unless it exists.

    For caches of derived files: a reader sees nothing or a complete folder; when two processes write
    at once, the second rename loses and its copy is discarded. An existing ``final`` that someone else
    could have written (:func:`trusted_cache_entry`) is written again and swapped in.
    """
    if trusted_cache_entry(final):
        return final
    with staging_beside(final) as staging:
        write(staging)
        seal_folder(staging)
        if final.exists():
            replace_folder(staging, final)
            return final
        fsync_tree(staging)
        try:
            os.rename(staging, final)
        except OSError:
            if not final.exists():
                raise
    return final


def _writable_by_you_alone(info: os.stat_result) -> bool:
    """Whether a file or folder (not a link) is this user's, or root's, and writable by no one else."""
    return info.st_uid in {os.getuid(), 0} and not stat.S_ISLNK(info.st_mode) and not info.st_mode & 0o022


def trusted_cache_entry(entry: Path) -> bool:
    """Whether the derived-cache entry ``entry`` exists and nobody but this user (or root) can have written it.

    The entry, everything under it and the folder holding it must be this user's and writable by no one
    else: a digest recorded beside an entry proves nothing to whoever can write both. A holding folder
    others can write is refused in one line (an entry written again there could be swapped as well); a
    missing one is created writable by this user alone.
    """
    entry.parent.mkdir(mode=0o755, parents=True, exist_ok=True)
    if not _writable_by_you_alone(entry.parent.stat()):
        raise ModelUnavailableError(f"{entry.parent}: writable by others or not yours, so what is cached there could be anyone's; "
                                    "use a cache folder only you can write (cache_dir, $QGMEM_CACHE)")
    try:
        return all(_writable_by_you_alone(path.lstat()) for path in [entry, *entry.rglob("*")])
    except OSError:
        return False


def seal_folder(folder: Path) -> None:
    """Make a folder about to be published as a cache entry readable by all and writable by its owner alone,
    whatever the umask, so :func:`trusted_cache_entry` accepts it."""
    os.chmod(folder, 0o755)
    for path in folder.rglob("*"):
        if not path.is_symlink():
            os.chmod(path, stat.S_IMODE(path.lstat().st_mode) & ~0o022)


def file_sha256(path: Path, keep: bytearray | None = None) -> str:
    """Hex SHA-256 of a file, read in 1 MiB blocks; each block is also appended to ``keep`` when given (the bytes as hashed)."""
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
            if keep is not None:
                keep += block
    return digest.hexdigest()


def checksums_digest(sums: Mapping[str, str]) -> str:
    """Short SHA-256 of ``sha256sum``-style lines (``<hex>  <name>``, in the mapping's order): one key for a set of files."""
    return hashlib.sha256("".join(f"{digest}  {name}\n" for name, digest in sums.items()).encode()).hexdigest()[:16]


def write_json_atomic(path: Path, value: Any) -> None:
    """Write ``value`` as indented JSON to ``path`` atomically."""
    with atomic_output(Path(path)) as handle:
        json.dump(value, handle, indent=2, ensure_ascii=False, default=str)
        handle.write("\n")


def write_report_atomic(path: Path, value: Any, markdown: str) -> None:
    """Write ``value`` as JSON to ``path`` and ``markdown`` beside it (``.md``), each atomically."""
    write_json_atomic(path, value)
    with atomic_output(Path(path).with_suffix(".md")) as handle:
        handle.write(markdown)
