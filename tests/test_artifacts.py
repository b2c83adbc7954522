"""Artifacts (issue 44, part 4): the files a job writes under RINGMASTER_OUTPUT_DIR, listed,
downloaded one by one or as a .tar.gz, never outside the job's output folder, counted against
the owner's storage quota, deleted after the retention period, and a rerun from the newest
checkpoint. The folder is a local job's own output folder, written here as a job would."""
import gzip
import io
import os
import subprocess
import tarfile
from datetime import timedelta
from pathlib import Path

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError
from django.utils import timezone

from jobs import backends
from jobs.backends.instances.models import Instance
from jobs.domain import artifacts as job_artifacts
from jobs.models import Job, Quota, Script, State
from runners import artifacts
from runners.base import JobSpec
from runners.ssh import Host, SSHRunner
from tests import sshd

pytestmark = pytest.mark.django_db


def make_job(owner, image, **extra):
    script, _ = Script.objects.get_or_create(owner=owner, name="train.py", sha256="0" * 64, size=1, content="print(1)\n")
    return Job.objects.create(owner=owner, image=image, gpus=1, time_limit_minutes=5, script=script, **extra)


def output_of(job):
    """The job's output folder, as its ranks see it (RINGMASTER_OUTPUT_DIR)."""
    folder = backends.of(job).artifacts_root(job)
    folder.mkdir(parents=True, exist_ok=True)
    return folder


def write(folder, name, content, mtime=None):
    path = folder.joinpath(*name.split("/"))
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(content)
    if mtime is not None:
        os.utime(path, (mtime, mtime))
    return path


@pytest.fixture
def job(alice, image):
    return make_job(alice, image, state=State.SUCCEEDED, checkpoint_pattern="*.pt")


@pytest.fixture
def outside(tmp_path):
    secret = tmp_path / "secret.txt"
    secret.write_text("the portal's own file")
    return secret


def test_the_list_names_every_file_with_its_size_and_time_and_each_downloads_byte_for_byte(job, api_client):
    folder = output_of(job)
    payload = bytes(range(256)) * 100
    write(folder, "model.bin", payload, mtime=1_700_000_000)
    write(folder, "logs/run 1/events.txt", b"step 1\n")
    api = api_client(job.owner)

    listed = api.get(f"/api/jobs/{job.pk}/artifacts/")
    assert listed.status_code == 200
    assert listed.json() == [
        {"name": "logs/run 1/events.txt", "size": 7, "modified": pytest.approx(os.stat(folder / "logs/run 1/events.txt").st_mtime)},
        {"name": "model.bin", "size": len(payload), "modified": 1_700_000_000},
    ]
    got = api.get(f"/api/jobs/{job.pk}/artifacts/model.bin")
    assert got.status_code == 200 and b"".join(got.streaming_content) == payload
    nested = api.get(f"/api/jobs/{job.pk}/artifacts/logs/run%201/events.txt")
    assert b"".join(nested.streaming_content) == b"step 1\n"
    assert api.get(f"/api/jobs/{job.pk}/artifacts/missing.bin").status_code == 404


def test_another_users_job_is_404_and_a_name_that_leaves_the_folder_is_refused(job, api_client, make_user, outside):
    folder = output_of(job)
    write(folder, "model.bin", b"mine")
    (folder / "link").symlink_to(outside)
    (folder / "linked-dir").symlink_to(outside.parent, target_is_directory=True)
    stranger = api_client(make_user("mallory"))
    assert stranger.get(f"/api/jobs/{job.pk}/artifacts/").status_code == 404
    assert stranger.get(f"/api/jobs/{job.pk}/artifacts/model.bin").status_code == 404

    api = api_client(job.owner)
    assert [a["name"] for a in api.get(f"/api/jobs/{job.pk}/artifacts/").json()] == ["model.bin"]  # no links
    for name in ("../x", "a/../../x", "%2e%2e/x", "logs/./x"):
        response = api.get(f"/api/jobs/{job.pk}/artifacts/{name}")
        assert response.status_code == 400, name
        assert "name" in response.json()
    assert api.get(f"/api/jobs/{job.pk}/artifacts/link").status_code == 404
    assert api.get(f"/api/jobs/{job.pk}/artifacts/linked-dir/secret.txt").status_code == 404
    with pytest.raises(artifacts.BadName):
        artifacts.open_artifact(str(folder), "/etc/passwd")


