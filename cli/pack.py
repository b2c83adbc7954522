"""A folder packed for `ringmaster submit ./my-project`: which of its files are sent, what is
left out and why, and the .tar.gz that carries them to POST /api/projects/.

Left out, as git would leave them out of a commit:
- every `.git` (the repository's, a submodule's), always;
- what the folder's `.gitignore` files match, each in its own folder and below, with git's
  rules (a deeper file's match wins over a shallower one's; the last matching line of a file
  wins; `!` takes a path back in; a folder left out is not looked into, so nothing in it can be
  taken back);
- what `.ringmasterignore` at the folder's root matches (the same syntax). It has the last
  word, over every `.gitignore`: `!data/` sends a folder that git ignores.
Symbolic links are not followed (a link is left out, wherever it points), nor is anything else
that is not a plain file or a folder.

A file is sent with its path, its content and whether it is executable: what the portal's
snapshot digest is made of, so the folder gives the same snapshot as a zip of the same files.
The archive holds them under one top folder, which the portal takes off: a folder whose files
all lie in one subfolder keeps it.
"""
import gzip
import os
import stat
import tarfile
from dataclasses import dataclass, field
from pathlib import Path

import pathspec

GIT_DIR = ".git"
GITIGNORE = ".gitignore"
RINGMASTERIGNORE = ".ringmasterignore"
TOP = "project"                  # the archive's one top folder (the portal takes it off)
SUMMARY_LINES = 20               # lines of "left out: ..." at most; the rest in one line
ALWAYS = "always"
LINK = "as symbolic links (not followed)"
NOT_A_FILE = "as neither files nor folders"


class PackError(ValueError):
    """Why the folder cannot be packed, in words for its owner."""


@dataclass(frozen=True)
class SentFile:
    path: str                    # relative to the folder, "/" between its parts
    size: int
    executable: bool


@dataclass(frozen=True)
class LeftOut:
    path: str                    # relative to the folder; a folder's ends with "/"
    why: str                     # "by .gitignore", "by src/.gitignore", "by .ringmasterignore", ALWAYS, LINK, ...
    files: int                   # for a folder, the files in it (at any depth)
    size: int


@dataclass
class Selection:
    root: Path
    files: list = field(default_factory=list)          # [SentFile], in path order
    left_out: list = field(default_factory=list)       # [LeftOut], in path order

    @property
    def size(self):
        return sum(file.size for file in self.files)

    def paths(self):
        return {file.path for file in self.files}


class _Rules:
    """The ignore files that apply in one folder: `.ringmasterignore` first, then the
    `.gitignore` files from the deepest up; the first that matches a path decides."""

    def __init__(self, last_word=None, gitignores=()):
        self.last_word = last_word                # (base, spec, name) of .ringmasterignore, or None
        self.gitignores = gitignores              # ((base, spec, name), ...), the deepest first

    def below(self, folder, relative):
        """The rules inside `folder` (at `relative`, "" or "src/"), with its .gitignore."""
        spec = _read_spec(folder / GITIGNORE, relative + GITIGNORE)
        if spec is None:
            return self
        return _Rules(self.last_word, ((relative, spec, f"by {relative}{GITIGNORE}"),) + self.gitignores)

    def why(self, relative, is_folder):
        """"by <ignore file>" where the rules leave `relative` out; None where it is sent."""
        for base, spec, name in ((self.last_word,) if self.last_word else ()) + self.gitignores:
            if not relative.startswith(base):
                continue
            result = spec.check_file(relative[len(base):] + ("/" if is_folder else ""))
            if result.include is not None:
                return name if result.include else None
        return None


def _read_spec(path, shown):
    """The patterns of the ignore file at `path` (None where there is no such plain file)."""
    try:
        if not stat.S_ISREG(os.lstat(path).st_mode):
            return None
        with open(path, encoding="utf-8", errors="replace") as handle:
            lines = handle.read().splitlines()
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise PackError(f"cannot read {shown}: {exc.strerror}") from None
    try:
        return pathspec.GitIgnoreSpec.from_lines(lines)
    except (ValueError, TypeError) as exc:
        raise PackError(f"{shown}: {exc}") from None


def select(root):
    """What of the folder `root` is sent and what is left out."""
    root = Path(root)
    if not root.is_dir():
        raise PackError(f"{root}: not a folder")
    selection = Selection(root=root)
    last_word = _read_spec(root / RINGMASTERIGNORE, RINGMASTERIGNORE)
    rules = _Rules(("", last_word, f"by {RINGMASTERIGNORE}") if last_word else None)
    _walk(root, "", rules.below(root, ""), selection)
    selection.files.sort(key=lambda f: f.path)
    selection.left_out.sort(key=lambda f: f.path)
    return selection


