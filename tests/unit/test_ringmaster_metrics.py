"""ringmaster_metrics prints lines that runners.output turns into the right metric points, and a
job of the local runner can import it without installing anything."""
import json
import subprocess
import sys

import numpy as np
import pytest
import torch

import ringmaster_metrics
from runners import output
from runners.base import JobSpec
from runners.local import JOB_PYTHON, LocalRunner
from runners.output import Metric, OutputSplitter, extract_metrics
from tests.conftest import run_to_end


def logged(capsys, *args, **values):
    ringmaster_metrics.log(*args, **values)
    out = capsys.readouterr().out
    assert out.endswith("\n") and out.count("\n") == 1
    return out.rstrip("\n")


def test_the_marker_and_limits_are_the_parsers():
    assert ringmaster_metrics.MARKER == output.METRIC_PREFIX
    assert ringmaster_metrics.MAX_NAME_LENGTH == output.MAX_METRIC_NAME_LENGTH


def test_a_logged_line_becomes_one_point_per_value(capsys):
    line = logged(capsys, step=10, loss=0.31, img_per_sec=812, lr=1e-3)
    assert line == 'RINGMASTER_METRIC {"step": 10, "loss": 0.31, "img_per_sec": 812, "lr": 0.001}'
    assert extract_metrics(line) == [Metric("loss", 0.31, 10), Metric("img_per_sec", 812.0, 10),
                                     Metric("lr", 0.001, 10)]


def test_without_a_step_the_points_have_none(capsys):
    assert extract_metrics(logged(capsys, accuracy=0.5)) == [Metric("accuracy", 0.5, None)]


def test_numpy_and_torch_scalars_are_numbers(capsys):
    line = logged(capsys, step=np.int64(3), a=np.float32(1.5), b=np.int32(2), c=torch.tensor(0.25),
                  d=torch.tensor([4.0]), e=np.array([[5]]))
    assert extract_metrics(line) == [Metric("a", 1.5, 3), Metric("b", 2.0, 3), Metric("c", 0.25, 3),
                                     Metric("d", 4.0, 3), Metric("e", 5.0, 3)]
    assert extract_metrics(logged(capsys, step=torch.tensor(7), x=1)) == [Metric("x", 1.0, 7)]


def test_nan_and_infinity_are_written_as_null_and_left_off_the_chart(capsys):
    line = logged(capsys, step=1, loss=float("nan"), big=float("inf"), ok=2.0)
    assert json.loads(line.removeprefix(ringmaster_metrics.MARKER)) == {"step": 1, "loss": None, "big": None, "ok": 2.0}
    assert extract_metrics(line) == [Metric("ok", 2.0, 1)]


@pytest.mark.parametrize("kwargs, error", [
    ({"loss": "0.3"}, TypeError),
    ({"loss": None}, TypeError),
    ({"loss": True}, TypeError),
    ({"loss": [1.0]}, TypeError),
    ({"loss": 1 + 2j}, TypeError),
    ({"loss": np.array([1.0, 2.0])}, TypeError),
    ({"step": 1.5, "loss": 1}, TypeError),
    ({"step": "3", "loss": 1}, TypeError),
    ({"step": True, "loss": 1}, TypeError),
    ({"step": -1, "loss": 1}, ValueError),
    ({"step": 1}, ValueError),
    ({}, ValueError),
    ({"x" * 101: 1}, ValueError),
    ({"": 1}, ValueError),
])
def test_bad_values_raise_a_clear_error_and_print_nothing(kwargs, error, capsys):
    with pytest.raises(error) as info:
        ringmaster_metrics.log(**kwargs)
    assert str(info.value)
    assert capsys.readouterr().out == ""


def test_a_line_through_horovodrun_tags_and_the_splitter(capsys):
    line = logged(capsys, step=2, loss=0.5)
    lines = OutputSplitter().feed(output.tag(1, "stdout", line))
    assert [(l.rank, extract_metrics(l.text)) for l in lines] == [(1, [Metric("loss", 0.5, 2)])]


SCRIPT = """
import os, sys
import horovod.torch as hvd
import ringmaster_metrics
hvd.init()
ringmaster_metrics.log(step=hvd.rank(), rank_plus_one=hvd.rank() + 1)
print("PYTHONPATH " + os.environ["PYTHONPATH"])
"""


def test_a_local_job_imports_it_and_keeps_the_users_pythonpath(tmp_path):
    spec = JobSpec(job_id=424299, gpus=2, python=sys.executable, script_name="m.py", script_content=SCRIPT,
                   script_path=None, env={"PYTHONPATH": "/opt/mine"})
    lines, exited = run_to_end(LocalRunner(tmp_path), spec)
    assert exited.code == 0, [l.text for l in lines]
    points = {l.rank: extract_metrics(l.text) for l in lines if l.text.startswith(ringmaster_metrics.MARKER)}
    assert points == {0: [Metric("rank_plus_one", 1.0, 0)], 1: [Metric("rank_plus_one", 2.0, 1)]}
    paths = {l.text for l in lines if l.text.startswith("PYTHONPATH ")}
    assert paths == {f"PYTHONPATH {JOB_PYTHON}:/opt/mine"}
    assert sorted(p.name for p in JOB_PYTHON.iterdir() if p.suffix == ".py") == [
        "ringmaster_install.py", "ringmaster_metrics.py", "ringmaster_rank.py", "ringmaster_start.py"]


def test_it_is_installed_in_the_environment(tmp_path):
    """`make install` installs the project, so `import ringmaster_metrics` works from anywhere."""
    result = subprocess.run([sys.executable, "-c", "import ringmaster_metrics; ringmaster_metrics.log(step=0, x=1)"],
                            cwd=tmp_path, env={"PATH": "/usr/bin:/bin"}, capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    assert result.stdout == 'RINGMASTER_METRIC {"step": 0, "x": 1}\n'