def test_the_archive_holds_every_file(job, api_client, client):
    folder = output_of(job)
    write(folder, "model.bin", b"\x00\x01" * 5000)
    write(folder, "sub/notes.txt", b"hello")
    response = api_client(job.owner).get(f"/api/jobs/{job.pk}/artifacts.tar.gz")
    assert response.status_code == 200 and response["Content-Type"] == "application/gzip"
    with tarfile.open(fileobj=io.BytesIO(b"".join(response.streaming_content)), mode="r:gz") as archive:
        assert sorted(archive.getnames()) == ["model.bin", "sub/notes.txt"]
        assert archive.extractfile("model.bin").read() == b"\x00\x01" * 5000
        assert archive.extractfile("sub/notes.txt").read() == b"hello"

    client.force_login(job.owner)
    page = client.get(f"/jobs/{job.pk}/").content.decode()
    assert f'href="/jobs/{job.pk}/artifacts/sub/notes.txt"' in page
    assert f'href="/jobs/{job.pk}/artifacts.tar.gz"' in page
    assert b"".join(client.get(f"/jobs/{job.pk}/artifacts/sub/notes.txt").streaming_content) == b"hello"


def test_the_storage_quota_is_set_shown_and_a_job_over_it_is_flagged(job, api_client, image):
    call_command("set_quota", "--user", job.owner.username, "--storage-gb", "0.000001")     # 1000 bytes
    assert Quota.objects.get(user=job.owner, backend="").storage_gb == 0.000001
    with pytest.raises(CommandError, match="--storage-gb"):
        call_command("set_quota", "--user", job.owner.username, "--backend", "local", "--storage-gb", "1")

    small = make_job(job.owner, image, state=State.SUCCEEDED)
    write(output_of(small), "a.bin", b"x" * 600)
    job_artifacts.collect(small)
    small.refresh_from_db()
    assert (small.artifacts_bytes, small.artifacts_note) == (600, "")

    write(output_of(job), "big.bin", b"y" * 500)          # 600 + 500 > 1000
    job_artifacts.collect(job)
    job.refresh_from_db()
    assert job.artifacts_bytes == 500 and "storage quota" in job.artifacts_note

    storage = api_client(job.owner).get("/api/quota/").json()["storage"]
    assert storage == {"limit_bytes": 1000, "used_bytes": 1100}


def test_retention_deletes_the_artifacts_of_jobs_that_ended_long_ago(job, image, settings, api_client):
    settings.RINGMASTER_ARTIFACT_RETENTION_DAYS = 7
    now = timezone.now()
    Job.objects.filter(pk=job.pk).update(finished_at=now - timedelta(days=8), artifacts_bytes=4)
    recent = make_job(job.owner, image, state=State.SUCCEEDED, finished_at=now - timedelta(days=6))
    write(output_of(job), "old.bin", b"old!")
    write(output_of(recent), "new.bin", b"new!")

    assert job_artifacts.expire(now) == 1
    job.refresh_from_db()
    assert job.artifacts_deleted_at == now and job.artifacts_bytes == 0
    assert not (backends.of(job).artifacts_root(job) / "old.bin").exists()
    assert (backends.of(recent).artifacts_root(recent) / "new.bin").exists()
    api = api_client(job.owner)
    assert api.get(f"/api/jobs/{job.pk}/artifacts/").json() == []
    assert api.get(f"/api/jobs/{job.pk}/artifacts/old.bin").status_code == 404
    assert job_artifacts.expire(now) == 0


