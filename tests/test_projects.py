"""Projects (issue #60): an archive becomes a snapshot, read as untrusted; a job runs it with
the working directory at its root, on this machine, on instances and on Kubernetes; its files are
read back through the API."""
import io
import json
import os
import shutil
import sys
import tarfile
import zipfile
from pathlib import Path

import pytest

from jobs.models import Job, Project
from runners import projects
from runners.base import JobSpec
from runners.local import LocalRunner
from runners.sandbox import find
from runners.ssh import Host, SSHRunner
from tests import sshd
from tests.conftest import run_to_end
from tests.integration.test_instances import sshds  # noqa: F401 (the sshd fixture)

DATAUTILS = "def batch(rank):\n    return [rank, rank + 1]\n"
TRAIN = """import json, os
import torch.distributed as dist
from datautils import batch

dist.init_process_group("gloo")
print("TRAIN " + json.dumps({"rank": dist.get_rank(), "world": dist.get_world_size(), "batch": batch(dist.get_rank()),
                            "config": open("conf/settings.txt").read().strip(), "cwd": os.getcwd()}), flush=True)
dist.destroy_process_group()
"""
PROJECT = {"train.py": TRAIN, "datautils.py": DATAUTILS, "conf/settings.txt": "lr=0.1\n"}


def zip_of(files, top=""):
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", compression=zipfile.ZIP_DEFLATED) as archive:
        for name, content in files.items():
            archive.writestr(top + name, content)
    return buffer.getvalue()


def tar_gz_of(members):
    """members: (TarInfo, bytes or None)."""
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz") as archive:
        for info, content in members:
            if content is not None:
                info.size = len(content)
            archive.addfile(info, io.BytesIO(content) if content is not None else None)
    return buffer.getvalue()


def plain(name, content):
    return tarfile.TarInfo(name), content


def typed(name, kind, link=""):
    info = tarfile.TarInfo(name)
    info.type, info.linkname = kind, link
    return info, None


LIMITS = projects.Limits(archive_bytes=1 << 20, expanded_bytes=1 << 20, files=100)


def test_the_same_tree_zipped_in_a_folder_or_tarred_at_its_root_is_one_snapshot():
    zipped = projects.read_archive(zip_of(PROJECT, top="my-project/"), LIMITS)
    tarred = projects.read_archive(tar_gz_of([plain(n, c.encode()) for n, c in PROJECT.items()]), LIMITS)
    assert [f.path for f in zipped] == ["conf/settings.txt", "datautils.py", "train.py"]
    assert projects.digest(zipped) == projects.digest(tarred)
    # Packed twice, the same bytes: nothing of the moment or the machine is in the archive.
    assert projects.pack(zipped) == projects.pack(tarred)
    assert projects.digest(projects.unpack(projects.pack(zipped))) == projects.digest(zipped)
    changed = dict(PROJECT, **{"datautils.py": DATAUTILS + "# changed\n"})
    assert projects.digest(projects.read_archive(zip_of(changed), LIMITS)) != projects.digest(zipped)


BOMB = zip_of({"zeros.bin": b"\0" * (2 << 20)})          # 2 MiB of zeros: a few KiB zipped


