"""Projects: the tree of files a job runs, with its entry point inside it and the working
directory at its root, so that `import datautils` and relative paths work as on a laptop.

An archive a user uploads (a .zip, or a .tar.gz) is read as untrusted: every member is checked
before a byte of it is kept, and nothing is written anywhere while reading. Refused, each with a
reason that names the member: absolute paths, `..`, backslashes and NUL in names, links
(symbolic or hard), devices, FIFOs and anything else that is not a plain file or a folder, a
path given twice or as both a file and a folder, encrypted zip members; and archives past the
limits (their own size, the files' count, the bytes they expand to, counted as they are
decompressed, not as the archive claims: a zip bomb stops at the limit).

A project is kept as its files, and known by `digest`: the SHA-256 of its paths, their
executable bit and their contents, in path order. Where every member lies in one top folder
(a zip of `my-project/`), that folder is taken off, so a folder packed by `ringmaster submit
./my-project` and the same folder zipped in a file manager are the same snapshot. `pack` writes
the files as a tar.gz with nothing of the machine that made it (owners, times), which
`lay_out` unpacks into a job's folder, as the job's runner does.
"""
import gzip
import hashlib
import io
import os
import stat
import tarfile
import zipfile
from dataclasses import dataclass
from pathlib import PurePosixPath

CHUNK = 1 << 16
MAX_PATH_CHARS = 1024
MAX_DEPTH = 64
# Where a job's project lies in its folder (the working directory of its ranks), and the
# variable that names it to the rank launcher (job_python/ringmaster_rank.py).
PROJECT_DIR = "project"
PROJECT_DIR_VAR = "RINGMASTER_PROJECT_DIR"
# How a job's own machine (an instance, a pod) unpacks `pack`'s archive with its system tar (GNU
# or BusyBox), followed by `-f ARCHIVE -C FOLDER`: the files are whoever unpacks them's (-o), with
# the time they are unpacked at (-m). The archive was read as untrusted when it was uploaded (plain
# files only, every path inside the project), so nothing lands outside FOLDER.
UNTAR = "tar -x -z -o -m"


class BadProject(ValueError):
    """What is wrong with an archive, in words for its uploader."""


@dataclass(frozen=True)
class Limits:
    archive_bytes: int            # the archive as uploaded
    expanded_bytes: int           # all its files together, decompressed
    files: int


@dataclass(frozen=True)
class File:
    path: str
    content: bytes
    executable: bool = False


def read_archive(data, limits):
    """The files of an uploaded archive (a .zip or a .tar.gz, told by its first bytes), in path
    order, its one top folder taken off; BadProject if anything in it is refused."""
    if len(data) > limits.archive_bytes:
        raise BadProject(f"The archive is {len(data):,} bytes; at most {limits.archive_bytes:,} are taken.")
    counter = _Counter(limits)
    if data[:4] == b"PK\x03\x04" or data[:4] == b"PK\x05\x06":
        files = _read_zip(data, counter)
    elif data[:2] == b"\x1f\x8b":
        files = _read_tar(data, counter)
    else:
        raise BadProject("Not a .zip or .tar.gz archive.")
    if not files:
        raise BadProject("The archive holds no file.")
    return _without_top_folder(_checked_tree(files))


def digest(files):
    """The snapshot's SHA-256: every file's path, executable bit and content, in path order."""
    total = hashlib.sha256()
    for file in sorted(files, key=lambda f: f.path):
        total.update(b"%s\0%d\0%s\n" % (file.path.encode(), file.executable, hashlib.sha256(file.content).digest()))
    return total.hexdigest()


def pack(files):
    """The files as a tar.gz with no owner, time or name of the machine that made it."""
    buffer = io.BytesIO()
    with gzip.GzipFile(fileobj=buffer, mode="wb", mtime=0, filename="") as zipped, \
            tarfile.open(fileobj=zipped, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for file in sorted(files, key=lambda f: f.path):
            info = tarfile.TarInfo(file.path)
            info.size, info.mode, info.mtime = len(file.content), 0o755 if file.executable else 0o644, 0
            tar.addfile(info, io.BytesIO(file.content))
    return buffer.getvalue()


def unpack(archive):
    """The files of an archive `pack` wrote (read with the same checks as an upload's)."""
    return _checked_tree(_read_tar(archive, _Counter(Limits(len(archive), 1 << 40, 1 << 24))))


def lay_out(archive, directory):
    """Write a packed project's files under `directory` (made, 0755; files 0644 or 0755)."""
    directory = os.fspath(directory)
    os.makedirs(directory, mode=0o755, exist_ok=True)
    for file in unpack(archive):
        target = os.path.join(directory, *file.path.split("/"))
        os.makedirs(os.path.dirname(target), mode=0o755, exist_ok=True)
        descriptor = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW,
                             0o755 if file.executable else 0o644)
        with os.fdopen(descriptor, "wb") as out:
            out.write(file.content)