def test_rerun_from_checkpoint_starts_from_the_newest_matching_file(job, api_client, django_capture_on_commit_callbacks):
    folder = output_of(job)
    write(folder, "ckpt/epoch-1.pt", b"one", mtime=1_700_000_000)
    write(folder, "epoch-2.pt", b"two", mtime=1_700_000_100)
    write(folder, "later.log", b"not a checkpoint", mtime=1_700_000_200)
    api = api_client(job.owner)
    with django_capture_on_commit_callbacks():
        response = api.post(f"/api/jobs/{job.pk}/rerun-from-checkpoint/")
    assert response.status_code == 201, response.content
    new = Job.objects.get(pk=response.json()["id"])
    assert (new.parent_id, new.checkpoint, new.checkpoint_pattern) == (job.pk, "epoch-2.pt", "*.pt")
    assert backends.job_spec(new).checkpoint == (str(folder), "epoch-2.pt")

    os.utime(folder / "ckpt/epoch-1.pt", (1_700_000_300, 1_700_000_300))
    assert job_artifacts.newest_checkpoint(job) == "ckpt/epoch-1.pt"


def test_rerun_from_checkpoint_without_a_match_or_a_pattern_is_a_400_naming_why(job, api_client, image):
    api = api_client(job.owner)
    response = api.post(f"/api/jobs/{job.pk}/rerun-from-checkpoint/")
    assert response.status_code == 400 and "matches *.pt" in response.json()["checkpoint_pattern"][0]
    plain = make_job(job.owner, image, state=State.SUCCEEDED)
    response = api.post(f"/api/jobs/{plain.pk}/rerun-from-checkpoint/")
    assert response.status_code == 400 and "no checkpoint pattern" in response.json()["checkpoint_pattern"][0]
    response = api.post("/api/jobs/", {"image": image.name, "gpus": 1, "script_path": "t.py",
                                       "checkpoint_pattern": "../*.pt"}, format="json")
    assert response.status_code == 400 and "checkpoint_pattern" in response.json()


def test_the_local_runner_gives_the_job_its_output_folder_and_checkpoint(tmp_path, job):
    from runners.base import JobSpec
    from runners.local import LocalRunner

    source = tmp_path / "old"
    write(source, "epoch-2.pt", b"weights")
    spec = JobSpec(job_id=7, gpus=1, python="python", script_name="t.py", script_content="", script_path=None,
                   checkpoint=(str(source), "epoch-2.pt"))
    (tmp_path / "jobs").mkdir()
    runner = LocalRunner(tmp_path / "jobs")
    env = runner.environment(spec)
    runner._prepare(spec, runner.job_dir(spec), {})
    assert env["RINGMASTER_OUTPUT_DIR"] == str(runner.output_dir(spec).resolve())
    assert Path(env["RINGMASTER_OUTPUT_DIR"]).is_dir()
    assert Path(env["RINGMASTER_CHECKPOINT"]).read_bytes() == b"weights"
    assert Path(env["RINGMASTER_CHECKPOINT"]).is_relative_to(runner.job_dir(spec).resolve())


def test_an_instance_jobs_artifacts_come_from_the_portals_storage_and_its_rerun_starts_from_there(
        alice, image, api_client, settings, django_capture_on_commit_callbacks):
    job = make_job(alice, image, state=State.SUCCEEDED, backend="instances", checkpoint_pattern="*.pt")
    assert backends.of(job).artifacts_root(job).parent == settings.RINGMASTER_ARTIFACTS_DIR   # no job sees it
    write(output_of(job), "epoch-1.pt", b"brought back")
    api = api_client(alice)
    assert b"".join(api.get(f"/api/jobs/{job.pk}/artifacts/epoch-1.pt").streaming_content) == b"brought back"
    Instance.objects.create(name="gpu-a", host="gpu-a.example", user="u", gpus=1, healthy=True)
    with django_capture_on_commit_callbacks():
        response = api.post(f"/api/jobs/{job.pk}/rerun-from-checkpoint/")
    assert response.status_code == 201, response.content
    new = Job.objects.get(pk=response.json()["id"])
    assert (new.backend, new.checkpoint) == ("instances", "epoch-1.pt")
    assert backends.job_spec(new).checkpoint == (str(output_of(job)), "epoch-1.pt")


def test_a_rerun_from_checkpoint_on_a_backend_that_cannot_give_one_is_a_400_naming_it(alice, image, api_client):
    job = make_job(alice, image, state=State.SUCCEEDED, backend="machines", checkpoint_pattern="*.pt")
    write(output_of(job), "epoch-1.pt", b"kept")
    response = api_client(alice).post(f"/api/jobs/{job.pk}/rerun-from-checkpoint/")
    assert response.status_code == 400
    assert response.json()["checkpoint_pattern"] == ["The Machines (tests) backend cannot give a new job a checkpoint."]