@pytest.mark.parametrize("archive, says", [
    (tar_gz_of([plain("/etc/cron.d/x", b"x")]), "absolute path"),
    (tar_gz_of([plain("../outside.py", b"x")]), "'..'"),
    (zip_of({"a/../../outside.py": "x"}), "'..'"),
    (tar_gz_of([typed("link", tarfile.SYMTYPE, "/etc/passwd")]), "a link or a device is refused"),
    (tar_gz_of([plain("a.py", b"x"), typed("b.py", tarfile.LNKTYPE, "a.py")]), "a link or a device is refused"),
    (tar_gz_of([typed("dev", tarfile.CHRTYPE)]), "a link or a device is refused"),
    (tar_gz_of([typed("fifo", tarfile.FIFOTYPE)]), "a link or a device is refused"),
    (tar_gz_of([plain("a.py", b"x"), plain("a.py", b"y")]), "twice"),
    (tar_gz_of([plain("a", b"x"), plain("a/b.py", b"y")]), "both a file and a folder"),
    (zip_of({f"f{i}.py": "x" for i in range(101)}), "more than 100 files"),
    (BOMB, "expands past 1,048,576 bytes"),
    (tar_gz_of([plain("zeros.bin", b"\0" * (2 << 20))]), "expands past 1,048,576 bytes"),
    (b"#!/bin/sh\necho not an archive\n", "Not a .zip or .tar.gz"),
    (b"PK\x03\x04broken", "cannot be read"),
], ids=lambda value: value if isinstance(value, str) else "")      # an archive's bytes differ by run (gzip's time)
def test_a_bad_archive_is_refused_saying_why(archive, says):
    with pytest.raises(projects.BadProject, match=None) as refused:
        projects.read_archive(archive, LIMITS)
    assert says in str(refused.value)


def test_a_symlink_in_a_zip_is_refused():
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as archive:
        info = zipfile.ZipInfo("evil")
        info.create_system, info.external_attr = 3, (0o120777 << 16)
        archive.writestr(info, "/etc/passwd")
    with pytest.raises(projects.BadProject, match="a link or a device is refused"):
        projects.read_archive(buffer.getvalue(), LIMITS)


# --- the API ------------------------------------------------------------------------------

@pytest.fixture
def client(api_client, alice):
    return api_client(alice)


def upload(client, data, name="project.zip"):
    handle = io.BytesIO(data)
    handle.name = name
    return client.post("/api/projects/", {"file": handle}, format="multipart")


@pytest.mark.django_db
def test_an_uploaded_project_is_kept_once_and_a_job_runs_it_and_shows_its_files(client, image, api_client, make_user):
    one, two = upload(client, zip_of(PROJECT, top="p/")), upload(client, tar_gz_of(
        [plain(n, c.encode()) for n, c in PROJECT.items()]), "p.tar.gz")
    assert one.status_code == two.status_code == 201, one.json()
    assert one.json() == two.json()
    assert set(one.json()) == {"id", "sha256", "files", "size"} and one.json()["files"] == 3
    assert Project.objects.count() == 1

    project = one.json()["id"]
    response = client.post("/api/jobs/", {"image": "horovod-cpu", "gpus": 2, "project": project,
                                          "entry_point": "./train.py"}, format="json")
    assert response.status_code == 201, response.json()
    job = response.json()
    assert job["project"] == {"id": project, "sha256": one.json()["sha256"], "entry_point": "train.py",
                              "url": None, "commit": None}          # an archive: no git repository
    assert job["script_name"] == "train.py"
    assert client.get(f"/api/jobs/{job['id']}/").json()["project"]["entry_point"] == "train.py"
    files = client.get(f"/api/jobs/{job['id']}/files/").json()
    assert files == [{"path": "conf/settings.txt", "size": 7}, {"path": "datautils.py", "size": len(DATAUTILS)},
                     {"path": "train.py", "size": len(TRAIN)}]
    assert client.get(f"/api/jobs/{job['id']}/files/datautils.py").content == DATAUTILS.encode()
    assert client.get(f"/api/jobs/{job['id']}/files/nothing.py").status_code == 404
    # Another user sees neither the job's files nor the project.
    bob = api_client(make_user("bob"))
    assert bob.get(f"/api/jobs/{job['id']}/files/").status_code == 404
    assert bob.get(f"/api/jobs/{job['id']}/files/train.py").status_code == 404
    refused = bob.post("/api/jobs/", {"image": "horovod-cpu", "gpus": 1, "project": project,
                                      "entry_point": "train.py"}, format="json")
    assert refused.status_code == 400 and "No project with id" in refused.json()["project"][0]


