"""What nvidia-smi says about a host's GPUs: the queries Ringmaster runs, and their parsers.

Two queries, both in nvidia-smi's documented CSV form (`--format=csv,noheader,nounits`: one
line per GPU, fields in the order asked, separated by ", ", numbers without units, "[N/A]" or
"[Not Supported]" where a GPU cannot tell):

- the inventory, read by health checks: index, uuid, name, memory.total (MiB);
- a sample, read while a job runs, for the job's GPUs only (`-i 0,1`): index, utilization.gpu
  (%), memory.used and memory.total (MiB), power.draw (W).

Output that does not parse is an error that quotes it: a host whose nvidia-smi prints garbage
is not trusted with jobs. This module never imports Django; the local and SSH runners run the
commands, each in its own way.
"""
import subprocess
from dataclasses import dataclass

INVENTORY_FIELDS = ("index", "uuid", "name", "memory.total")
SAMPLE_FIELDS = ("index", "utilization.gpu", "memory.used", "memory.total", "power.draw")
FORMAT = "--format=csv,noheader,nounits"
MISSING = {"[N/A]", "[Not Supported]", "N/A", "[Unknown Error]", ""}


class GpuQueryError(Exception):
    """nvidia-smi failed, hung or printed something that is not its CSV."""


@dataclass(frozen=True)
class Gpu:
    index: int
    uuid: str
    name: str
    memory_mib: float | None

    def as_dict(self):
        return {"index": self.index, "uuid": self.uuid, "name": self.name, "memory_mib": self.memory_mib}


@dataclass(frozen=True)
class GpuSample:
    index: int
    utilization: float | None     # %
    memory_used: float | None     # MiB
    memory_total: float | None    # MiB
    power: float | None           # W


def inventory_argv(nvidia_smi="nvidia-smi"):
    return [nvidia_smi, "--query-gpu=" + ",".join(INVENTORY_FIELDS), FORMAT]


def sample_argv(indices, nvidia_smi="nvidia-smi"):
    argv = [nvidia_smi, "--query-gpu=" + ",".join(SAMPLE_FIELDS), FORMAT]
    if indices:
        argv += ["-i", ",".join(str(int(i)) for i in indices)]
    return argv


def _quote(text, limit=300):
    text = " ".join(text.split())
    return repr(text[:limit] + ("..." if len(text) > limit else ""))


def _rows(text, fields):
    rows = []
    for line in text.splitlines():
        if not line.strip():
            continue
        cells = [cell.strip() for cell in line.split(",")]
        if len(cells) != len(fields):
            # A GPU name never holds ", " in practice; anything else is not this query's answer.
            raise GpuQueryError(f"nvidia-smi printed something other than {len(fields)} CSV fields "
                                f"({', '.join(fields)}): {_quote(line)}")
        rows.append(cells)
    return rows


def _number(cell, field, line):
    if cell in MISSING:
        return None
    try:
        return float(cell)
    except ValueError:
        raise GpuQueryError(f"nvidia-smi gave {field} as {_quote(cell)}, not a number: {_quote(line)}") from None


def _index(cell, line):
    if not cell.isdigit():
        raise GpuQueryError(f"nvidia-smi gave a GPU index {_quote(cell)}: {_quote(line)}")
    return int(cell)


def parse_inventory(text):
    """[Gpu] from the inventory query's output, by index."""
    gpus = []
    for cells in _rows(text, INVENTORY_FIELDS):
        line = ", ".join(cells)
        gpus.append(Gpu(_index(cells[0], line), cells[1], cells[2], _number(cells[3], "memory.total", line)))
    if len({gpu.index for gpu in gpus}) != len(gpus):
        raise GpuQueryError(f"nvidia-smi listed a GPU index twice: {_quote(text)}")
    return sorted(gpus, key=lambda gpu: gpu.index)


def parse_samples(text):
    """[GpuSample] from the sample query's output."""
    samples = []
    for cells in _rows(text, SAMPLE_FIELDS):
        line = ", ".join(cells)
        samples.append(GpuSample(_index(cells[0], line), *(
            _number(cell, field, line) for cell, field in zip(cells[1:], SAMPLE_FIELDS[1:]))))
    return samples


def run_local(argv, timeout=10.0):
    """Run an nvidia-smi query on this machine: its stdout, None if there is no nvidia-smi, or
    GpuQueryError with what it said when it fails or hangs."""
    try:
        done = subprocess.run(argv, stdin=subprocess.DEVNULL, capture_output=True, timeout=timeout, text=True,
                              errors="replace")
    except FileNotFoundError:
        return None
    except subprocess.TimeoutExpired:
        raise GpuQueryError(f"nvidia-smi did not answer within {timeout:.0f} s") from None
    except OSError as exc:
        raise GpuQueryError(f"nvidia-smi cannot run: {exc}") from None
    if done.returncode != 0:
        said = (done.stderr.strip() or done.stdout.strip() or "nothing")
        raise GpuQueryError(f"nvidia-smi failed (exit code {done.returncode}): {_quote(said)}")
    return done.stdout


def local_inventory(nvidia_smi="nvidia-smi"):
    """([Gpu] this machine's nvidia-smi lists ([] where it is absent), "" or why it failed)."""
    try:
        out = run_local(inventory_argv(nvidia_smi))
        return (parse_inventory(out) if out is not None else []), ""
    except GpuQueryError as exc:
        return [], str(exc)


def matches(name, model):
    """Whether a GPU called `name` (e.g. "NVIDIA A100-SXM4-80GB") is of `model` ("a100")."""
    return model.strip().lower() in name.lower()


def gpu_map_value(indices_by_host):
    """What the bind launcher reads: {HOROVOD_HOSTNAME: [indices]} as "host=0,1;host2=2,3"."""
    return ";".join(f"{host}={','.join(str(i) for i in indices)}" for host, indices in indices_by_host.items())