def _walk(folder, relative, rules, selection):
    try:
        entries = sorted(os.scandir(folder), key=lambda entry: entry.name)
    except OSError as exc:
        raise PackError(f"cannot read the folder {relative or '.'}: {exc.strerror}") from None
    for entry in entries:
        path = relative + entry.name
        if entry.is_symlink():
            selection.left_out.append(LeftOut(path, LINK, 1, 0))
        elif entry.is_dir(follow_symlinks=False):
            why = ALWAYS if entry.name == GIT_DIR else rules.why(path, is_folder=True)
            if why:
                files, size = _count(entry.path)
                selection.left_out.append(LeftOut(path + "/", why, files, size))
            else:
                _walk(Path(entry.path), path + "/", rules.below(Path(entry.path), path + "/"), selection)
        elif entry.is_file(follow_symlinks=False):
            info = entry.stat(follow_symlinks=False)
            why = ALWAYS if entry.name == GIT_DIR else rules.why(path, is_folder=False)   # a submodule's .git file
            if why:
                selection.left_out.append(LeftOut(path, why, 1, info.st_size))
            else:
                selection.files.append(SentFile(path, info.st_size, bool(info.st_mode & 0o111)))
        else:
            selection.left_out.append(LeftOut(path, NOT_A_FILE, 1, 0))


def _count(folder):
    """How many files a folder left out holds, at any depth, and their bytes (links not followed)."""
    files = size = 0
    for parent, _, names in os.walk(folder, onerror=lambda error: None):
        for name in names:
            files += 1
            try:
                size += os.lstat(os.path.join(parent, name)).st_size
            except OSError:
                pass
    return files, size


def entry_point(selection, entry):
    """`entry` as a path among the files sent ("./train.py" -> "train.py"); PackError says why
    the job could not start there."""
    parts = [part for part in entry.replace(os.sep, "/").split("/") if part not in ("", ".")]
    if not parts or entry.startswith("/") or ".." in parts:
        raise PackError(f"--entry {entry}: give a path inside the folder, relative to it (e.g. --entry train.py)")
    name = "/".join(parts)
    if not name.endswith(".py"):
        raise PackError(f"--entry {entry}: the entry point must be a .py file")
    if name in selection.paths():
        return name
    for left in selection.left_out:
        if name == left.path or (left.path.endswith("/") and name.startswith(left.path)):
            raise PackError(f"--entry {entry}: {left.path} is left out {left.why}")
    raise PackError(f"--entry {entry}: {selection.root} has no file {name}")


def write_tar_gz(selection, out):
    """The files sent as a .tar.gz into the binary file `out`, under one top folder, with no
    owner or time of this machine. Each file is read as it is now (a file that became a link
    since it was looked at is refused)."""
    if not selection.files:
        raise PackError(f"{selection.root}: no file left to send")
    with gzip.GzipFile(fileobj=out, mode="wb", mtime=0, filename="") as zipped, \
            tarfile.open(fileobj=zipped, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for file in selection.files:
            local = selection.root.joinpath(*file.path.split("/"))
            try:
                descriptor = os.open(local, os.O_RDONLY | os.O_NOFOLLOW)
            except OSError as exc:
                raise PackError(f"cannot read {file.path}: {exc.strerror}") from None
            with os.fdopen(descriptor, "rb") as handle:
                now = os.fstat(descriptor)
                if not stat.S_ISREG(now.st_mode):
                    raise PackError(f"{file.path} is no longer a plain file")
                info = tarfile.TarInfo(f"{TOP}/{file.path}")
                info.size, info.mtime = now.st_size, 0
                info.mode = 0o755 if now.st_mode & 0o111 else 0o644
                try:
                    tar.addfile(info, handle)
                except OSError as exc:          # it shrank while being read
                    raise PackError(f"cannot read {file.path}: {exc}") from None


def summary(selection):
    """Lines for the user: what was left out, a line per top folder (or file) and reason:
    "left out: data/ (3 files, 2.1 GB) by .gitignore"."""
    groups = {}
    for left in selection.left_out:
        top, slash, _ = left.path.partition("/")
        key = (top + slash, left.why)
        files, size = groups.get(key, (0, 0))
        groups[key] = (files + left.files, size + left.size)
    lines = [f"left out: {name} ({_counted(files, size)}) {why}"
             for (name, why), (files, size) in sorted(groups.items())]
    if len(lines) > SUMMARY_LINES:
        rest = sorted(groups.items())[SUMMARY_LINES:]
        files, size = sum(v[0] for _, v in rest), sum(v[1] for _, v in rest)
        lines = lines[:SUMMARY_LINES] + [f"left out: {len(rest)} more ({_counted(files, size)})"]
    return lines


def _counted(files, size):
    return f"{files:,} file{'s' if files != 1 else ''}, {human_size(size)}"


def human_size(size):
    """Bytes in words: "512 B", "34.5 kB", "2.1 GB" (powers of 1000)."""
    if size < 1000:
        return f"{size} B"
    for unit in ("kB", "MB", "GB", "TB"):
        size /= 1000
        if size < 999.95 or unit == "TB":
            return f"{size:.1f} {unit}"
