"""A job's own variables on an instance (runners.ssh): none is on the command line that starts its
launcher as the SSH account (or root), nor in what that launcher passes on (torchrun_agents' plan);
they reach the job's own processes alone, through ENV_FILE, which the job's shell reads after the
switch to the job's uid. The whole attack over real sshd: tests/integration/test_instances.py::
test_user_words_reach_the_script_literally_over_ssh_secrets_do_not_and_setup_runs."""
import json
import shutil
import subprocess
import sys

import pytest

from runners import ssh
from runners.base import JobSpec

PLANTED = "/var/tmp/planted"
VARIABLES = {"PATH": f"{PLANTED}/bin:/usr/bin:/bin", "LD_PRELOAD": f"{PLANTED}/hook.so", "PYTHONPATH": PLANTED,
             "BASH_ENV": f"{PLANTED}/rc", "ENV": f"{PLANTED}/rc", "LR": "0.5"}
# Values that a shell or an option parser would take for something else were they not one word.
AWKWARD = {"QUOTES": "it's \"quoted\"", "SUBST": "$(touch pwned) `touch pwned2` ${HOME}", "DASH": "-i --help",
           "LINES": "one\ntwo\n", "EQUALS": "a=b=c", "EMPTY": "", "SPACES": "  a  b  ", "UNICODE": "é ✓",
           "GLOB": "*", "SEMI": "; touch pwned3 #"}


def host(address):
    return ssh.Host(name=address, address=address, port=22, user="root", private_key="", slots=1,
                    work_dir="/srv/jobs", peer_ssh_port=2222, peer_ssh_key="/root/.ssh/peer")


@pytest.mark.parametrize("launcher", ["horovod", "torchrun"])
@pytest.mark.parametrize("elastic", [False, True])
def test_the_command_that_starts_a_job_on_an_instance_carries_none_of_its_variables(launcher, elastic):
    spec = JobSpec(job_id=7, gpus=2, python="/opt/venv/bin/python", script_name="train.py", script_content="",
                   script_path=None, env={**VARIABLES, **AWKWARD, "RINGMASTER_JOB_DIR": "/elsewhere"},
                   launcher=launcher, gpu_binding=((0,), (1,)), min_gpus=1 if elastic else None,
                   max_gpus=4 if elastic else None)
    runner = ssh.SSHRunner([host("10.0.0.1"), host("10.0.0.2")])
    argv, files = runner.command(spec)
    environment = runner.environment(spec)
    launch = ssh.sh(ssh.LAUNCH, "/srv/jobs/.portal/x", "", *(f"{k}={v}" for k, v in environment.items()), *argv)
    what_runs_as_the_account = [launch, json.dumps(environment), *(content.decode() for content in files.values())]
    for text in what_runs_as_the_account:
        assert PLANTED not in text and "pwned" not in text and "0.5" not in text, text
    assert not set(environment) & set(VARIABLES)
    if launcher == "torchrun":         # what its agents, as the account, pass on to other hosts
        assert not set(json.loads(files["agents.json"])["forward"]) & {*VARIABLES, *AWKWARD}
    assert runner.job_variables(spec) == {**VARIABLES, **AWKWARD}       # the portal's own are the portal's


def test_the_job_shell_gives_the_rank_each_variable_word_for_word_and_nothing_else_reads_them(tmp_path):
    """ENV_FILE as the rank wrapper's last step uses it (JOB_SHELL, in a real /bin/sh): the rank
    gets every value as it was given, and no value is run."""
    (tmp_path / ssh.ENV_FILE).write_bytes(ssh.job_env_file({**AWKWARD, "LR": "0.5"}))
    env = shutil.which("env", path=ssh.SYSTEM_PATH)
    show = "import json, os; print(json.dumps(dict(os.environ)))"
    done = subprocess.run(["/bin/sh", "-c", ssh.JOB_SHELL, "rank", str(tmp_path), env, sys.executable, "-c", show],
                          env={"PATH": "/usr/bin:/bin", "HOME": str(tmp_path)}, capture_output=True, text=True,
                          timeout=30)
    assert done.returncode == 0, done.stderr
    seen = json.loads(done.stdout)
    assert {name: seen.get(name) for name in AWKWARD} == AWKWARD
    assert (seen["LR"], seen["HOME"]) == ("0.5", str(tmp_path))
    assert not list(tmp_path.glob("pwned*"))


@pytest.mark.parametrize("name", ["A B", "A=B", "-i", "", "PATH\n"])
def test_a_name_that_is_not_a_variable_name_is_refused(name):
    with pytest.raises(ValueError):
        ssh.job_env_file({name: "x"})