@pytest.mark.django_db
@pytest.mark.parametrize("change, field, says", [
    ({"entry_point": "missing.py"}, "entry_point", "The project has no file missing.py"),
    ({"entry_point": "conf/settings.txt"}, "entry_point", "must be a .py file"),
    ({"entry_point": "../train.py"}, "entry_point", "not a path inside the project"),
    ({"entry_point": ""}, "entry_point", "Name the project's .py file"),
    ({"script_path": "/x.py"}, "script", "Give only one of"),
    ({"project": 999999}, "project", "No project with id 999999"),
])
def test_a_bad_project_job_is_400_naming_the_field(client, image, change, field, says):
    project = upload(client, zip_of(PROJECT)).json()["id"]
    data = {"image": "horovod-cpu", "gpus": 1, "project": project, "entry_point": "train.py", **change}
    response = client.post("/api/jobs/", data, format="json")
    assert response.status_code == 400
    assert says in " ".join(response.json()[field]), response.json()
    assert Job.objects.count() == 0


@pytest.mark.django_db
def test_a_bad_archive_is_400_on_file_and_nothing_is_written(client, tmp_path, settings):
    before = sorted(str(p) for p in Path(settings.DATA_DIR).rglob("*")) if Path(settings.DATA_DIR).exists() else []
    response = upload(client, tar_gz_of([plain("../../escaped.py", b"print(1)")]), "bad.tar.gz")
    assert response.status_code == 400 and "'..'" in response.json()["file"][0]
    response = upload(client, tar_gz_of([typed("link", tarfile.SYMTYPE, "/etc/passwd")]), "bad.tar.gz")
    assert response.status_code == 400 and "link" in response.json()["file"][0]
    settings.RINGMASTER_PROJECT_MAX_ARCHIVE_MB = 0.001
    response = upload(client, zip_of({"big.py": os.urandom(4096).hex()}))
    assert response.status_code == 400 and "at most 1,048 are taken" in response.json()["file"][0]
    assert Project.objects.count() == 0
    assert not list(Path("/").glob("escaped.py")) and not (tmp_path.parent / "escaped.py").exists()
    after = sorted(str(p) for p in Path(settings.DATA_DIR).rglob("*")) if Path(settings.DATA_DIR).exists() else []
    assert after == before


# --- a job that runs one, on this machine ---------------------------------------------------

@pytest.mark.integration
@pytest.mark.skipif(shutil.which("bwrap") is None, reason="needs bubblewrap (apt-get install bubblewrap)")
def test_a_two_file_project_runs_as_a_two_rank_torchrun_job_in_its_folder(tmp_path):
    files = projects.read_archive(zip_of(PROJECT, top="proj/"), LIMITS)
    runner = LocalRunner(tmp_path / "jobs", sandbox=find("bwrap", (str(tmp_path / "jobs"),), str(Path.home())))
    spec = JobSpec(job_id=6000, gpus=2, python=sys.executable, script_name="train.py", script_content=None,
                   script_path=None, launcher="torchrun", project=projects.pack(files))
    lines, exited = run_to_end(runner, spec)
    assert exited.code == 0, [line.text for line in lines][-20:]
    root = str((runner.job_dir(spec) / projects.PROJECT_DIR).resolve())
    assert ranks_said(line.text for line in lines) == {
        rank: {"rank": rank, "world": 2, "batch": [rank, rank + 1], "config": "lr=0.1", "cwd": root} for rank in (0, 1)}


def ranks_said(texts):
    """{rank: what it printed after TRAIN} of PROJECT's ranks, from their lines' texts."""
    return {seen["rank"]: seen for seen in (json.loads(text.split("TRAIN ", 1)[1]) for text in texts
                                            if "TRAIN " in text)}


@pytest.mark.integration
@pytest.mark.skipif(not sshd.available() or os.geteuid() != 0,
                    reason="needs Debian's openssh-server, and root (a uid of the job's own on the instances)")
