"""The rank launcher (runners/job_python/ringmaster_rank.py) runs a rank's script with its words
as given; an elastic job's ranks (HOROVOD_ELASTIC=1, as horovodrun sets it) run it with Horovod's
skip-the-sync-after-a-removal shortcut turned off (Horovod issue #3494: survivors skip the sync
while a growth's new ranks sync, and the job hangs). A rank of a job of one size
(RINGMASTER_WORLD_SIZE) stops with a plain reason where its script's world is not the job's."""
import json
import os
import subprocess
import sys

import pytest

from runners.local import JOB_PYTHON

SCRIPT = """
import json, os, sys
from horovod.common.exceptions import HostsUpdatedInterrupt
print(json.dumps({"argv": sys.argv, "name": __name__, "path0": sys.path[0],
                  "skip_sync": HostsUpdatedInterrupt(True).skip_sync}))
sys.exit(int(os.environ.get("EXIT_WITH", "0")))
"""


def rank(tmp_path, words, script=SCRIPT, **env):
    (tmp_path / "train.py").write_text(script)
    (tmp_path / "argv.json").write_text(json.dumps(["train.py", *words]))
    result = subprocess.run([sys.executable, "-m", "ringmaster_rank"], cwd=tmp_path, capture_output=True, text=True,
                            env={"PATH": "/usr/bin:/bin", "PYTHONPATH": str(JOB_PYTHON), **env}, timeout=60)
    return result.returncode, json.loads(result.stdout) if result.stdout else result.stderr


@pytest.mark.parametrize("env", [{}, {"HOROVOD_ELASTIC": "1"}, {"RINGMASTER_WORLD_SIZE": "2"}],
                         ids=["exec", "elastic", "world-size-checked"])
def test_the_script_gets_its_words_as_given_and_its_exit_code_is_the_ranks(tmp_path, env):
    code, seen = rank(tmp_path, ["--network", "a b", "-m"], EXIT_WITH="3", **env)
    assert code == 3, seen
    assert seen["argv"] == ["train.py", "--network", "a b", "-m"] and seen["name"] == "__main__"
    assert os.path.realpath(seen["path0"]) == os.path.realpath(tmp_path)     # as `python train.py` has it


def test_an_elastic_ranks_script_syncs_its_state_after_every_reset(tmp_path):
    assert rank(tmp_path, [], HOROVOD_ELASTIC="1")[1]["skip_sync"] is False
    assert rank(tmp_path, [])[1]["skip_sync"] is True               # a fixed job's Horovod is left as it is


def test_a_torchrun_script_under_horovodrun_stops_with_the_plain_reason(tmp_path):
    script = "import torch.distributed as dist\ndist.init_process_group('gloo')\nprint('trained alone')\n"
    code, stderr = rank(tmp_path, [], script, HOROVOD_RANK="0", HOROVOD_SIZE="2", RINGMASTER_WORLD_SIZE="2")
    assert code == 1 and "trained alone" not in stderr
    assert stderr.splitlines()[-1] == (
        "WorldSizeMismatch: this job has 2 ranks but torch.distributed.init_process_group() found no RANK or "
        "WORLD_SIZE, which torchrun sets and horovodrun does not: a torchrun script under horovodrun? Pick the "
        "torchrun launcher.")


@pytest.mark.parametrize(("slot", "local_world", "visible"), [
    ("", "", "4,5,6"),            # one group per host: every GPU the job owns there
    ("0", "1", "4"),              # an elastic torchrun job's agents: one GPU each, by position
    ("2", "1", "6"),
    ("1", "2", "5,6"),
])
def test_the_rank_sees_the_gpus_of_its_group_on_its_host(slot, local_world, visible):
    sys.path.insert(0, str(JOB_PYTHON))
    try:
        import ringmaster_rank
    finally:
        sys.path.pop(0)
    environ = {"RINGMASTER_GPU_MAP": "a=0,1;b=4,5,6", "RINGMASTER_HOSTNAME": "b"}
    if slot:
        environ.update(RINGMASTER_SLOT=slot, LOCAL_WORLD_SIZE=local_world)
    ringmaster_rank.bind_gpus(environ)
    assert environ["CUDA_VISIBLE_DEVICES"] == visible
