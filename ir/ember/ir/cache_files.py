"""Cache files that check out: the atomic writes and verifying reads every Ember cache shares.

Two shapes of entry:
- a file that carries its own digest (the JSON caches' header, a wrapper's code): written with
  `write_atomic`, verified by its reader;
- an entry directory (a shared library, a precompiled header, an archive, a program, a Triton
  binary): its files plus a manifest (format, the entry's key, each file's SHA-256 and size),
  built in a private sibling and renamed into place whole (`publish_dir`), and used only after
  `verified_dir` has hashed every file against the manifest.

Writers never change a published file in place: a new file is renamed over the old path, and a
damaged entry directory is renamed aside before it is removed, so a library another process has
mapped keeps its pages (a truncation under a mapping is what raised SIGBUS). What does not check
out (short, corrupt, foreign, unreadable) is warned about, set aside and rebuilt. A cache that
cannot be written (read-only, full) costs one warning a process: builds then go to a private
directory of this process, and nothing half-written stays in the cache.
"""

from __future__ import annotations

import atexit
import hashlib
import logging
import os
import shutil
import tempfile
import threading
from pathlib import Path
from typing import Callable, Mapping, Optional, Union

log = logging.getLogger("ember.cache")

MANIFEST = "MANIFEST.sha256"
MANIFEST_FORMAT = "ember-entry-1"
_CHUNK = 1 << 20

Payload = Union[bytes, str, Path]


def _write(f, data: bytes) -> None:
    """The one place cache bytes reach the disk (a test injects ENOSPC or EIO here)."""
    f.write(data)


_WARNED: set = set()
_WARN_LOCK = threading.Lock()


def warn_once(kind: str, message: str, *args) -> None:
    """Log `message` as a warning the first time this process meets `kind`."""
    with _WARN_LOCK:
        if kind in _WARNED:
            return
        _WARNED.add(kind)
    log.warning(message, *args)


