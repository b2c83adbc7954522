"""What a job's Python says before the job is queued, read as text: nothing of it runs.

- Syntax: every .py file of a project, and a one-file script, is compiled with the portal's own
  interpreter (compile(), which builds code and runs none of it). Each file that does not compile
  is a problem naming the file and the line: `src/model.py, line 12: invalid syntax`. What
  Python only warns about (SyntaxWarning, DeprecationWarning) is no problem. The job's image may
  run another Python than the portal's: syntax that only a newer one takes is refused here too.
- Launcher: the entry point, and the project's modules it imports (followed from file to file),
  say which launcher the script is written for: an import of Horovod's framework module
  (`import horovod.torch as hvd`) asks for horovodrun, a use of torch.distributed's
  `init_process_group` asks for torchrun. A script that asks for the other launcher than its
  job's gets a warning (the job is still created): under it each rank would run alone, and the
  rank launcher (runners/job_python/ringmaster_rank.py) fails the job once the ranks report a
  world that is not the job's size.
"""
import ast
import posixpath
import threading
import warnings
from dataclasses import dataclass

from runners import launchers

HOROVOD_FRAMEWORKS = ("torch", "tensorflow", "keras", "mxnet")
MAX_PROBLEMS_NAMED = 10
_warnings_lock = threading.Lock()       # warnings.catch_warnings changes the process's filters


@dataclass(frozen=True)
class Ask:
    """Where a script shows the launcher it is written for."""
    launcher: str
    path: str
    line: int
    what: str          # "imports horovod.torch", "calls init_process_group"


@dataclass(frozen=True)
class Report:
    problems: tuple[str, ...]    # "path, line N: message" of each file that does not compile
    asks: tuple[Ask, ...]        # of the entry point and the project's modules it imports

    def launchers(self):
        return {ask.launcher for ask in self.asks}


def report(files, entry_point):
    """The Report of `files` ({path: bytes}, every file of the project; only .py files are read),
    run from `entry_point` (one of them)."""
    problems, facts = [], {}
    for path in sorted(name for name in files if name.endswith(".py")):
        tree, problem = _compiled(path, files[path])
        if problem is not None:
            problems.append(problem)
        else:
            facts[path] = _facts(path, tree)
    return Report(tuple(problems), tuple(_asks_from(entry_point, facts)))


def problem_text(report):
    """The problems as the messages of one field: at most MAX_PROBLEMS_NAMED, then how many more."""
    shown = list(report.problems[:MAX_PROBLEMS_NAMED])
    if len(report.problems) > MAX_PROBLEMS_NAMED:
        shown.append(f"... and {len(report.problems) - MAX_PROBLEMS_NAMED} more files that do not compile.")
    return shown


def launcher_warning(report, launcher, checked):
    """A warning where the script asks only for another launcher than `launcher`, the job's
    (None: it fits, asks for none, or asks for both). `checked`: the job's ranks hold the world
    they make to its size (a job of one size, of more than one rank), so it would fail."""
    asked = report.launchers()
    if len(asked) != 1 or launcher in asked or launcher not in launchers.LAUNCHERS:
        return None
    ask = report.asks[0]
    wanted, running = launchers.LAUNCHERS[ask.launcher].label, launchers.LAUNCHERS[launcher].label
    then = " As it is, the job fails when its ranks report a world size that is not the job's." if checked else ""
    return (f"{ask.path} {ask.what} (line {ask.line}): a {wanted} script, but this job's launcher is {running}, "
            f"under which each of its ranks would run alone. Pick {wanted}.{then}")


def _compiled(path, content):
    """(the module's tree, None), or (None, the problem) where it does not compile."""
    with _warnings_lock, warnings.catch_warnings():
        warnings.simplefilter("ignore")         # a warning (or -W error making one an error) is no problem
        try:
            tree = compile(content, path, "exec", ast.PyCF_ONLY_AST, dont_inherit=True)
            # What only the compiler checks: 'return' outside a function, a bad nonlocal, ...
            compile(tree, path, "exec", dont_inherit=True)
        except SyntaxError as exc:
            where = f", line {exc.lineno}" if exc.lineno else ""
            return None, f"{path}{where}: {exc.msg}"
        except (ValueError, RecursionError, MemoryError) as exc:    # NUL bytes; nesting past the compiler's limit
            return None, f"{path}: {exc or type(exc).__name__}"
    return tree, None


@dataclass(frozen=True)
class _Facts:
    imports: tuple[str, ...]     # the project paths an import there may load
    asks: tuple[Ask, ...]


def _facts(path, tree):
    imports, asks = [], []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                imports += _candidates(path, alias.name, (), 0)
                if _is_horovod(alias.name):
                    asks.append(Ask("horovod", path, node.lineno, f"imports {alias.name}"))
        elif isinstance(node, ast.ImportFrom):
            module, names = node.module or "", tuple(alias.name for alias in node.names)
            imports += _candidates(path, module, names, node.level)
            if node.level == 0:
                for name in names:
                    if _is_horovod(module) or (module == "horovod" and _is_horovod(f"horovod.{name}")):
                        asks.append(Ask("horovod", path, node.lineno, f"imports {module}"
                                        f"{'' if _is_horovod(module) else '.' + name}"))
                        break
                if "init_process_group" in names and module.startswith("torch"):
                    asks.append(Ask("torchrun", path, node.lineno, "imports init_process_group"))
        elif isinstance(node, ast.Attribute) and node.attr == "init_process_group":
            asks.append(Ask("torchrun", path, node.lineno, "calls init_process_group"))
    return _Facts(tuple(dict.fromkeys(imports)), tuple(sorted(asks, key=lambda ask: ask.line)))


def _is_horovod(module):
    parts = module.split(".")
    return len(parts) > 1 and parts[0] == "horovod" and parts[1] in HOROVOD_FRAMEWORKS


def _candidates(path, module, names, level):
    """The project paths that `import module` / `from module import names` in the file `path` may
    load: from the file's folder (where `python` finds the modules of a script's folder, and the
    package of a relative import) and from the project's root."""
    here = posixpath.dirname(path)
    if level:
        for _ in range(level - 1):
            here = posixpath.dirname(here)
        bases = [here]
    else:
        bases = list(dict.fromkeys([here, ""]))
    found = []
    for base in bases:
        parts = [part for part in module.split(".") if part]
        for depth in range(1, len(parts) + 1):               # each package on the way, then the module
            stem = posixpath.join(base, *parts[:depth])
            found += [stem + ".py", stem + "/__init__.py"]
        stem = posixpath.join(base, *parts) if parts else base
        for name in names:                                   # `from package import module`
            found += [posixpath.join(stem, name) + ".py", posixpath.join(stem, name, "__init__.py")]
    return found


def _asks_from(entry_point, facts):
    """The asks of the entry point and of every project module it imports, file by file."""
    seen, queue, asks = {entry_point}, [entry_point], []
    while queue:
        path = queue.pop(0)
        if path not in facts:
            continue
        asks += facts[path].asks
        for target in facts[path].imports:
            if target in facts and target not in seen:
                seen.add(target)
                queue.append(target)
    return asks