def test_a_two_file_project_runs_as_a_two_rank_torchrun_job_on_two_instances_as_the_jobs_uid(
        sshds, tmp_path):  # noqa: F811
    work = tmp_path / "work"
    hosts = [Host(name=f"instance-{address}", address=address, port=sshds["port"], user="root",
                  private_key=sshds["key"].read_text(), slots=1, work_dir=str(work), peer_ssh_port=sshds["port"],
                  peer_ssh_key=str(sshds["key"]), network_interface="lo") for address in ("127.0.0.2", "127.0.0.3")]
    files = projects.read_archive(zip_of(PROJECT, top="proj/"), LIMITS)
    spec = JobSpec(job_id=6001, gpus=2, python=sys.executable, script_name="train.py", script_content=None,
                   script_path=None, launcher="torchrun", project=projects.pack(files), installation="projects")
    runner = SSHRunner(hosts, kill_grace=5, poll_interval=0.1)
    lines, exited = run_to_end(runner, spec)
    assert exited.code == 0, [line.text for line in lines][-20:]
    root = work / spec.name / projects.PROJECT_DIR
    assert ranks_said(line.text for line in lines) == {
        rank: {"rank": rank, "world": 2, "batch": [rank, rank + 1], "config": "lr=0.1", "cwd": str(root)}
        for rank in (0, 1)}
    # Laid out as the job's uid (not the SSH account's, root), in the job's folder and nowhere else.
    uid = int((work / ".portal" / spec.name / "uid").read_text())
    laid_out = sorted(str(path.relative_to(root)) for path in root.rglob("*") if "__pycache__" not in path.parts)
    assert laid_out == ["conf", "conf/settings.txt", "datautils.py", "train.py"]
    assert {path.stat().st_uid for path in [root, *root.rglob("*")]} == {uid} and uid != 0
    assert (root / "datautils.py").read_text() == DATAUTILS
    assert not (work / spec.name / f".{projects.PROJECT_DIR}.tmp").exists()


@pytest.mark.django_db
def test_the_job_form_takes_a_project_archive_and_its_rerun_keeps_the_snapshot(client, alice, image,
                                                                                django_capture_on_commit_callbacks):
    from django.core.files.uploadedfile import SimpleUploadedFile
    from django.test import Client

    browser = Client()
    browser.force_login(alice)
    refused = browser.post("/jobs/new/", {"image": image.pk, "gpus": 1, "backend": "local", "entry_point": "nope.py",
                                          "project_file": SimpleUploadedFile("p.zip", zip_of(PROJECT))})
    assert refused.status_code == 200 and "The project has no file nope.py" in refused.content.decode()
    with django_capture_on_commit_callbacks():
        response = browser.post("/jobs/new/", {"image": image.pk, "gpus": 1, "backend": "local",
                                               "entry_point": "train.py",
                                               "project_file": SimpleUploadedFile("p.zip", zip_of(PROJECT))})
    job = Job.objects.get()
    assert response.status_code == 302 and job.project.owner == alice and job.entry_point == "train.py"
    assert Project.objects.count() == 1                       # the refused try's upload is the same snapshot
    rerun = browser.get(f"/jobs/{job.pk}/rerun/").content.decode()
    assert f'name="project" value="{job.project_id}"' in rerun and 'value="train.py"' in rerun


