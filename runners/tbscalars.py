"""Scalars of the TensorBoard event files a job writes under its output folder (what
torch.utils.tensorboard's SummaryWriter writes), read with the tensorboard package's own event
reader, incrementally: a ScalarReader keeps each file's loader, and each read() returns only the
events written since the last.

Each file is opened through runners.artifacts (no link followed) and handed to the loader as
/proc/self/fd/N, so the loader reads the file that was checked, whatever the job renames.
"""
import os
from dataclasses import dataclass
from pathlib import PurePosixPath

from . import artifacts

EVENT_FILE_MARK = "tfevents"          # events.out.tfevents.<time>.<host>...


@dataclass(frozen=True)
class ScalarPoint:
    tag: str
    step: int
    value: float
    wall_time: float      # seconds since the epoch


def _scalar(value):
    """The number of a summary value of the scalars plugin (or an old simple_value), or None."""
    if value.HasField("simple_value"):
        return float(value.simple_value)
    if value.HasField("tensor") and value.metadata.plugin_data.plugin_name == "scalars":
        from tensorboard.util import tensor_util

        array = tensor_util.make_ndarray(value.tensor)
        return float(array.item()) if array.size == 1 else None
    return None


class ScalarReader:
    def __init__(self, root):
        self.root = root
        self._files = {}            # name -> (open file, EventFileLoader)

    def read(self):
        """[ScalarPoint] written to the folder's event files since the last read."""
        from tensorboard.backend.event_processing.event_file_loader import EventFileLoader

        points = []
        for artifact in artifacts.listing(self.root):
            if EVENT_FILE_MARK not in PurePosixPath(artifact.name).name:
                continue
            if artifact.name in self._files and self._replaced(artifact.name):
                self._files.pop(artifact.name)[0].close()     # brought back again: read the new file
            if artifact.name not in self._files:
                try:
                    handle = artifacts.open_artifact(self.root, artifact.name)
                except FileNotFoundError:
                    continue
                self._files[artifact.name] = (handle, EventFileLoader(f"/proc/self/fd/{handle.fileno()}"))
            _, loader = self._files[artifact.name]
            for event in loader.Load():
                if not event.HasField("summary"):
                    continue
                for value in event.summary.value:
                    number = _scalar(value)
                    if number is not None:
                        points.append(ScalarPoint(value.tag, int(event.step), number, float(event.wall_time)))
        return points

    def _replaced(self, name):
        handle = self._files[name][0]
        try:
            now = os.stat(os.path.join(self.root, *name.split("/")), follow_symlinks=False)
        except OSError:
            return True
        opened = os.fstat(handle.fileno())
        return (now.st_ino, now.st_dev) != (opened.st_ino, opened.st_dev)

    def close(self):
        for handle, _ in self._files.values():
            handle.close()
        self._files.clear()
