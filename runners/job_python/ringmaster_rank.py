"""Start one rank of a job: `python -m ringmaster_rank`, in the job's folder, on every host.

horovodrun parses its command line with argparse, which reads a script's own words as
abbreviations of horovodrun's options (`--network resnet50` "could match --network-interface"),
so no word of the user reaches horovodrun: the portal writes the rank's command, [script, args...],
to `argv.json` in the job folder, horovodrun starts this module in that folder (on every host:
Gloo cds each rank to the launcher's folder, the same path everywhere), and this module reads
it and becomes the script (exec), so the script gets its words exactly as given.

A job that owns GPUs also gets them here. horovodrun gives every rank the same environment, but
a job owns different GPUs on each of its hosts: the portal puts them in RINGMASTER_GPU_MAP
("host=0,1;host2=4,5", hosts as horovodrun's -H names them), horovodrun tells each rank its host
in HOROVOD_HOSTNAME, and this sets CUDA_VISIBLE_DEVICES to that host's indices, so
hvd.local_rank() 0, 1, ... is the job's first, second, ... GPU there and an unchanged Horovod
script (torch.cuda.set_device(hvd.local_rank())) trains on what the job owns. An agent of an
elastic torchrun job has one GPU of its host (RINGMASTER_SLOT says which): its worker sees that one.

A rank of an elastic job (horovodrun sets HOROVOD_ELASTIC=1) runs its script in this process
instead, after turning off Horovod's shortcut of skipping the state sync after a reset that
only removed workers: when workers are removed while a growth's new ones are still joining
(Horovod issue #3494, open), the survivors skip the sync, the new ranks sync, and each waits for
the other for good. With the shortcut off every rank syncs after every reset: one broadcast of
the committed state more on a shrink.

Under torchrun (RINGMASTER_PREFIX_OUTPUT=1) the worker's output gets what horovodrun gives a
rank's: each line prefixed with its global RANK (`[1]<stdout>:`), by a process of its own that
reads the worker's stdout and stderr through pipes, so that the lines of C code, of child
processes and of a crash are prefixed too and nothing is lost when the worker dies. The script
runs in this process under torch.distributed.elastic's `record`, which writes the worker's
error file (TORCHELASTIC_ERROR_FILE): torchrun names the first failure from those files.

A job of one size tells its ranks how many it has (RINGMASTER_WORLD_SIZE), and its script then
runs in this process with hvd.init() and torch.distributed.init_process_group() watched: where
the world they make is not the job's, the rank stops with WorldSizeMismatch, a plain message
that runners.output and the job's reason know. A Horovod script under torchrun makes a world of
1 on each rank (hvd.init() finds no horovodrun), and a torchrun script under horovodrun finds no
RANK or WORLD_SIZE (or, where it sets them itself, a world of 1): without the check such a job
ends well, each of its ranks having trained alone. Each hook is set once its module is imported
by the script (AfterImport), so a script that imports neither pays for neither.
"""
import functools
import importlib.abc
import json
import os
import runpy
import sys

ARGV_FILE = "argv.json"
MAP = "RINGMASTER_GPU_MAP"
PREFIX_OUTPUT = "RINGMASTER_PREFIX_OUTPUT"
# An elastic job's GPUs change while it runs: the portal keeps them in this file of the job folder
# (its name in this variable), and a rank started after a resize reads the map there.
MAP_FILE = "RINGMASTER_GPU_MAP_FILE"
# Where a host's ranks start in groups (an elastic torchrun job: an agent of one worker per GPU),
# the position of the group's first GPU among the host's: its workers see from there on.
SLOT = "RINGMASTER_SLOT"
# Where the job's ranks write their artifacts: made here, as the job, before its script runs.
OUTPUT_DIR = "RINGMASTER_OUTPUT_DIR"
# A job that runs a project: the project's folder (runners.projects), the rank's working
# directory, where its entry point's path starts.
PROJECT_DIR = "RINGMASTER_PROJECT_DIR"
# The number of ranks of a job of one size (runners.base.WORLD_SIZE_VAR); unset: not checked.
WORLD_SIZE = "RINGMASTER_WORLD_SIZE"


