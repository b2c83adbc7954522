"""The local runner with real horovodrun: argv stays argv, and the portal's secrets stay out."""
import json
import os
import signal
import subprocess
import sys
import time

from runners.base import JobSpec, Output, waited
from runners.local import LauncherWatch, LocalRunner
from tests.conftest import run_to_end, wait_for

SCRIPT = """
import json, os, sys
print("ARGV " + json.dumps(sys.argv[1:]))
print("ENV " + json.dumps({k: os.environ.get(k) for k in ("LR", "DATABASE_URL", "SECRET_KEY", "RINGMASTER_JOB_ID")}))
"""


def test_user_words_reach_the_script_literally_and_secrets_do_not(tmp_path, monkeypatch):
    monkeypatch.setenv("DATABASE_URL", "postgres://secret@db/prod")
    monkeypatch.setenv("SECRET_KEY", "do-not-leak")
    words = ["$(touch pwned)", "; touch pwned2", "`id`", "a b", "'q'", '"dq"', "--x=$HOME", "*"]
    spec = JobSpec(job_id=424242, gpus=2, python=sys.executable, script_name="show.py", script_content=SCRIPT,
                   script_path=None, args=tuple(words), env={"LR": "0.5"})
    runner = LocalRunner(tmp_path)

    lines, exited = run_to_end(runner, spec)

    assert exited.code == 0
    for rank in (0, 1):
        mine = {l.text.split(" ", 1)[0]: json.loads(l.text.split(" ", 1)[1]) for l in lines
                if l.rank == rank and l.text.startswith(("ARGV ", "ENV "))}
        assert mine["ARGV"] == words
        assert mine["ENV"] == {"LR": "0.5", "DATABASE_URL": None, "SECRET_KEY": None, "RINGMASTER_JOB_ID": "424242"}
    job_dir = runner.job_dir(spec)
    assert not (job_dir / "pwned").exists() and not (job_dir / "pwned2").exists()
    assert not list(tmp_path.rglob("pwned*"))


def test_launch_is_idempotent(tmp_path):
    spec = JobSpec(job_id=424243, gpus=1, python=sys.executable, script_name="s.py",
                   script_content="print('once')\n", script_path=None)
    runner = LocalRunner(tmp_path)
    first = runner.launch(spec)
    second = runner.launch(spec)
    assert not first.already_running and second.already_running
    lines, exited = run_to_end(runner, spec)
    assert exited.code == 0
    assert [l.text for l in lines if l.rank == 0] == ["once"]


def test_follow_resumes_from_an_offset_without_repeating(tmp_path):
    spec = JobSpec(job_id=424244, gpus=1, python=sys.executable, script_name="s.py",
                   script_content="for i in range(50): print(i)\n", script_path=None)
    runner = LocalRunner(tmp_path)
    lines, _ = run_to_end(runner, spec)
    whole = (runner.control_dir(spec) / "output.log").read_bytes()
    cut = whole.index(b"[0]<stdout>:25\n")
    resumed = b"".join(e.data for e in waited(runner.follow(spec, cut)) if isinstance(e, Output))
    assert whole[:cut] + resumed == whole


def test_cancel_stops_only_its_own_portals_job_of_that_number(tmp_path):
    """Two portals on one machine (or a portal and its tests) both have a job 424245."""
    spec = JobSpec(job_id=424245, gpus=2, python=sys.executable, script_name="s.py",
                   script_content="import time\nprint('up', flush=True)\ntime.sleep(600)\n", script_path=None)
    mine, theirs = LocalRunner(tmp_path / "mine", kill_grace=5), LocalRunner(tmp_path / "theirs", kill_grace=5)
    try:
        for runner in (mine, theirs):
            runner.launch(spec)
        for runner in (mine, theirs):                       # both jobs' ranks are up
            wait_for(lambda r=runner: (r.control_dir(spec) / "output.log").read_bytes().count(b"up") == 2,
                     timeout=120, message="both ranks to start")
        mine.cancel(spec)
        assert mine._processes(spec) == []
        assert len(theirs._processes(spec)) >= 3            # horovodrun + 2 ranks, untouched
    finally:
        mine.cancel(spec)
        theirs.cancel(spec)


def test_a_follower_sleeps_while_the_job_is_quiet_and_wakes_when_it_prints_or_ends(tmp_path):
    """inotify, not a timer: while the job is quiet the follow waits on a descriptor (5 s or
    longer, not a 20 ms poll), which stays quiet for a quiet second, yet a printed
    line and the end arrive well within a second."""
    from dataclasses import replace

    from runners.base import Exited, Waiting, wait_out

    spec = JobSpec(job_id=424250, gpus=1, python=sys.executable, script_name="s.py", script_path=None,
                   script_content="import os, time\nprint('up', flush=True)\n"
                                  "while not os.path.exists('go'): time.sleep(0.02)\nprint('went', flush=True)\n")
    runner = LocalRunner(tmp_path, idle_wake=5)
    runner.launch(spec)
    try:
        events = runner.follow(spec, 0)
        seen = b""
        for event in waited(events):                   # horovodrun and the rank are up
            seen += event.data if isinstance(event, Output) else b""
            if b"up" in seen:
                break
        waiting = next(events)
        assert isinstance(waiting, Waiting) and waiting.fd is not None and waiting.seconds >= 5, waiting
        quiet = time.monotonic()
        wait_out(replace(waiting, seconds=1.0))
        assert time.monotonic() - quiet >= 0.95, "the follow was woken while the job printed nothing"
        (runner.job_dir(spec) / "go").touch()
        touched = time.monotonic()
        wait_out(waiting)
        for event in waited(events):
            seen += event.data if isinstance(event, Output) else b""
            if b"went" in seen:
                break
        assert time.monotonic() - touched < 1.0
        for event in waited(events):
            if isinstance(event, Exited):
                break
        assert event.code == 0 and time.monotonic() - touched < 2.0
    finally:
        runner.cancel(spec)                        # a failed check leaves no rank waiting for 'go'


