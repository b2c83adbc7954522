"""A project's extra packages: its requirements read as untrusted, refused at submit with the
line that is wrong, and installed on this machine into an environment that the next job with
the same image and requirements uses as it is."""
import base64
import hashlib
import http.server
import io
import os
import shutil
import sys
import threading
import zipfile
from pathlib import Path

import pytest

from runners import packages, projects
from runners.base import JobSpec
from runners.local import LocalRunner
from runners.sandbox import find
from tests.conftest import run_to_end
from tests.test_projects import upload, zip_of

# --- reading requirements --------------------------------------------------------------------


def test_requirements_txt_keeps_requirements_and_counts_packages():
    reqs = packages.requirements({"requirements.txt": b"# tools\nnumpy>=1.0  # arrays\n\nrequests[socks]==2.* ; "
                                                      b"python_version >= '3.8'\n--prefer-binary\n"
                                                      b"tqdm \\\n  ==4.66.1 --hash=sha256:abc\n"})
    assert reqs.lines == ("numpy>=1.0", "requests[socks]==2.* ; python_version >= '3.8'", "--prefer-binary",
                          "tqdm   ==4.66.1 --hash=sha256:abc")
    assert reqs.packages == 3 and reqs.describe() == "3 packages (requirements.txt)"


def test_pyproject_dependencies_count_where_there_is_no_requirements_txt():
    pyproject = b'[project]\nname = "x"\ndependencies = ["attrs>=22", "six"]\n'
    assert packages.requirements({"pyproject.toml": pyproject}).lines == ("attrs>=22", "six")
    assert packages.requirements({"pyproject.toml": b'[project]\nname = "x"\n'}) is None
    assert packages.requirements({"requirements.txt": b"# nothing\n\n", "pyproject.toml": pyproject}) is None
    assert packages.requirements({"train.py": b""}) is None


@pytest.mark.parametrize("line, says", [
    ("--index-url https://evil.example/simple", "the option --index-url is refused"),
    ("-i https://evil.example/simple", "the option -i is refused"),
    ("--extra-index-url=https://evil.example/simple", "the option --extra-index-url is refused"),
    ("-e git+https://example.com/x.git#egg=x", "the option -e is refused"),
    ("-r other.txt", "the option -r is refused"),
    ("--find-links /tmp", "the option --find-links is refused"),
    ("./vendor/pkg", "not a requirement"),
    ("https://example.com/x-1.0-py3-none-any.whl", "not a requirement"),
    ("x @ https://example.com/x-1.0-py3-none-any.whl", "a direct reference"),
    ("numpy --config-settings=x=y", "the option --config-settings is refused"),
    ("numpy==${VERSION}", "${...} are refused"),
])
def test_a_line_that_changes_where_code_comes_from_is_refused_naming_it(line, says):
    with pytest.raises(packages.BadRequirements) as refused:
        packages.requirements({"requirements.txt": f"six\n{line}\n".encode()})
    assert "requirements.txt, line 2" in str(refused.value) and says in str(refused.value)


# --- at submit ---------------------------------------------------------------------------------

@pytest.fixture
def client(api_client, alice):
    return api_client(alice)


PROJECT = {"train.py": "import tinypkg\n"}


@pytest.mark.django_db
def test_a_refused_requirement_or_an_image_without_extra_packages_is_400_on_project(client, image):
    from jobs.models import Job

    bad = upload(client, zip_of(dict(PROJECT, **{"requirements.txt": "six\n--index-url http://x/simple\n"}))).json()
    response = client.post("/api/jobs/", {"image": "horovod-cpu", "gpus": 1, "project": bad["id"],
                                          "entry_point": "train.py"}, format="json")
    assert response.status_code == 400
    assert "requirements.txt, line 2" in response.json()["project"][0], response.json()
    good = upload(client, zip_of(dict(PROJECT, **{"requirements.txt": "six\n"}))).json()
    image.extra_packages = False
    image.save()
    response = client.post("/api/jobs/", {"image": "horovod-cpu", "gpus": 1, "project": good["id"],
                                          "entry_point": "train.py"}, format="json")
    assert response.status_code == 400 and "takes no extra packages" in response.json()["project"][0]
    assert Job.objects.count() == 0


# --- installed on this machine -----------------------------------------------------------------