class WorldSizeMismatch(Exception):
    """The script's ranks did not make the job's world (its name: runners.output.WORLD_SIZE_MISMATCH)."""


def indices_for(mapping, host):
    for entry in mapping.split(";"):
        name, _, indices = entry.partition("=")
        if name == host:
            return indices
    return None


def read_argv(path=ARGV_FILE):
    try:
        with open(path, encoding="utf-8") as handle:
            argv = json.load(handle)
    except (OSError, ValueError) as exc:
        sys.exit(f"ringmaster: cannot read this rank's command from {os.path.abspath(path)}: {exc}")
    if not (isinstance(argv, list) and argv and all(isinstance(word, str) for word in argv)):
        sys.exit(f"ringmaster: {os.path.abspath(path)} holds no command")
    return argv


def bind_gpus(environ):
    mapping = environ.get(MAP)
    if environ.get(MAP_FILE):
        try:
            with open(environ[MAP_FILE], encoding="utf-8") as handle:
                mapping = handle.read().strip()
        except OSError as exc:
            sys.exit(f"ringmaster: cannot read this job's GPUs from {os.path.abspath(environ[MAP_FILE])}: {exc}")
    if mapping is None:
        return                                  # a job that owns no GPUs of its own
    host = environ.get("HOROVOD_HOSTNAME") or environ.get("RINGMASTER_HOSTNAME", "")
    indices = indices_for(mapping, host)
    if indices is None:
        sys.exit(f"ringmaster: this job owns no GPUs on host {host!r} ({MAP}={mapping!r})")
    if environ.get(SLOT):
        first = int(environ[SLOT])
        count = int(environ.get("LOCAL_WORLD_SIZE", "1"))
        indices = ",".join(indices.split(",")[first:first + count])
        if not indices:
            sys.exit(f"ringmaster: this job owns no GPU {first} on host {host!r} ({MAP}={mapping!r})")
    environ["CUDA_VISIBLE_DEVICES"] = indices


def always_sync_after_a_reset():
    """Every HostsUpdatedInterrupt asks for the state sync (horovod.common.elastic.run_fn skips
    it when the interrupt says only workers were removed)."""
    try:
        from horovod.common import exceptions
    except ImportError:                         # no Horovod here: nothing to change
        return
    interrupt = exceptions.HostsUpdatedInterrupt
    original = interrupt.__init__

    def __init__(self, skip_sync):
        original(self, False)

    interrupt.__init__ = __init__


class AfterImport(importlib.abc.MetaPathFinder):
    """Calls hooks[name](module) once the module `name` is imported, whoever imports it: first on
    sys.meta_path, it finds the module through the finders after it, and runs the hook after the
    module's own code."""

    def __init__(self, hooks):
        self.hooks = dict(hooks)

    def find_spec(self, name, path=None, target=None):
        hook = self.hooks.pop(name, None)
        if hook is None:
            return None
        for finder in sys.meta_path:
            if finder is not self and hasattr(finder, "find_spec"):
                spec = finder.find_spec(name, path, target)
                if spec is not None and spec.loader is not None and hasattr(spec.loader, "exec_module"):
                    spec.loader = _HookedLoader(spec.loader, hook)
                    return spec
                if spec is not None:
                    return spec
        return None


class _HookedLoader:
    """The module's own loader (every attribute its), whose exec_module then calls the hook."""

    def __init__(self, loader, hook):
        self.loader, self.hook = loader, hook

    def __getattr__(self, name):
        return getattr(self.loader, name)

    def create_module(self, spec):
        return self.loader.create_module(spec)

    def exec_module(self, module):
        self.loader.exec_module(module)
        self.hook(module)


