"""A job's artifacts: the files its ranks write under RINGMASTER_OUTPUT_DIR, read from a folder on
the portal's machine (a local job's own output folder, or where the portal keeps what it brought
back from an instance).

The folder may be written by the job itself, so nothing here follows a symbolic link: a name is
a relative path of plain components, each folder on the way is opened with O_NOFOLLOW relative to
the one before (openat), and only a regular file is ever opened. A link the job planted to a file
outside the folder is neither listed nor served.

A tree is walked with a loop, never by recursion, holding at most one open folder per level: a
folder nested thousands deep is listed, archived, counted and deleted like any other. The walk
goes MAX_DEPTH folders down and looks at MAX_ENTRIES names at most; what lies beyond is not
listed but named as skipped (Skipped), with the reason.
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
MAX_DEPTH = 64              # folders below the output folder that a walk enters
MAX_ENTRIES = 100_000       # names (files, folders, anything else) a walk looks at


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


@dataclass(frozen=True)
class Skipped:
    """A folder whose contents a walk left out, and why. Not a file: it is never served."""
    name: str            # the folder, relative to the output folder, "/" at the end ("": that folder itself)
    modified: float
    reason: str

    @property
    def modified_at(self):
        return datetime.fromtimestamp(self.modified, tz=timezone.utc)

    def as_dict(self):
        return {"name": self.name, "size": 0, "modified": self.modified, "skipped": self.reason}


@dataclass(frozen=True)
class Tree:
    files: list          # [Artifact], sorted by name
    skipped: list        # [Skipped], sorted by name


def too_deep(max_depth=MAX_DEPTH):
    return f"more than {max_depth} folders deep: not walked"


def too_many(max_entries=MAX_ENTRIES):
    return (f"the walk stops after {max_entries} files and folders: the rest of this folder and the folders "
            f"after it are left out")


def walk(root, max_depth=MAX_DEPTH, max_entries=MAX_ENTRIES):
    """The Tree under `root`: every regular file (links are skipped) within `max_depth` folders
    and the first `max_entries` names, and the folders left out; empty when `root` does not
    exist. Depth first, one open folder per level (at most max_depth + 1 at once)."""
    try:
        top = os.open(root, _DIR_FLAGS)
    except FileNotFoundError:
        return Tree([], [])
    except OSError as exc:          # a link or a file where the folder should be
        return Tree([], [Skipped("", 0.0, f"the output folder cannot be read: {exc.strerror or exc}")])
    files, skipped, seen = [], [], 0
    stack = [(top, "", 0, None)]    # (open folder, its name + "/", its depth, its subfolders left to enter)
    try:
        while stack:
            fd, prefix, depth, pending = stack[-1]
            if pending is None:                     # entered just now: read it
                subfolders, stopped = [], False
                with os.scandir(fd) as entries:
                    for entry in entries:
                        if seen >= max_entries:
                            stopped = True
                            break
                        seen += 1
                        try:
                            info = entry.stat(follow_symlinks=False)
                        except FileNotFoundError:
                            continue
                        name = prefix + entry.name
                        if stat.S_ISREG(info.st_mode):
                            files.append(Artifact(name, info.st_size, info.st_mtime))
                        elif stat.S_ISDIR(info.st_mode):
                            if depth >= max_depth:
                                skipped.append(Skipped(name + "/", info.st_mtime, too_deep(max_depth)))
                            else:
                                subfolders.append((entry.name, info.st_mtime))
                if stopped:
                    skipped.append(Skipped(prefix, os.fstat(fd).st_mtime, too_many(max_entries)))
                    break
                stack[-1] = (fd, prefix, depth, iter(subfolders))
                continue
            following = next(pending, None)
            if following is None:
                os.close(stack.pop()[0])
                continue
            name, modified = following
            try:
                child = os.open(name, _DIR_FLAGS, dir_fd=fd)
            except FileNotFoundError:
                continue
            except OSError as exc:
                skipped.append(Skipped(f"{prefix}{name}/", modified, f"cannot be read: {exc.strerror or exc}"))
                continue
            stack.append((child, f"{prefix}{name}/", depth + 1, None))
    finally:
        for fd, *_ in stack:
            os.close(fd)
    return Tree(sorted(files, key=lambda a: a.name), sorted(skipped, key=lambda s: s.name))


def listing(root):
    """[Artifact] of every regular file under `root` within the walk's limits (links are
    skipped), sorted by name; [] when the folder does not exist."""
    return walk(root).files


def remove_tree(root):
    """Delete the folder `root` and everything in it, however deep, never following a link (a
    link or a file at `root` is removed itself). One folder is open at a time: it goes down by
    name and back up by "..", checking that ".." is the folder it came from. An OSError where
    something cannot be deleted."""
    try:
        fd = os.open(root, _DIR_FLAGS)
    except FileNotFoundError:
        return
    except OSError:
        if os.path.isdir(root) and not os.path.islink(root):
            raise
        os.unlink(root)
        return
    names, ids = [], [_identity(fd)]        # the folders from root down to fd: names, (device, inode)s
    try:
        while True:
            child = None
            with os.scandir(fd) as entries:
                for entry in entries:
                    if entry.is_dir(follow_symlinks=False):
                        child = entry.name
                        break
                    try:
                        os.unlink(entry.name, dir_fd=fd)
                    except FileNotFoundError:
                        pass
            if child is not None:
                below = os.open(child, _DIR_FLAGS, dir_fd=fd)
                os.close(fd)
                fd = below
                names.append(child)
                ids.append(_identity(fd))
                continue
            if not names:
                break
            above = os.open("..", _DIR_FLAGS, dir_fd=fd)
            os.close(fd)
            fd = above
            ids.pop()
            if _identity(fd) != ids[-1]:
                raise OSError(f"{root}: a folder in it was moved while it was being deleted")
            os.rmdir(names.pop(), dir_fd=fd)
    finally:
        os.close(fd)
    os.rmdir(root)


def _identity(fd):
    info = os.fstat(fd)
    return info.st_dev, info.st_ino


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
        except OSError:
            continue
        with source:
            info = tarfile.TarInfo(artifact.name)
            opened = os.fstat(source.fileno())
            info.size, info.mtime, info.mode = opened.st_size, int(opened.st_mtime), 0o644
            yield packer.compress(info.tobuf(tarfile.PAX_FORMAT))
            left = info.size
            while left > 0:
                try:
                    chunk = source.read(min(left, 1 << 20))
                except OSError:         # unreadable from here on: zeros, as for a file that shrank
                    chunk = b""
                chunk = chunk or b"\0" * min(left, 1 << 20)
                left -= len(chunk)
                yield packer.compress(chunk)
            if info.size % tarfile.BLOCKSIZE:
                yield packer.compress(b"\0" * (tarfile.BLOCKSIZE - info.size % tarfile.BLOCKSIZE))
    yield packer.compress(b"\0" * (2 * tarfile.BLOCKSIZE)) + packer.flush()