def wheel(name, version, module, source):
    """A pure-Python wheel, written by hand: the module and its dist-info."""
    dist = f"{name}-{version}.dist-info"
    files = {f"{module}/__init__.py": source.encode(),
             f"{dist}/METADATA": f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n".encode(),
             f"{dist}/WHEEL": b"Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n"}
    record = "".join(f"{path},sha256={base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b'=').decode()},"
                     f"{len(data)}\n" for path, data in files.items()) + f"{dist}/RECORD,,\n"
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as archive:
        for path, data in [*files.items(), (f"{dist}/RECORD", record.encode())]:
            archive.writestr(path, data)
    return f"{name}-{version}-py3-none-any.whl", buffer.getvalue()


@pytest.fixture
def simple_index(tmp_path):
    """A PEP 503 index on loopback holding one wheel, tinypkg 1.0; its URL."""
    root = tmp_path / "index"
    name, data = wheel("tinypkg", "1.0", "tinypkg", "VALUE = 42\n")
    (root / "files").mkdir(parents=True)
    (root / "files" / name).write_bytes(data)
    (root / "simple" / "tinypkg").mkdir(parents=True)
    (root / "simple" / "index.html").write_text('<a href="tinypkg/">tinypkg</a>')
    digest = hashlib.sha256(data).hexdigest()
    (root / "simple" / "tinypkg" / "index.html").write_text(f'<a href="../../files/{name}#sha256={digest}">{name}</a>')

    class Quiet(http.server.SimpleHTTPRequestHandler):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, directory=str(root), **kwargs)

        def log_message(self, *args):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Quiet)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}/simple/"
    server.shutdown()
    server.server_close()


# The image: this virtual environment, by its own path (not through a link to it).
PYTHON = str(Path(sys.prefix).resolve() / "bin" / "python")


def project_spec(job_id, requirements):
    files = [projects.File("train.py", b"import os, sys, tinypkg, horovod\n"
                                      b"print('TINY', tinypkg.VALUE, tinypkg.__file__.startswith(sys.prefix))\n"
                                      b"print('ENV WRITABLE', os.access(tinypkg.__file__, os.W_OK))\n"),
             projects.File("requirements.txt", requirements.encode())]
    return JobSpec(job_id=job_id, gpus=1, python=PYTHON, script_name="train.py", script_content=None,
                   script_path=None, project=projects.pack(files))


@pytest.mark.integration
@pytest.mark.skipif(shutil.which("bwrap") is None, reason="needs bubblewrap (apt-get install bubblewrap)")
def test_a_projects_requirements_are_installed_once_and_the_next_job_reuses_them(tmp_path, simple_index):
    jobs, envs = tmp_path / "jobs", tmp_path / "envs"
    runner = LocalRunner(jobs, sandbox=find("bwrap", (str(jobs), str(envs)), str(Path.home()), "none"),
                         envs_dir=envs, install_network="host", pip_index_url=simple_index)
    told = []
    lines, exited = run_to_end(runner, project_spec(7001, "tinypkg==1.0\n"), told)
    texts = [line.text for line in lines]
    assert exited.code == 0, texts[-20:]
    assert "TINY 42 True" in texts                       # from the job's environment, beside the image's horovod
    assert "ENV WRITABLE False" in texts                 # shared by other jobs: none may change it
    assert told == ["installing 1 package (requirements.txt) into a new environment",
                    "installed 1 package (requirements.txt); the environment is kept for the next job with "
                    "the same image and requirements"]
    assert any("Successfully installed tinypkg-1.0" in text for text in texts)
    env, = (path for path in envs.iterdir() if path.is_dir())
    assert env.stat().st_uid == os.geteuid() and not env.stat().st_mode & 0o222   # the portal's, read-only
    again = []
    lines, exited = run_to_end(runner, project_spec(7002, "tinypkg==1.0\n"), again)
    texts = [line.text for line in lines]
    assert exited.code == 0 and "TINY 42 True" in texts and "ENV WRITABLE False" in texts, texts[-20:]
    assert again == ["1 package (requirements.txt) installed from cache: the environment of an earlier job with "
                     "the same image and requirements"]
    assert not any("pip install" in text or "Successfully installed" in text for text in texts)
    # A package the index does not have: the job fails with pip's last lines, and starts nothing.
    failed = []
    lines, exited = run_to_end(runner, project_spec(7003, "tinypkg==1.0\nnosuchpkg==3\n"), failed)
    assert exited.code != 0 and exited.detail == "installing 2 packages (requirements.txt) failed"
    assert "No matching distribution found for nosuchpkg" in exited.cause, exited.cause
    assert not any(line.text.startswith("TINY") for line in lines)
    assert len([path for path in envs.iterdir() if path.is_dir()]) == 1     # the failed one is not kept
