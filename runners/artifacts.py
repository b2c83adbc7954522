"""A job's artifacts: the files its ranks write under RINGMASTER_OUTPUT_DIR, read from a folder on
the portal's machine (a local job's own output folder, or where the portal keeps what it brought
back from an instance).

The folder may be written by the job itself, so nothing here follows a symbolic link: a name is
a relative path of plain components, each folder on the way is opened with O_NOFOLLOW relative to
the one before (openat), and only a regular file is ever opened. A link the job planted to a file
outside the folder is neither listed nor served.
"""
import fnmatch
import os
import stat
import tarfile
import zlib
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import PurePosixPath

OUTPUT_DIR = "output"                        # the folder, inside the job's own folder
OUTPUT_DIR_VAR = "RINGMASTER_OUTPUT_DIR"
CHECKPOINT_VAR = "RINGMASTER_CHECKPOINT"
CHECKPOINT_DIR = "checkpoint"                # where a rerun's checkpoint is put, inside its folder
_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


class BadName(ValueError):
    """A name that is no plain relative path inside the folder (absolute, `..`, empty)."""


@dataclass(frozen=True)
class Artifact:
    name: str            # relative to the output folder, "/" between folders
    size: int
    modified: float      # seconds since the epoch

    @property
    def modified_at(self):
        return datetime.fromtimestamp(self.modified, tz=timezone.utc)

    def as_dict(self):
        return {"name": self.name, "size": self.size, "modified": self.modified}


def parts(name):
    """The components of `name`, or BadName: no absolute path, no `..` or `.`, no empty part."""
    if not isinstance(name, str) or not name or "\0" in name or name.startswith("/") or "\\" in name:
        raise BadName("an artifact's name is a relative path inside the job's output folder")
    pieces = name.split("/")
    if any(piece in ("", ".", "..") for piece in pieces):
        raise BadName("an artifact's name may not contain '..', '.' or empty parts")
    return pieces


def listing(root):
    """[Artifact] of every regular file under `root` (links are skipped), sorted by name; [] when
    the folder does not exist."""
    try:
        fd = os.open(root, _DIR_FLAGS)
    except (FileNotFoundError, NotADirectoryError):
        return []
    found = []
    _walk(fd, "", found)
    return sorted(found, key=lambda a: a.name)


def _walk(fd, prefix, found):
    try:
        with os.scandir(fd) as entries:
            for entry in entries:
                try:
                    info = entry.stat(follow_symlinks=False)
                except FileNotFoundError:
                    continue
                name = prefix + entry.name
                if stat.S_ISREG(info.st_mode):
                    found.append(Artifact(name, info.st_size, info.st_mtime))
                elif stat.S_ISDIR(info.st_mode):
                    try:
                        child = os.open(entry.name, _DIR_FLAGS, dir_fd=fd)
                    except OSError:
                        continue
                    _walk(child, name + "/", found)
    finally:
        os.close(fd)


def total_size(root):
    return sum(artifact.size for artifact in listing(root))


def open_artifact(root, name):
    """The file `name` under `root`, opened for reading in binary; BadName for a name that leaves
    the folder, FileNotFoundError for one that is not a regular file inside it (a link included)."""
    pieces = parts(name)
    try:
        fd = os.open(root, _DIR_FLAGS)
    except (NotADirectoryError, OSError) as exc:
        raise FileNotFoundError(name) from exc
    try:
        for piece in pieces[:-1]:
            try:
                child = os.open(piece, _DIR_FLAGS, dir_fd=fd)
            except OSError as exc:
                raise FileNotFoundError(name) from exc
            os.close(fd)
            fd = child
        try:
            handle = os.open(pieces[-1], os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK, dir_fd=fd)
        except OSError as exc:
            raise FileNotFoundError(name) from exc
    finally:
        os.close(fd)
    if not stat.S_ISREG(os.fstat(handle).st_mode):
        os.close(handle)
        raise FileNotFoundError(name)
    os.set_blocking(handle, True)
    return os.fdopen(handle, "rb")


def newest_match(root, pattern):
    """The name of the newest file under `root` whose name (or its last part) matches the glob
    `pattern`, or None."""
    matching = [a for a in listing(root)
                if fnmatch.fnmatchcase(a.name, pattern) or fnmatch.fnmatchcase(PurePosixPath(a.name).name, pattern)]
    return max(matching, key=lambda a: (a.modified, a.name)).name if matching else None


def copy_into(root, name, target):
    """Copy the artifact `name` of `root` to the file `target` (made anew)."""
    with open_artifact(root, name) as source, open(target, "wb") as out:
        while chunk := source.read(1 << 20):
            out.write(chunk)


def tar_gz(root):
    """The artifacts under `root` (None: none) as a .tar.gz, yielded in pieces as it is made, so
    a large output is never held in memory. Each file holds the size it had when opened (a file
    that shrinks meanwhile is padded with zeros, one that grows is cut there)."""
    packer = zlib.compressobj(6, zlib.DEFLATED, 31)          # wbits 31: a gzip stream
    for artifact in listing(root) if root is not None else []:
        try:
            source = open_artifact(root, artifact.name)
        except FileNotFoundError:
            continue
        with source:
            info = tarfile.TarInfo(artifact.name)
            opened = os.fstat(source.fileno())
            info.size, info.mtime, info.mode = opened.st_size, int(opened.st_mtime), 0o644
            yield packer.compress(info.tobuf(tarfile.PAX_FORMAT))
            left = info.size
            while left > 0:
                chunk = source.read(min(left, 1 << 20)) or b"\0" * min(left, 1 << 20)
                left -= len(chunk)
                yield packer.compress(chunk)
            if info.size % tarfile.BLOCKSIZE:
                yield packer.compress(b"\0" * (tarfile.BLOCKSIZE - info.size % tarfile.BLOCKSIZE))
    yield packer.compress(b"\0" * (2 * tarfile.BLOCKSIZE)) + packer.flush()
