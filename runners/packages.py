"""A project's extra packages: what its `requirements.txt` (or, without one, its
`pyproject.toml`'s `[project].dependencies`) names, installed on top of the job's image into an
environment kept by the hash of image and requirements, so that the next job with the same pair
starts without installing anything.

The requirements are read as untrusted (`requirements`): each line is a PEP 508 requirement
(`name[extras] specifier ; marker`, with `--hash=` options), a comment or blank, or one of the
few options that only choose among what the index offers (ALLOWED_OPTIONS). Refused, naming the
line: anything that changes where code comes from (`-r`, `-c`, `-e`, `--index-url`,
`--extra-index-url`, `--find-links`, `--trusted-host`, ...), a direct reference (`name @ URL`), a
path or URL, build options (`--config-settings`, `--global-option`). Which index pip asks is the
admin's choice (RINGMASTER_PIP_INDEX_URL), not the project's.

An environment (`Environment`) is a folder `<envs>/<key>`: a virtual environment made by the
image's interpreter with the image's own packages visible beneath it (job_python/ringmaster_install.py
makes it), complete once `<envs>/<key>.complete` exists, which only the portal writes. The
install runs as the job, in a sandbox of its own (runners.supervisor, step `--install`); the
ranks then run the environment's `bin/python`. Every runner that installs packages can use
this module and ringmaster_install.py (standard library only, so it runs on any host or in a
pod before the ranks start).
"""
import hashlib
import json
import os
import tomllib
from dataclasses import dataclass
from pathlib import Path

from packaging.requirements import InvalidRequirement, Requirement

REQUIREMENTS_FILE = "requirements.txt"
PYPROJECT_FILE = "pyproject.toml"
# Options that only choose among what the admin's index offers (whole lines).
ALLOWED_OPTIONS = ("--pre", "--prefer-binary", "--require-hashes", "--only-binary", "--no-binary")
# Options allowed after a requirement on its line.
ALLOWED_REQUIREMENT_OPTIONS = ("--hash",)
MAX_LINES = 1000
# The installer, run by the image's interpreter as the job (runners.supervisor).
INSTALLER = Path(__file__).resolve().parent / "job_python" / "ringmaster_install.py"
# The version of how an environment is made: part of every key, so a change makes new ones.
LAYOUT = 1
KEY_CHARS = 24           # 96 bits of the SHA-256: short enough for #! lines in the env's bin/


class BadRequirements(ValueError):
    """What is wrong with a project's requirements, naming the file and line."""


@dataclass(frozen=True)
class Requirements:
    source: str                  # the file they came from (REQUIREMENTS_FILE or PYPROJECT_FILE)
    lines: tuple[str, ...]       # what pip reads, one line each (checked)
    packages: int                # how many of them name a package

    def text(self):
        return "".join(line + "\n" for line in self.lines)

    def describe(self):
        return f"{self.packages} package{'' if self.packages == 1 else 's'} ({self.source})"


def requirements(files):
    """The requirements of a project given as {path: bytes} (at least its root's
    requirements.txt and pyproject.toml, where it has them); None where it names none.
    BadRequirements where a line is refused."""
    if REQUIREMENTS_FILE in files:
        return parse_requirements_txt(files[REQUIREMENTS_FILE])
    if PYPROJECT_FILE in files:
        return parse_pyproject(files[PYPROJECT_FILE])
    return None


def parse_requirements_txt(data, source=REQUIREMENTS_FILE):
    """Requirements of a requirements.txt's bytes (None: it names no package)."""
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        raise BadRequirements(f"{source} is not UTF-8 text.") from None
    lines, logical, first = [], "", 0
    for number, raw in enumerate(text.splitlines(), 1):
        if not logical:
            first = number
        if raw.endswith("\\"):
            logical += raw[:-1]
            continue
        logical += raw
        line = _without_comment(logical).strip()
        logical = ""
        if line:
            lines.append((first, line))
    if logical.strip():
        lines.append((first, _without_comment(logical).strip()))
    return _checked(source, lines)