def listing(files):
    """[{"path", "size"}] in path order."""
    return [{"path": file.path, "size": len(file.content)} for file in sorted(files, key=lambda f: f.path)]


def entry_point_problem(files, entry_point):
    """Why `entry_point` cannot start this project (None: it can)."""
    name = clean_path(entry_point)
    if name is None:
        return f"{entry_point!r} is not a path inside the project."
    if not name.endswith(".py"):
        return f"The entry point must be a .py file; {name} is not."
    if name not in {file.path for file in files}:
        return f"The project has no file {name}."
    return None


def clean_path(name):
    """`name` as a relative path with / between its parts, or None where it is absolute, climbs
    out (..), or holds a backslash, a NUL or nothing."""
    if not name or "\\" in name or "\0" in name or name.startswith("/") or len(name) > MAX_PATH_CHARS:
        return None
    parts = [part for part in name.split("/") if part not in ("", ".")]
    if not parts or ".." in parts:
        return None
    return "/".join(parts)


class _Counter:
    def __init__(self, limits):
        self.limits, self.files, self.bytes = limits, 0, 0

    def file(self, name):
        self.files += 1
        if self.files > self.limits.files:
            raise BadProject(f"The archive holds more than {self.limits.files:,} files.")

    def read(self, stream, name):
        chunks = []
        while True:
            chunk = stream.read(CHUNK)
            if not chunk:
                return b"".join(chunks)
            self.bytes += len(chunk)
            if self.bytes > self.limits.expanded_bytes:
                raise BadProject(f"The archive expands past {self.limits.expanded_bytes:,} bytes (at {name}).")
            chunks.append(chunk)


def _member_path(name):
    path = clean_path(name.rstrip("/")) if name.rstrip("/") else None
    if path is None:
        raise BadProject(f"{name!r}: an absolute path, '..', a backslash or an empty name is refused.")
    if len(PurePosixPath(path).parts) > MAX_DEPTH:
        raise BadProject(f"{name!r}: folders deeper than {MAX_DEPTH} are refused.")
    return path


def _read_zip(data, counter):
    files = []
    try:
        with zipfile.ZipFile(io.BytesIO(data)) as archive:
            for info in archive.infolist():
                path = _member_path(info.filename)
                mode = info.external_attr >> 16 if info.create_system == 3 else 0     # unix modes, where made on unix
                if info.is_dir() or stat.S_ISDIR(mode):
                    continue
                if stat.S_IFMT(mode) not in (0, stat.S_IFREG):      # 0: no type given, a plain file
                    raise BadProject(f"{info.filename!r}: only plain files and folders are taken (a link or a device is refused).")
                if info.flag_bits & 0x1:
                    raise BadProject(f"{info.filename!r}: encrypted members are refused.")
                counter.file(path)
                with archive.open(info) as stream:
                    files.append(File(path, counter.read(stream, path), bool(mode & 0o111)))
    except (zipfile.BadZipFile, zipfile.LargeZipFile, NotImplementedError, EOFError) as exc:
        raise BadProject(f"The zip archive cannot be read: {exc}.") from None
    return files


def _read_tar(data, counter):
    files = []
    try:
        with tarfile.open(fileobj=io.BytesIO(data), mode="r:gz") as archive:
            for member in archive:
                path = _member_path(member.name)
                if member.isdir():
                    continue
                if not member.isreg():
                    raise BadProject(f"{member.name!r}: only plain files and folders are taken (a link or a device is refused).")
                if member.size > counter.limits.expanded_bytes - counter.bytes:
                    raise BadProject(f"The archive expands past {counter.limits.expanded_bytes:,} bytes (at {path}).")
                counter.file(path)
                files.append(File(path, counter.read(archive.extractfile(member), path), bool(member.mode & 0o111)))
    except (tarfile.TarError, EOFError, OSError, gzip.BadGzipFile) as exc:
        raise BadProject(f"The tar.gz archive cannot be read: {exc}.") from None
    return files


def _checked_tree(files):
    """`files` in path order; BadProject where a path is given twice, or is a file and a folder."""
    seen, folders = set(), set()
    for file in files:
        if file.path in seen:
            raise BadProject(f"{file.path!r} is in the archive twice.")
        seen.add(file.path)
        folders.update(str(parent) for parent in PurePosixPath(file.path).parents if str(parent) != ".")
    both = seen & folders
    if both:
        raise BadProject(f"{sorted(both)[0]!r} is both a file and a folder in the archive.")
    return sorted(files, key=lambda f: f.path)


def _without_top_folder(files):
    tops = {file.path.split("/", 1)[0] for file in files}
    if len(tops) == 1 and all("/" in file.path for file in files):
        top = tops.pop() + "/"
        return [File(file.path[len(top):], file.content, file.executable) for file in files]
    return files