def mismatch(expected, what, size=None):
    """The plain words of a world that is not the job's: `what` made a world of `size` ranks
    (None: it could not start one), under the launcher the environment tells."""
    under_torchrun = "TORCHELASTIC_RUN_ID" in os.environ
    under_horovodrun = "HOROVOD_RANK" in os.environ
    seen = f"saw a world of {size}" if size is not None else \
        "found no RANK or WORLD_SIZE, which torchrun sets and horovodrun does not"
    hint = ""
    if what == "hvd.init()" and under_torchrun:
        hint = ": a Horovod script under torchrun? Pick the Horovod launcher"
    elif what != "hvd.init()" and under_horovodrun:
        hint = ": a torchrun script under horovodrun? Pick the torchrun launcher"
    return WorldSizeMismatch(f"this job has {expected} ranks but {what} {seen}{hint}.")


def watch_world_size(environ):
    """Check the world that hvd.init() and torch.distributed.init_process_group() make against
    the job's size (RINGMASTER_WORLD_SIZE), once the script imports Horovod or torch.distributed."""
    try:
        expected = int(environ.get(WORLD_SIZE, ""))
    except ValueError:
        return
    hooks = {"horovod.common.basics": lambda module: _watch_horovod(module, expected),
             "torch.distributed": lambda module: _watch_torch(module, expected)}
    for name in [name for name in hooks if name in sys.modules]:   # imported already (a sitecustomize)
        hooks.pop(name)(sys.modules[name])
    sys.meta_path.insert(0, AfterImport(hooks))


def _watch_horovod(basics, expected):
    cls = basics.HorovodBasics
    original = cls.init

    def init(self, comm=None, *args, **kwargs):
        result = original(self, comm, *args, **kwargs)
        if comm is None and self.size() != expected:     # hvd.init(comm=[ranks]): a smaller world on purpose
            raise mismatch(expected, "hvd.init()", self.size())
        return result

    cls.init = init


def _watch_torch(distributed, expected):
    c10d = getattr(distributed, "distributed_c10d", None)
    original = getattr(c10d, "init_process_group", None)
    if original is None:                      # a torch built without distributed support
        return

    @functools.wraps(original)
    def init_process_group(*args, **kwargs):
        hook = sys.excepthook
        try:
            result = original(*args, **kwargs)
        except Exception as exc:
            if "HOROVOD_RANK" in os.environ and not {"RANK", "WORLD_SIZE"} <= set(os.environ):
                raise mismatch(expected, "torch.distributed.init_process_group()") from exc
            raise
        size = c10d.get_world_size()
        if size != expected:
            # Its traceback as Python prints it (not each line as "[rank0]: ...", torch's hook).
            c10d.destroy_process_group()
            sys.excepthook = hook
            raise mismatch(expected, "torch.distributed.init_process_group()", size)
        return result

    c10d.init_process_group = distributed.init_process_group = init_process_group


def run_here(argv):
    """Run the script as `python script args...` would, in this process."""
    sys.argv = list(argv)
    sys.path[0] = os.path.dirname(os.path.abspath(argv[0]))
    runpy.run_path(argv[0], run_name="__main__")


def prefix_output(rank):
    """Send this process's stdout and stderr (fds 1 and 2, which its children inherit) through
    pipes to a child that writes each line to the original streams as `[rank]<stream>:line`,
    whole lines at a time, until every writer has closed them."""
    pipes = {1: os.pipe(), 2: os.pipe()}
    if os.fork() == 0:                              # the prefixer
        try:
            for read, write in pipes.values():
                os.close(write)
            _copy_prefixed(rank, {read: fd for fd, (read, write) in pipes.items()})
        finally:
            os._exit(0)
    sys.stdout.flush()
    sys.stderr.flush()
    for fd, (read, write) in pipes.items():
        os.close(read)
        os.dup2(write, fd)
        os.close(write)