# --- a tree deeper than the walk goes (issue 58, part D) ---------------------------------------------

DEEP = 2000
WITHIN = artifacts.MAX_DEPTH               # the deepest folder a walk enters


def nest(folder, depth, files):
    """Folders d/d/.../d, `depth` of them, under `folder`, and {level: (name, bytes)} a file in
    the folder that many levels down. Made through open folders: the whole path is longer than
    one system call takes."""
    fd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY)
    try:
        for level in range(depth + 1):
            if level in files:
                name, content = files[level]
                handle = os.open(name, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644, dir_fd=fd)
                os.write(handle, content)
                os.close(handle)
            if level < depth:
                os.mkdir("d", dir_fd=fd)
                below = os.open("d", os.O_RDONLY | os.O_DIRECTORY, dir_fd=fd)
                os.close(fd)
                fd = below
    finally:
        os.close(fd)


@pytest.fixture
def deep_job(job):
    """`job`, its output folder 2,000 folders deep: a file at the top, one in the deepest folder
    a walk enters, one just below it and one at the bottom. Removed afterwards where the test left it
    (pytest's own clean-up would recurse)."""
    folder = output_of(job)
    nest(folder, DEEP, {0: ("top.txt", b"top"), WITHIN: ("within.bin", b"w" * 1000),
                        WITHIN + 1: ("below.bin", b"b" * 7), DEEP: ("bottom.bin", b"x" * 11)})
    yield job
    artifacts.remove_tree(folder)


def test_an_output_folder_2000_deep_lists_archives_and_expires_and_the_other_jobs_expire_too(
        deep_job, api_client, client, image, settings):
    job = deep_job
    within = "d/" * WITHIN + "within.bin"
    api = api_client(job.owner)

    listed = api.get(f"/api/jobs/{job.pk}/artifacts/")
    assert listed.status_code == 200
    *files, skipped = listed.json()
    assert [(f["name"], f["size"]) for f in files] == [(within, 1000), ("top.txt", 3)]
    assert all(set(f) == {"name", "size", "modified"} for f in files)
    assert skipped["name"] == "d/" * (WITHIN + 1) and skipped["size"] == 0
    assert skipped["skipped"] == f"more than {WITHIN} folders deep: not walked"
    assert b"".join(api.get(f"/api/jobs/{job.pk}/artifacts/{within}").streaming_content) == b"w" * 1000

    response = api.get(f"/api/jobs/{job.pk}/artifacts.tar.gz")
    assert response.status_code == 200
    whole = gzip.decompress(b"".join(response.streaming_content))     # EOFError if cut off
    with tarfile.open(fileobj=io.BytesIO(whole)) as archive:
        assert sorted(archive.getnames()) == [within, "top.txt"]
        assert archive.extractfile(within).read() == b"w" * 1000

    client.force_login(job.owner)
    page = client.get(f"/jobs/{job.pk}/")
    assert page.status_code == 200
    assert 'id="artifacts-skipped"' in page.content.decode() and "folders deep: not walked" in page.content.decode()

    job_artifacts.collect(job)
    job.refresh_from_db()
    assert (job.artifacts_bytes, job.artifacts_note) == (1003, "")

    settings.RINGMASTER_ARTIFACT_RETENTION_DAYS = 7
    now = timezone.now()
    ended = {"state": State.SUCCEEDED, "finished_at": now - timedelta(days=8)}
    Job.objects.filter(pk=job.pk).update(**ended)
    older = make_job(job.owner, image, **ended)
    Job.objects.filter(pk=older.pk).update(created_at=job.created_at - timedelta(hours=1))   # after it in the sweep
    newer = make_job(job.owner, image, **ended)                                            # before it
    for other in (older, newer):
        write(output_of(other), "old.bin", b"old!")
    assert job_artifacts.expire(now) == 3
    for expired in (job, older, newer):
        expired.refresh_from_db()
        assert (expired.artifacts_deleted_at, expired.artifacts_bytes) == (now, 0)
        assert not os.path.lexists(backends.of(expired).artifacts_root(expired))