def parse_pyproject(data):
    """Requirements of a pyproject.toml's [project].dependencies (None: it lists none)."""
    try:
        table = tomllib.loads(data.decode("utf-8"))
    except (UnicodeDecodeError, tomllib.TOMLDecodeError) as exc:
        raise BadRequirements(f"{PYPROJECT_FILE} cannot be read: {exc}") from None
    dependencies = table.get("project", {}).get("dependencies", []) if isinstance(table.get("project"), dict) else []
    if not isinstance(dependencies, list) or not all(isinstance(item, str) for item in dependencies):
        raise BadRequirements(f"{PYPROJECT_FILE}: [project].dependencies must be a list of strings.")
    for item in dependencies:
        if item.strip().startswith("-") or "\n" in item:
            raise BadRequirements(f"{PYPROJECT_FILE}: {item!r} is not a requirement.")
    return _checked(f"{PYPROJECT_FILE} [project].dependencies", [(n, item.strip()) for n, item in
                                                                   enumerate(dependencies, 1) if item.strip()])


def _without_comment(line):
    """The line up to a `#` that starts it or follows whitespace (pip's rule)."""
    if line.lstrip().startswith("#"):
        return ""
    for index, char in enumerate(line):
        if char == "#" and index > 0 and line[index - 1].isspace():
            return line[:index]
    return line


def _checked(source, numbered):
    if len(numbered) > MAX_LINES:
        raise BadRequirements(f"{source} has more than {MAX_LINES} lines.")
    lines, packages = [], 0
    for number, line in numbered:
        problem = line_problem(line)
        if problem:
            raise BadRequirements(f"{source}, line {number} ({line[:80]!r}): {problem}")
        lines.append(line)
        packages += not line.startswith("-")
    if not packages:
        return None
    return Requirements(source, tuple(lines), packages)


def line_problem(line):
    """Why pip must not be given this requirements line (None: it may)."""
    if "\0" in line or "${" in line:
        return "NUL and ${...} are refused."
    if line.startswith("-"):
        name = line.split("=", 1)[0].split()[0]
        if name not in ALLOWED_OPTIONS:
            return (f"the option {name} is refused: only {', '.join(ALLOWED_OPTIONS)} are taken (where "
                    f"packages come from is the site's choice).")
        return None
    requirement, *options = line.split(" --")
    for option in options:
        name = "--" + option.split("=", 1)[0].split()[0] if option.strip() else "--"
        if name not in ALLOWED_REQUIREMENT_OPTIONS:
            return f"the option {name} is refused after a requirement (only --hash=... is taken)."
    try:
        parsed = Requirement(requirement.strip())
    except InvalidRequirement as exc:
        return f"not a requirement (name, extras, version, marker; no path or URL): {exc}"
    if parsed.url:
        return "a direct reference (name @ URL) is refused: packages come from the site's index."
    return None


@dataclass(frozen=True)
class Environment:
    """Where the environment of an image's interpreter and a project's requirements lies."""
    envs_dir: str
    key: str

    @property
    def path(self):
        return os.path.join(self.envs_dir, self.key)

    @property
    def python(self):
        return os.path.join(self.path, "bin", "python")

    @property
    def complete(self):
        """Written by the portal only, outside the environment, once it is installed."""
        return self.path + ".complete"

    @property
    def lock(self):
        return self.path + ".lock"


def environment(envs_dir, python, reqs, index_url=""):
    """The Environment of the interpreter `python` (as the image names it, not where it links:
    two virtual environments share one base) with `reqs` installed from `index_url`."""
    identity = json.dumps({"layout": LAYOUT, "python": python, "requirements": list(reqs.lines),
                           "index": index_url}, sort_keys=True)
    return Environment(os.fspath(envs_dir), hashlib.sha256(identity.encode()).hexdigest()[:KEY_CHARS])


# What runners.supervisor reports in the install's status file, and the job's event for each.
def status_message(state, reqs_description):
    return {
        "waiting": f"waiting for another job's install of the same {reqs_description}",
        "installing": f"installing {reqs_description} into a new environment",
        "installed": f"installed {reqs_description}; the environment is kept for the next job "
                     f"with the same image and requirements",
        "cached": f"{reqs_description} installed from cache: the environment of an earlier job with the "
                  f"same image and requirements",
        "failed": f"installing {reqs_description} failed",
    }[state]
