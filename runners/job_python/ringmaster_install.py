"""Installs a project's extra packages on top of the job's image, as the job.

Run by the image's interpreter, as `python -I ringmaster_install.py ENV REQUIREMENTS [INDEX_URL]`
(runners.supervisor's install step on this machine, inside a sandbox whose only writable folder
is ENV and whose network is the site's RINGMASTER_INSTALL_NETWORK), with the fixed environment
of the portal's own processes: none of the job user's variables reaches pip.

ENV becomes a virtual environment of this interpreter in which the image's own packages stay
importable: its system site-packages where the image is a system Python, and, where the image
is itself a virtual environment (whose packages a venv made from it would not see), a .pth file
naming the image's site-packages. pip then installs REQUIREMENTS (checked by runners.packages)
into ENV from INDEX_URL (or pip's own configuration), skipping what the image already has.
The ranks run ENV/bin/python.

Standard library only; it prints what it does and pip's output; its exit code is pip's.
"""
import glob
import importlib.util
import os
import site
import subprocess
import sys
import venv

PTH_FILE = "_ringmaster_image.pth"


def make_environment(env):
    """ENV as a virtual environment of this interpreter with the image's packages beneath it;
    its python."""
    has_pip = importlib.util.find_spec("pip") is not None
    venv.EnvBuilder(system_site_packages=True, with_pip=not has_pip, symlinks=True).create(env)
    image_sites = [path for path in site.getsitepackages() if os.path.isdir(path)]
    for sites in glob.glob(os.path.join(env, "lib", "python*", "site-packages")):
        with open(os.path.join(sites, PTH_FILE), "w") as out:
            out.write("".join(path + "\n" for path in image_sites))
    return os.path.join(env, "bin", "python")


def main(argv):
    if len(argv) not in (2, 3):
        print("usage: ringmaster_install.py ENV REQUIREMENTS [INDEX_URL]", file=sys.stderr)
        return 2
    env, requirements = argv[0], argv[1]
    os.umask(0o022)
    os.chdir("/tmp")
    print(f"ringmaster: making the environment {env}", flush=True)
    python = make_environment(env)
    environ = {name: value for name, value in os.environ.items()
               if not name.startswith(("PIP_", "PYTHON"))}
    environ.update(HOME="/tmp", PATH=os.pathsep.join([os.path.dirname(python), environ.get("PATH", "/usr/bin:/bin")]),
                   PIP_NO_INPUT="1", PIP_DISABLE_PIP_VERSION_CHECK="1")
    if len(argv) == 3 and argv[2]:
        environ["PIP_INDEX_URL"] = argv[2]
    print(f"ringmaster: pip install -r {os.path.basename(requirements)}", flush=True)
    return subprocess.run([python, "-I", "-m", "pip", "install", "--no-cache-dir", "--progress-bar", "off",
                           "--no-warn-script-location", "-r", requirements], env=environ).returncode


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