def test_a_launcher_is_known_by_its_start_in_ticks_since_boot_so_a_reused_pid_is_not_it(tmp_path):
    """The pid file names the launcher by its pid and the kernel's start time in clock ticks since
    boot (proc(5), /proc/PID/stat field 22), which no step of the wall clock moves; the same pid
    with another start is another process, and the launcher counts as gone."""
    spec = JobSpec(job_id=424252, gpus=1, python=sys.executable, script_name="s.py", script_path=None,
                   script_content="import time\ntime.sleep(600)\n")
    runner = LocalRunner(tmp_path)
    runner.launch(spec)
    control = runner.control_dir(spec)
    try:
        pid, started = (control / "pid").read_text().split()
        kernel = subprocess.run(["awk", "{print $22}", f"/proc/{pid}/stat"], capture_output=True, text=True).stdout
        assert started == kernel.strip()
        with LauncherWatch(control) as watch:
            assert watch.alive()
        (control / "pid").write_text(f"{pid} {int(started) + 1}\n")
        with LauncherWatch(control) as watch:
            assert not watch.alive()
    finally:
        runner.cancel(spec)


def test_a_launcher_killed_without_an_exit_code_wakes_its_quiet_follower_at_once(tmp_path):
    """The launcher killed (SIGKILL: no exit code written) while its job prints nothing: its end
    wakes the follow's wait (a pidfd), which asked for no look of its own for half a minute, and
    the follow ends at once saying that horovodrun reported no exit code."""
    from runners.base import Exited, Waiting, wait_out

    spec = JobSpec(job_id=424251, gpus=1, python=sys.executable, script_name="s.py", script_path=None,
                   script_content="import time\nprint('up', flush=True)\ntime.sleep(600)\n")
    runner = LocalRunner(tmp_path, idle_wake=30)
    runner.launch(spec)
    try:
        events = runner.follow(spec, 0)
        seen = b""
        for event in waited(events):
            seen += event.data if isinstance(event, Output) else b""
            if b"up" in seen:
                break
        waiting = next(events)
        assert isinstance(waiting, Waiting) and waiting.seconds >= 30, waiting
        os.kill(int((runner.control_dir(spec) / "pid").read_text().split()[0]), signal.SIGKILL)
        killed = time.monotonic()
        wait_out(waiting)
        assert time.monotonic() - killed < 1.0, "the launcher's end did not wake the follow"
        ended = next(event for event in waited(events) if isinstance(event, Exited))
        assert ended.code is None and "without reporting an exit code" in ended.detail, ended
    finally:
        runner.cancel(spec)                        # its rank, left behind by the killed launcher


def test_a_process_caught_in_the_middle_of_exec_is_looked_at_again():
    """A process seen while it execs shows an empty environment, its new one in place a moment
    later (the parent's Popen returns once the exec has begun): it must not be taken for none of
    the job's for good, or its CPU and memory would be left out of the job's telemetry. A
    process started with no environment at all stands for that moment here."""
    import subprocess

    from runners.local import MarkedProcesses

    process = subprocess.Popen(["sleep", "120"], env={})
    try:
        look = MarkedProcesses("/nonexistent/rm-x-7")
        assert process.pid not in [p.pid for p in look()]
        assert process.pid not in look.seen         # not settled: its environment is read again
    finally:
        process.kill()
        process.wait()


def test_a_jobs_processes_are_found_as_they_come_and_go_and_never_another_jobs(tmp_path):
    """What a job's CPU and memory telemetry sums, looked for again and again: the processes
    marked with its folder, those started since the last look among them, those ended left out,
    and never a process of another job (a folder that starts the same) or of none."""
    import subprocess

    from runners.base import JOB_DIR_VAR
    from runners.local import MarkedProcesses

    marker = str(tmp_path / "rm-x-7")
    started = []

    def start(mark):
        env = {k: v for k, v in os.environ.items() if k != JOB_DIR_VAR}
        env.update({JOB_DIR_VAR: mark} if mark else {})
        started.append(subprocess.Popen(["sleep", "120"], env=env))
        return started[-1].pid

    first, _, _ = start(marker), start(marker + "0"), start(None)
    look = MarkedProcesses(marker)
    try:
        assert [p.pid for p in look()] == [first]
        second = start(marker)
        assert sorted(p.pid for p in look()) == sorted([first, second])
        started[0].kill()
        started[0].wait()
        assert [p.pid for p in look()] == [second]
    finally:
        for process in started:
            process.kill()
            process.wait()