def _copy_prefixed(rank, sources):
    import selectors

    names = {1: "stdout", 2: "stderr"}
    own = f"[rank{rank}]: ".encode()
    selector = selectors.DefaultSelector()
    pending = {}
    for read, fd in sources.items():
        selector.register(read, selectors.EVENT_READ, fd)
        pending[read] = b""
    while pending:
        for key, _ in selector.select():
            read, fd = key.fileobj, key.data
            data = os.read(read, 65536)
            head = f"[{rank}]<{names[fd]}>:".encode()
            if not data:                            # every writer closed it
                if pending[read]:
                    _write_all(fd, head + _untagged(pending.pop(read), own) + b"\n")
                else:
                    pending.pop(read)
                selector.unregister(read)
                continue
            lines = (pending[read] + data).split(b"\n")
            pending[read] = lines.pop()
            if lines:
                _write_all(fd, b"".join(head + _untagged(line, own) + b"\n" for line in lines))


def _untagged(line, own):
    """The line without the `[rank1]: ` that torch.distributed puts before each line of an
    uncaught exception's traceback: the line's prefix says its rank already."""
    return line[len(own):] if line.startswith(own) else line


def _write_all(fd, data):
    while data:
        data = data[os.write(fd, data):]


def run_recorded(argv):
    """Run the script here under torch.distributed.elastic's `record` (its error file for
    torchrun), exiting with the script's status. A script that ends (or exits) ends the worker
    after its exit handlers, without the interpreter's teardown: there torch's Gloo threads can
    abort a worker whose training succeeded ("terminate called without an active exception",
    2 runs in 16 of the synthetic benchmark). An exception still ends it the usual way."""
    import atexit

    from torch.distributed.elastic.multiprocessing.errors import record

    try:
        record(lambda: run_here(argv))()
        code = 0
    except SystemExit as exc:
        code = exc.code
    if code is not None and not isinstance(code, int):
        print(code, file=sys.stderr)
        code = 1
    atexit._run_exitfuncs()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code or 0)


def main():
    argv = read_argv()
    given = os.environ.get("CUDA_VISIBLE_DEVICES")
    bind_gpus(os.environ)
    if os.environ.get("CUDA_VISIBLE_DEVICES") != given and runs_in_this_process(os.environ):
        # Start again with the GPUs in the process's own environment, as an exec'ed script has
        # them: what /proc/PID/environ shows (the portal's and nvidia-smi's view of the rank) is
        # what the process started with, not what it set since.
        sys.stdout.flush()
        os.execv(sys.executable, [sys.executable, "-m", __spec__.name if __spec__ else "ringmaster_rank"])
    if os.environ.get(OUTPUT_DIR):
        try:
            os.makedirs(os.environ[OUTPUT_DIR], mode=0o700, exist_ok=True)
        except OSError as exc:        # the script still runs; it finds no folder there
            print(f"ringmaster: cannot make {OUTPUT_DIR} {os.environ[OUTPUT_DIR]}: {exc}", file=sys.stderr)
    if os.environ.get(PROJECT_DIR):
        os.chdir(os.environ[PROJECT_DIR])
    if os.environ.get(PREFIX_OUTPUT) == "1":
        prefix_output(os.environ.get("RANK", "?"))
        watch_world_size(os.environ)
        run_recorded(argv)
    elif os.environ.get("HOROVOD_ELASTIC") == "1":
        always_sync_after_a_reset()
        run_here(argv)
    elif os.environ.get(WORLD_SIZE):
        watch_world_size(os.environ)
        run_here(argv)
    else:
        os.execv(sys.executable, [sys.executable, *argv])


def runs_in_this_process(environ):
    """Whether main runs the script in this process (torchrun's output prefixed, an elastic
    Horovod rank, a world size to check) rather than exec it."""
    return environ.get(PREFIX_OUTPUT) == "1" or environ.get("HOROVOD_ELASTIC") == "1" or bool(environ.get(WORLD_SIZE))


if __name__ == "__main__":
    main()
