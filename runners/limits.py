"""What the kernel lets a job use (JobSpec.max_processes, JobSpec.memory_mib), and the words for a
job that ran into it: the one maker of "hit its memory limit of 512 MiB" and "hit its limit of 64
processes".

How each backend enforces them:
- this machine: runners.supervisor puts the sandbox in a pids and a memory cgroup of its own
  (v2 where the controller is enabled, else v1) and reports what the job hit (HIT_FILE); where no
  cgroup can be made, RLIMIT_NPROC (the job's uid is its own) and RLIMIT_DATA (per process);
- instances: each rank starts under `prlimit` (runners.ssh's rank wrapper) where the job runs as
  a uid of its own, with the same two rlimits (no cgroup there);
- Kubernetes: the pods' memory, requested and limited, is the job's where that is less than
  the cluster's (pod_memory); a pod has no field for processes.

A job held by rlimits learns of it only as a failed call: its words are recognised in what it
printed (printed_hit).
"""
import re

PROCESSES, MEMORY = "processes", "memory"
# What runners.supervisor writes in a job's control folder when the job failed after running
# into a cgroup's limit: a line "processes N" or "memory MIB" for each.
HIT_FILE = "limit_hit"


def mib_words(mib):
    """`512 MiB`, `2 GiB`."""
    return f"{mib >> 10} GiB" if mib >= 1024 and mib % 1024 == 0 else f"{mib} MiB"


def hit_words(kind, limit):
    """Why a job failed, for a limit it ran into: `hit its memory limit of 200 MiB`."""
    if kind == MEMORY:
        return f"hit its memory limit of {mib_words(limit)}"
    return f"hit its limit of {limit} processes"


def supervisor_options(spec, own_uid, hit_file):
    """runners.supervisor's options for the limits of `spec`; `own_uid`: the job runs as a uid
    of its own (RLIMIT_NPROC, which counts per uid, is then the job's alone)."""
    options = []
    if spec.max_processes:
        options += ["--max-processes", str(spec.max_processes)]
    if spec.memory_mib:
        options += ["--memory-mib", str(spec.memory_mib)]
    if options:
        options += ["--cgroup", spec.name, "--hit", str(hit_file), *(["--own-uid"] if own_uid else [])]
    return options


def reported(path):
    """What runners.supervisor wrote in a job's HIT_FILE: (the words for what its cgroups saw it
    hit, or ""; the limits that rlimits held, as Exited.rlimits)."""
    try:
        text = path.read_text()
    except OSError:
        return "", ()
    words, rlimits = [], []
    for line in text.splitlines():
        *held, kind, limit = line.split() or [""]
        if kind not in (PROCESSES, MEMORY) or not limit.isdigit() or held not in ([], ["rlimit"]):
            continue
        if held:
            rlimits.append((kind, int(limit)))
        else:
            words.append(hit_words(kind, int(limit)))
    return "; ".join(words), tuple(rlimits)


# What a process says when an rlimit refused it: no memory for an allocation (Python's
# MemoryError, C++'s std::bad_alloc, ENOMEM), or no process or thread (fork's or clone's EAGAIN).
_OUT_OF_MEMORY = re.compile(r"\bMemoryError\b|std::bad_alloc|Cannot allocate memory|out of memory", re.I)
_NO_PROCESS = re.compile(r"Resource temporarily unavailable|can't start new thread|Cannot fork|fork: retry", re.I)


def says_out_of_memory(text):
    """Whether a failure's words say the job ran out of memory: a limit it hit, a pod the kernel
    OOMKilled, a rank's MemoryError or CUDA out-of-memory error."""
    return bool(_OUT_OF_MEMORY.search(text)) or "memory limit" in text or "OOMKilled" in text


def printed_hit(texts, rlimits):
    """The words for a limit held by an rlimit (`rlimits`: Exited.rlimits) that the job's own
    lines `texts` show it ran into; "" if none."""
    held = dict(rlimits)
    for text in texts:
        if MEMORY in held and _OUT_OF_MEMORY.search(text):
            return hit_words(MEMORY, held[MEMORY])
        if PROCESSES in held and _NO_PROCESS.search(text):
            return hit_words(PROCESSES, held[PROCESSES])
    return ""


def pod_memory(spec, gib):
    """The memory a pod of the job requests and is limited to: the cluster's `gib` for it, or
    the job's limit where that is less (a pod has no limit of processes)."""
    if spec.memory_mib and spec.memory_mib < gib * 1024:
        return f"{spec.memory_mib}Mi"
    return f"{gib}Gi"


def held(spec):
    """Exited.rlimits of a job whose every limit an rlimit held (prlimit_argv)."""
    return tuple((kind, limit) for kind, limit in ((PROCESSES, spec.max_processes), (MEMORY, spec.memory_mib))
                 if limit)


def prlimit_argv(spec):
    """`prlimit` options for a rank on an instance that runs as a uid of its own ([] for none)."""
    options = []
    if spec.max_processes:
        options.append(f"--nproc={spec.max_processes}")
    if spec.memory_mib:
        options.append(f"--data={spec.memory_mib << 20}")
    return options