def write_atomic(path: Path, data: Union[bytes, str]) -> None:
    """Write `data` to `path` so readers see the old file or the whole new one; OSError when it
    cannot be written, with nothing left behind."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    os.close(fd)  # opened again by name: `_write` sees which file it writes
    try:
        with open(tmp, "wb") as f:
            _write(f, data.encode() if isinstance(data, str) else data)
        os.replace(tmp, path)
    except BaseException:
        _remove(Path(tmp))
        raise


def try_write_atomic(path: Path, data: Union[bytes, str]) -> bool:
    """`write_atomic`, or (read-only or full cache) one warning a process and False."""
    try:
        write_atomic(path, data)
        return True
    except OSError as e:
        warn_once("write", "ember: cannot write to the cache (%s); compiling without storing", e)
        return False


def _remove(path: Path) -> None:
    try:
        if path.is_dir() and not path.is_symlink():
            shutil.rmtree(path, ignore_errors=True)
        else:
            path.unlink()
    except OSError:
        pass


def _digest_file(path: Path) -> tuple[str, int]:
    h, size = hashlib.sha256(), 0
    with open(path, "rb") as f:
        while chunk := f.read(_CHUNK):
            h.update(chunk)
            size += len(chunk)
    return h.hexdigest(), size


def _manifest_text(key: str, digests: Mapping[str, tuple[str, int]]) -> str:
    lines = [f"{MANIFEST_FORMAT} {key}"]
    lines += [f"{sha} {size} {name}" for name, (sha, size) in sorted(digests.items())]
    return "\n".join(lines) + "\n"


def _read_manifest(entry: Path, key: str) -> dict:
    """name -> (sha256, size) of a manifest written for `key`; ValueError otherwise."""
    try:
        head, *rows = (entry / MANIFEST).read_text().splitlines()
        files = {}
        for row in rows:
            sha, size, name = row.split(" ", 2)
            files[name] = (sha, int(size))
    except ValueError as e:
        raise ValueError(f"unreadable manifest: {e}") from None
    if head != f"{MANIFEST_FORMAT} {key}":
        raise ValueError("written for another key or by another format")
    return files


# Entry directories verified by this process, by the identity of each of their files (device,
# inode, size, mtime): a kernel library is looked up by every program that uses it, and hashing
# a 40 MB precompiled header again for each would cost what the cache saves.
_VERIFIED: dict = {}


def _identity(entry: Path, names) -> tuple:
    stats = [os.stat(entry / n) for n in (MANIFEST, *sorted(names))]
    return tuple((s.st_dev, s.st_ino, s.st_size, s.st_mtime_ns) for s in stats)


def verified_dir(entry: Path, key: str, names=()) -> bool:
    """Does `entry` hold a whole entry for `key`, with the files `names` among those whose
    SHA-256 and size match its manifest? A damaged or foreign one is warned about and moved
    aside (it is rebuilt); an absent one is just False."""
    entry = Path(entry)
    if not (entry / MANIFEST).exists():
        if entry.is_dir() and any(True for _ in entry.iterdir()):
            # an entry of the format before manifests: replaced, not a fault worth a warning
            # (a cache from an older Ember holds thousands of them)
            _discard(entry, "no manifest", quiet=True)
        return False
    try:
        files = _read_manifest(entry, key)
        if not set(names) <= set(files):
            raise ValueError(f"lacks {sorted(set(names) - set(files))}")
        ident = _identity(entry, files)
        if _VERIFIED.get(entry) == ident:
            return True
        for name, expected in files.items():
            if _digest_file(entry / name) != expected:
                raise ValueError(f"{name} does not match its SHA-256")
        _VERIFIED[entry] = ident
        return True
    except (OSError, ValueError) as e:
        _discard(entry, str(e))
        return False


def read_verified(entry: Path, key: str, names) -> Optional[dict]:
    """The bytes of the files `names` of the entry for `key` (name -> bytes), each hashed as read
    and matched against the manifest: what is used is what was verified. None when absent; a
    damaged or foreign entry is warned about and moved aside."""
    entry = Path(entry)
    if not (entry / MANIFEST).exists():
        return None
    try:
        files = _read_manifest(entry, key)
        out = {}
        for name in names:
            data = (entry / name).read_bytes()
            if files.get(name) != (hashlib.sha256(data).hexdigest(), len(data)):
                raise ValueError(f"{name} does not match its SHA-256")
            out[name] = data
        return out
    except (OSError, ValueError) as e:
        _discard(entry, str(e))
        return None


def _discard(entry: Path, why: str, quiet: bool = False) -> None:
    (log.info if quiet else log.warning)(
        "ember: ignoring a damaged cache entry %s (%s); rebuilding it", entry, why)
    _VERIFIED.pop(entry, None)
    # renamed aside first: a process that mapped its library keeps the pages it mapped
    aside = entry.with_name(f".{entry.name}.{os.getpid()}.{threading.get_ident()}.bad")
    try:
        os.rename(entry, aside)
    except OSError:
        return  # another process set it aside already, or the cache is read-only
    _remove(aside)


def find_dir(entry: Path, key: str, names=()) -> Optional[Path]:
    """The verified entry directory for `key`: `entry` in the cache, or the private one this
    process built when the cache could not be written; None when neither checks out."""
    if verified_dir(entry, key, names):
        return Path(entry)
    if not _PRIVATE:
        return None
    private = _PRIVATE[0] / Path(entry).parent.name / Path(entry).name
    return private if private.is_dir() and verified_dir(private, key, names) else None


def built_file(entry: Path, key: str, name: str, build: Callable[[Path], Path]) -> Path:
    """The file `name` of the entry for `key`, verified; else what `build(tmp_dir)` makes (a
    path), published there whole (or to this process's private directory)."""
    found = find_dir(entry, key, [name])
    if found is not None:
        return found / name
    with tempfile.TemporaryDirectory(prefix="ember-build-") as tmp:
        return publish_dir(entry, key, {name: build(Path(tmp))}) / name


def publish_dir(entry: Path, key: str, files: Mapping[str, Payload]) -> Path:
    """Publish `files` (name -> bytes, text or a path to copy) as the entry directory `entry`
    for `key`, whole or not at all; the directory that holds them afterwards: `entry` (ours, or
    another writer's that won the race and checks out), else, when the cache cannot be written,
    a private directory of this process."""
    entry = Path(entry)
    try:
        return _publish(entry, entry.parent, key, files)
    except OSError as e:
        warn_once("write", "ember: cannot write to the cache (%s); building into a private "
                  "directory of this process", e)  # fmt: skip
    private = _private_root() / entry.parent.name
    return _publish(private / entry.name, private, key, files)


def _publish(entry: Path, parent: Path, key: str, files: Mapping[str, Payload]) -> Path:
    parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=parent, prefix=f".{entry.name}.", suffix=".tmp"))
    try:
        digests = {}
        for name, payload in files.items():
            if isinstance(payload, Path):
                payload = payload.read_bytes()
            data = payload.encode() if isinstance(payload, str) else payload
            with open(tmp / name, "wb") as f:
                _write(f, data)
            if isinstance(files[name], Path):
                shutil.copymode(files[name], tmp / name)  # a program stays executable
            digests[name] = (hashlib.sha256(data).hexdigest(), len(data))
        with open(tmp / MANIFEST, "wb") as f:
            _write(f, _manifest_text(key, digests).encode())  # last: the entry is whole
        os.chmod(tmp, 0o755)  # mkdtemp's 0700 would hide the entry from other users
        try:
            os.rename(tmp, entry)
        except OSError:
            # another writer published first (a directory is not renamed over a full one)
            if not verified_dir(entry, key, files):
                raise
            _remove(tmp)
        return entry
    except BaseException:
        _remove(tmp)
        raise


_PRIVATE: list = []  # this process's private build directory, once one was needed


def _private_root() -> Path:
    with _WARN_LOCK:
        if not _PRIVATE:
            _PRIVATE.append(Path(tempfile.mkdtemp(prefix="ember-private-")))
            atexit.register(shutil.rmtree, _PRIVATE[0], ignore_errors=True)
    return _PRIVATE[0]


def verified_text(path: Path, text: Union[str, bytes]) -> bool:
    """Does the file at `path` hold exactly `text` (a content-addressed source file)?"""
    try:
        return Path(path).read_bytes() == (text.encode() if isinstance(text, str) else text)
    except OSError:
        return False


def content_file(path: Path, text: Union[str, bytes]) -> Path:
    """A file holding exactly `text` at `path` (rewritten, by rename, when missing or damaged),
    or in a private directory when the cache cannot be written."""
    path, want = Path(path), (text.encode() if isinstance(text, str) else text)
    try:
        found = path.read_bytes()
    except OSError:
        found = None  # missing (or unreadable): not damaged
    if found == want:
        return path
    if found is not None:  # what this read saw: another process may publish it meanwhile
        log.warning("ember: ignoring a damaged cache file %s; rewriting it", path)
    if try_write_atomic(path, text):
        return path
    private = _private_root() / path.parent.name / path.name
    if not verified_text(private, text):
        write_atomic(private, text)
    return private


__all__ = ["MANIFEST", "built_file", "content_file", "find_dir", "publish_dir", "read_verified",
           "try_write_atomic", "verified_dir", "verified_text", "warn_once", "write_atomic"]
