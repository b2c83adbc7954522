"""The first process of a job on this machine that runs as the job: it takes on the job's
environment and starts the job's launcher.

Run by runners.local, inside the sandbox and after the switch to the job's user where it has
one, as `python -I -S ringmaster_start.py ENV_FILE JOB_DIR -- ARGV`, with the fixed environment
of the portal's own processes. ENV_FILE (a JSON object, in the job's folder, owned by the job's
user) holds the job's environment: the variables the user set and the ones Ringmaster sets. So
no variable of the user's (PATH, PYTHON*, ...) reaches a process that is not the job's: not the
supervisor, bubblewrap or setpriv, which run as root, nor this interpreter. The file is removed
once read; ARGV is then found on the job's PATH and executed with exactly that environment.

Standard library only (it runs with -S, before any site-packages), and it prints nothing but
why it could not start the job.
"""
import json
import os
import sys


def main(argv):
    if len(argv) < 4 or argv[2] != "--":
        print("usage: ringmaster_start.py ENV_FILE JOB_DIR -- ARGV", file=sys.stderr)
        return 2
    env_file, job_dir, command = argv[0], argv[1], argv[3:]
    with open(env_file, encoding="utf-8") as handle:
        env = json.load(handle)
    os.unlink(env_file)
    os.chdir(job_dir)
    try:
        os.execvpe(command[0], command, env)
    except OSError as exc:
        print(f"ringmaster: could not start {command[0]}: {exc.strerror}", file=sys.stderr, flush=True)
        return 127


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