def test_the_walk_stops_after_its_number_of_names_and_says_where(tmp_path):
    write(tmp_path, "a.txt", b"a")
    write(tmp_path, "b/c.txt", b"c")
    write(tmp_path, "b/d.txt", b"d")
    tree = artifacts.walk(tmp_path, max_entries=3)          # a.txt, b, and one file in b
    assert len(tree.files) == 2
    assert [(s.name, s.reason) for s in tree.skipped] == [("b/", artifacts.too_many(3))]


def test_an_output_folder_replaced_by_a_link_is_neither_followed_nor_deleted_through(tmp_path, outside):
    link = tmp_path / "output"
    link.symlink_to(outside.parent, target_is_directory=True)
    assert artifacts.walk(link).files == [] and "cannot be read" in artifacts.walk(link).skipped[0].reason
    artifacts.remove_tree(link)
    assert not os.path.lexists(link) and outside.read_text() == "the portal's own file"


def test_a_job_whose_artifacts_cannot_be_deleted_is_logged_and_the_sweep_goes_on(job, image, settings, caplog):
    settings.RINGMASTER_ARTIFACT_RETENTION_DAYS = 7
    now = timezone.now()
    ended = {"state": State.SUCCEEDED, "finished_at": now - timedelta(days=8)}
    Job.objects.filter(pk=job.pk).update(**ended)
    other = make_job(job.owner, image, **ended)
    Job.objects.filter(pk=other.pk).update(created_at=job.created_at - timedelta(hours=1))    # after it in the sweep
    stuck = write(output_of(job), "sub/stuck.bin", b"immutable")
    write(output_of(other), "old.bin", b"old!")
    if subprocess.run(["chattr", "+i", str(stuck)], capture_output=True).returncode != 0:
        pytest.skip("needs chattr +i (CAP_LINUX_IMMUTABLE on a file system that has it)")
    try:
        assert job_artifacts.expire(now) == 1
    finally:
        subprocess.run(["chattr", "-i", str(stuck)], check=True)
    job.refresh_from_db()
    other.refresh_from_db()
    assert job.artifacts_deleted_at is None and stuck.exists()        # tried again next pass
    assert f"job {job.pk}: its artifacts could not be deleted" in caplog.text
    assert other.artifacts_deleted_at == now and not backends.of(other).artifacts_root(other).exists()


@pytest.mark.skipif(not sshd.available(), reason="needs Debian's openssh-server (/usr/sbin/sshd)")
def test_an_instances_deep_output_folder_is_brought_back_within_the_limits_saying_what_was_not(tmp_path):
    """Over SFTP from a real sshd on loopback (the instance's folder is on this machine); the
    remote walk is the local one's loop, so a few folders past the limit show it."""
    key = sshd.keygen(tmp_path / "user_key")
    port = sshd.free_port_on(["127.0.0.8"])
    server = sshd.Sshd(tmp_path, "127.0.0.8", port, f"{key}.pub").start()
    try:
        host = Host(name="deep", address="127.0.0.8", port=port, user="root", private_key=key.read_text(),
                    work_dir=str(tmp_path / "work"))
        spec = JobSpec(job_id=9, gpus=1, python="python", script_name="t.py", script_content="", script_path=None)
        remote = Path(host.job_dir(spec)) / artifacts.OUTPUT_DIR
        remote.mkdir(parents=True)
        nest(remote, WITHIN + 3, {0: ("top.txt", b"top"), WITHIN: ("within.bin", b"w" * 1000),
                                  WITHIN + 1: ("below.bin", b"b" * 7), WITHIN + 3: ("bottom.bin", b"x" * 11)})
        target = tmp_path / "brought"
        kept, note = SSHRunner([host], connect_timeout=10).fetch_artifacts(spec, target, None)
    finally:
        server.stop()
    assert kept == 1003
    assert [a.name for a in artifacts.listing(target)] == ["d/" * WITHIN + "within.bin", "top.txt"]
    assert note == f"not brought back: {artifacts.too_deep()}: {'d/' * (WITHIN + 1)}"