@pytest.mark.django_db
def test_the_job_page_lists_the_projects_files_and_opens_each(client, alice, image, make_user):
    from django.test import Client

    project = upload(client, zip_of(dict(PROJECT, **{"data/blob.bin": b"\xff\xfe\0"}))).json()["id"]
    job = client.post("/api/jobs/", {"image": "horovod-cpu", "gpus": 1, "project": project,
                                     "entry_point": "train.py"}, format="json").json()["id"]
    browser = Client()
    browser.force_login(alice)
    page = browser.get(f"/jobs/{job}/").content.decode()
    assert 'id="project-files"' in page and f'href="/jobs/{job}/files/datautils.py"' in page
    shown = browser.get(f"/jobs/{job}/files/datautils.py").content.decode()
    assert "def batch(rank):" in shown and 'id="file-text"' in shown
    assert 'id="file-binary"' in browser.get(f"/jobs/{job}/files/data/blob.bin").content.decode()
    assert browser.get(f"/jobs/{job}/files/missing.py").status_code == 404
    bob = Client()
    bob.force_login(make_user("bob"))
    assert bob.get(f"/jobs/{job}/files/datautils.py").status_code == 404


@pytest.mark.django_db
def test_on_kubernetes_a_project_job_shows_its_project_in_the_trainjob_and_one_past_a_configmap_is_400(client, alice):
    from django.core.management import call_command

    from jobs.backends.kubernetes.models import Cluster
    from jobs.models import Image
    from tests.test_clusters import kubeconfig

    cluster = Cluster(name="gpu-east", namespace="training", gpus_per_node=8)
    cluster.set_kubeconfig(kubeconfig())
    cluster.save()
    Image.objects.create(name="torch-gpu", container_image="registry.example/torch:2.13", python="python3",
                         launchers="torchrun")
    job = {"image": "torch-gpu", "gpus": 2, "backend": "kubernetes", "entry_point": "train.py"}
    response = client.post("/api/jobs/", {**job, "project": upload(client, zip_of(PROJECT)).json()["id"]},
                           format="json")
    assert response.status_code == 201, response.json()
    out = io.StringIO()
    call_command("render_trainjob", str(response.json()["id"]), stdout=out)   # exits 1 on any problem
    trainer = json.loads(out.getvalue())["spec"]["trainer"]
    assert trainer["command"][:2] == ["/bin/sh", "-c"] and "project.tar.gz" in trainer["command"][2]
    assert {"name": "RINGMASTER_PROJECT_DIR", "value": "/ringmaster/work/project"} in trainer["env"]

    large = upload(client, zip_of({"train.py": "print(1)\n", "weights.bin": os.urandom(950_000)}))
    response = client.post("/api/jobs/", {**job, "project": large.json()["id"]}, format="json")
    assert response.status_code == 400
    assert "a Kubernetes job takes at most 900,000" in response.json()["project"][0], response.json()
    # Its pods install no extra packages: a project that names some is refused, saying so.
    wants = upload(client, zip_of(dict(PROJECT, **{"requirements.txt": "pyyaml>=6\n"})))
    response = client.post("/api/jobs/", {**job, "project": wants.json()["id"]}, format="json")
    assert response.status_code == 400
    assert "Kubernetes cannot install a project's extra packages yet" in response.json()["project"][0]
    assert Job.objects.count() == 1


EXAMPLE_PROJECT = Path(__file__).resolve().parents[1] / "jobs" / "examples" / "ddp_project"


@pytest.mark.django_db
def test_the_example_project_passes_the_checks_at_submit_and_names_its_package(client):
    """The library's multi-file example (jobs/examples/ddp_project) compiles, asks for torchrun,
    and its requirements.txt is one the installer takes."""
    from jobs.models import Image

    Image.objects.create(name="torch-cpu", python=sys.executable, launchers="torchrun")
    files = {path.name: path.read_bytes() for path in EXAMPLE_PROJECT.iterdir() if path.is_file()}
    assert {"train.py", "model.py", "data.py", "config.yaml", "requirements.txt"} <= set(files)
    project = upload(client, zip_of(files)).json()["id"]
    response = client.post("/api/jobs/", {"image": "torch-cpu", "gpus": 2, "launcher": "torchrun",
                                          "project": project, "entry_point": "train.py"}, format="json")
    assert response.status_code == 201, response.json()
    assert response.json()["warnings"] == []
