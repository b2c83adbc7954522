"""Projects from git (issue #60): the portal fetches a repository at a ref when the job is
submitted, from a real `git daemon` on loopback, and the job records the commit; what it may
not fetch from is a 400 on `git` that says why."""
import base64
import io
import os
import shutil
import signal
import socket
import subprocess
import threading
import uuid
import zipfile
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from jobs.models import GitAllowedNetwork, GitCredential, Job, Project
from tests import sshd
from tests.conftest import free_port, wait_for

pytestmark = pytest.mark.skipif(shutil.which("git") is None, reason="needs git (apt-get install git)")

DATAUTILS = "def batch(rank):\n    return [rank, rank + 1]\n"
TRAIN = "from datautils import batch\nprint(batch(0))\n"


def git(*args, cwd):
    env = {"PATH": "/usr/bin:/bin", "HOME": str(cwd), "GIT_CONFIG_NOSYSTEM": "1", "GIT_CONFIG_GLOBAL": "/dev/null",
           "GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@example.com", "GIT_COMMITTER_NAME": "t",
           "GIT_COMMITTER_EMAIL": "t@example.com"}
    return subprocess.run(["git", *args], cwd=cwd, env=env, check=True, capture_output=True, text=True).stdout.strip()


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    """A git daemon on loopback serving every repository under its folder: (folder, port)."""
    base, port = tmp_path_factory.mktemp("git-served"), free_port()
    daemon = subprocess.Popen(["git", "daemon", "--export-all", f"--base-path={base}", "--listen=127.0.0.1",
                               f"--port={port}", "--reuseaddr", str(base)],
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)

    def listening():
        with socket.socket() as sock:
            return sock.connect_ex(("127.0.0.1", port)) == 0

    try:
        wait_for(listening, timeout=10, message="git daemon")
        yield base, port
    finally:
        # `git daemon` runs git-daemon as a child of its own: the whole group goes.
        os.killpg(daemon.pid, signal.SIGKILL)
        daemon.wait()


@pytest.fixture
def repository(served):
    """A repository of two commits, an annotated tag v1 at the first: (url, folder, v1's commit)."""
    base, port = served
    folder = base / f"proj-{uuid.uuid4().hex[:8]}"
    folder.mkdir()
    git("init", "--quiet", "-b", "main", cwd=folder)
    (folder / "datautils.py").write_text(DATAUTILS)
    (folder / "train.py").write_text(TRAIN)
    git("add", ".", cwd=folder)
    git("commit", "--quiet", "-m", "one", cwd=folder)
    git("tag", "-a", "-m", "the first", "v1", cwd=folder)
    first = git("rev-parse", "HEAD", cwd=folder)
    (folder / "datautils.py").write_text(DATAUTILS + "# two\n")
    (folder / "later.py").write_text("print('later')\n")
    git("add", ".", cwd=folder)
    git("commit", "--quiet", "-m", "two", cwd=folder)
    return f"git://127.0.0.1:{port}/{folder.name}", folder, first


@pytest.fixture
def client(api_client, alice, settings):
    settings.RINGMASTER_GIT_SCHEMES = ["https", "ssh", "git"]     # git:// is the test server's
    return api_client(alice)


def submit(client, url, ref, **more):
    return client.post("/api/jobs/", {"image": "horovod-cpu", "gpus": 1, "git": {"url": url, "ref": ref, **more},
                                      "entry_point": "train.py"}, format="json")


@pytest.mark.django_db
def test_a_job_at_a_tag_records_its_commit_and_runs_the_tags_files(client, image, alice, repository):
    url, folder, first = repository
    GitAllowedNetwork.objects.create(network="127.0.0.0/8", note="the test's git daemon")
    response = submit(client, url, "v1")
    assert response.status_code == 201, response.json()
    job = client.get(f"/api/jobs/{response.json()['id']}/").json()
    assert job["project"]["commit"] == first and job["project"]["url"] == url
    assert job["project"]["entry_point"] == "train.py"
    files = client.get(f"/api/jobs/{job['id']}/files/").json()
    assert files == [{"path": "datautils.py", "size": len(DATAUTILS)}, {"path": "train.py", "size": len(TRAIN)}]
    assert client.get(f"/api/jobs/{job['id']}/files/datautils.py").content == DATAUTILS.encode()

    # The same files uploaded as an archive are the same snapshot, which records no commit.
    archive = io.BytesIO()
    with zipfile.ZipFile(archive, "w") as zipped:
        zipped.writestr("datautils.py", DATAUTILS)
        zipped.writestr("train.py", TRAIN)
    archive.seek(0)
    archive.name = "p.zip"
    uploaded = client.post("/api/projects/", {"file": archive}, format="multipart").json()
    assert uploaded["id"] == job["project"]["id"] and uploaded["sha256"] == job["project"]["sha256"]
    plain = client.post("/api/jobs/", {"image": "horovod-cpu", "gpus": 1, "project": uploaded["id"],
                                       "entry_point": "train.py"}, format="json").json()
    assert plain["project"]["commit"] is None and plain["project"]["url"] is None

    # A branch is fetched at its newest commit.
    main = submit(client, url, "main").json()
    assert main["project"]["commit"] == git("rev-parse", "main", cwd=folder)
    assert {f["path"] for f in client.get(f"/api/jobs/{main['id']}/files/").json()} == \
        {"datautils.py", "later.py", "train.py"}

    from django.test import Client
    browser = Client()
    browser.force_login(alice)
    page = browser.get(f"/jobs/{job['id']}/").content.decode()
    assert f'<dd id="job-git"><code>{url}</code> at commit <code title="{first}">{first[:12]}</code>' in page

    # A rerun runs the same snapshot and records the same commit, though the tag has moved since.
    git("tag", "-f", "-a", "-m", "moved", "v1", "main", cwd=folder)
    assert browser.post(f"/jobs/{job['id']}/rerun/").status_code == 302
    rerun = Job.objects.exclude(pk__in=[job["id"], plain["id"], main["id"]]).get()
    assert rerun.project_id == job["project"]["id"] and rerun.project_commit == first and rerun.project_url == url


@pytest.mark.django_db
@pytest.mark.parametrize("url, ref, more, says", [
    (None, "v9", {}, "The repository has no branch, tag or commit 'v9'"),
    (None, "a" * 40, {}, "The repository has no branch, tag or commit"),
    ("file:///etc", "v1", {}, "must start with https:// or ssh:// or git://"),
    ("ext::sh -c touch% /tmp/ringmaster-pwned", "v1", {}, "may not start with '-' nor hold spaces"),
    ("ext::ssh-evil", "v1", {}, "must start with"),
    ("-u touch /tmp/ringmaster-pwned", "v1", {}, "may not start with '-'"),
    ("git@example.com:org/repo.git", "v1", {}, "must start with"),
    ("https://user:secret@example.com/r.git", "v1", {}, "Put no user name or password in the URL"),
    (None, "--upload-pack=touch /tmp/ringmaster-pwned", {}, "is not a branch, tag or commit name"),
    (None, "v1:refs/heads/x", {}, "is not a branch, tag or commit name"),
    (None, "v1", {"token": "abc"}, "A token is sent only to https:// repositories"),
    (None, "v1", {"password": "x"}, "Unknown key 'password'"),
    (None, "v1", {"credential": 99999}, "No git credential with id 99999"),
    (None, "v1", {"credential": "1"}, "credential must be the id of one of your git credentials"),
])
def test_what_git_may_not_fetch_is_400_on_git_saying_why(client, image, repository, url, ref, more, says):
    GitAllowedNetwork.objects.create(network="127.0.0.0/8")
    response = submit(client, url or repository[0], ref, **more)
    assert response.status_code == 400
    assert says in " ".join(response.json()["git"]), response.json()
    assert Job.objects.count() == 0 and Project.objects.count() == 0


@pytest.mark.django_db
def test_a_repository_on_loopback_is_refused_unless_an_admin_allows_its_network(client, image, repository, settings):
    response = submit(client, repository[0], "v1")
    assert response.status_code == 400
    assert "127.0.0.1 is a loopback address: git repositories are not fetched from there unless an admin " \
           "allows its network" in response.json()["git"][0]
    # Networks allowed for notifications are not allowed for git.
    settings.RINGMASTER_NOTIFY_ALLOWED_NETWORKS = ["127.0.0.0/8"]
    assert submit(client, repository[0], "v1").status_code == 400
    settings.RINGMASTER_GIT_ALLOWED_NETWORKS = ["127.0.0.0/8"]
    assert submit(client, repository[0], "v1").status_code == 201
    assert Job.objects.get().project_commit == repository[2]


TOKEN = "tok-" + uuid.uuid4().hex


class PrivateGit(BaseHTTPRequestHandler):
    """`git http-backend` (smart HTTP) for the folder in server.base, to a client that sends
    TOKEN as its password; others get 401."""

    def do_GET(self):
        self.serve()

    def do_POST(self):
        self.serve()

    def serve(self):
        expected = "Basic " + base64.b64encode(f"x-access-token:{TOKEN}".encode()).decode()
        if self.headers.get("Authorization") != expected:
            self.send_response(401)
            self.send_header("WWW-Authenticate", 'Basic realm="git"')
            self.send_header("Content-Length", "0")
            self.end_headers()
            return
        path, _, query = self.path.partition("?")
        body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
        env = {"PATH": "/usr/bin:/bin", "GIT_PROJECT_ROOT": str(self.server.base), "GIT_HTTP_EXPORT_ALL": "1",
               "PATH_INFO": path, "QUERY_STRING": query, "REQUEST_METHOD": self.command,
               "CONTENT_TYPE": self.headers.get("Content-Type", ""), "CONTENT_LENGTH": str(len(body)),
               "GIT_PROTOCOL": self.headers.get("Git-Protocol", ""), "REMOTE_ADDR": "127.0.0.1"}
        out = subprocess.run(["git", "http-backend"], input=body, env=env, capture_output=True).stdout
        head, _, content = out.partition(b"\r\n\r\n")
        headers = [line.split(": ", 1) for line in head.decode().split("\r\n") if ": " in line]
        status = next((int(value.split()[0]) for name, value in headers if name.lower() == "status"), 200)
        self.send_response(status)
        for name, value in headers:
            if name.lower() != "status":
                self.send_header(name, value)
        self.send_header("Content-Length", str(len(content)))
        self.end_headers()
        self.wfile.write(content)

    def log_message(self, *args):
        pass


@pytest.fixture
def private_http(served):
    server = ThreadingHTTPServer(("127.0.0.1", 0), PrivateGit)
    server.base = served[0]
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield server.server_address[1]
    finally:
        server.shutdown()
        server.server_close()


@pytest.mark.django_db
def test_a_private_repository_is_fetched_with_a_token_used_once_and_never_kept(client, image, repository,
                                                                              private_http, settings):
    settings.RINGMASTER_GIT_SCHEMES = ["https", "http"]          # the test server speaks plain HTTP
    settings.RINGMASTER_GIT_ALLOWED_NETWORKS = ["127.0.0.0/8", "::1/128"]
    # A name, as a real repository's: git connects to the address it was checked at.
    url = f"http://localhost:{private_http}/{repository[1].name}"
    refused = submit(client, url, "v1")
    assert refused.status_code == 400 and "a private repository needs a credential" in refused.json()["git"][0]
    response = submit(client, url, "v1", token=TOKEN)
    assert response.status_code == 201, response.json()
    assert response.json()["project"]["commit"] == repository[2]
    job = Job.objects.get()
    assert TOKEN not in str(list(Job.objects.values()))
    assert TOKEN not in client.get(f"/api/jobs/{job.pk}/").content.decode()


def test_git_connects_to_the_address_the_host_was_checked_at(private_http, repository):
    """A name that resolves nowhere (.invalid) is fetched from the address given: what the
    portal checked is what git reaches, whatever the name resolves to by then."""
    from runners import gitfetch

    url = gitfetch.parse_url(f"http://git.invalid:{private_http}/{repository[1].name}", ("http",))
    fetched = gitfetch.fetch(url, "v1", address="127.0.0.1", timeout=20, max_bytes=1 << 20, schemes=("http",),
                             token=TOKEN)
    assert fetched.commit == repository[2]
    # A repository past the limit on what git writes stops there.
    (repository[1] / "weights.bin").write_bytes(os.urandom(64 << 10))
    git("add", ".", cwd=repository[1])
    git("commit", "--quiet", "-m", "big", cwd=repository[1])
    assert gitfetch.fetch(url, "v1", address="127.0.0.1", timeout=20, max_bytes=32 << 10, schemes=("http",),
                          token=TOKEN).commit == repository[2]
    with pytest.raises(gitfetch.BadGit, match="larger than the 32,768 bytes taken"):
        gitfetch.fetch(url, "main", address="127.0.0.1", timeout=20, max_bytes=32 << 10, schemes=("http",),
                       token=TOKEN)


@pytest.mark.django_db
def test_a_stored_token_is_kept_encrypted_and_only_its_owner_fetches_with_it(client, image, repository, private_http,
                                                                            settings, api_client, make_user):
    settings.RINGMASTER_GIT_SCHEMES = ["https", "http", "ssh"]
    settings.RINGMASTER_GIT_ALLOWED_NETWORKS = ["127.0.0.0/8", "::1/128"]
    added = client.post("/api/git-credentials/", {"name": "ci", "kind": "token", "secret": TOKEN}, format="json")
    assert added.status_code == 201, added.json()
    assert set(added.json()) == {"id", "name", "kind", "public_key", "created_at"} and TOKEN not in added.content.decode()
    assert TOKEN not in str(list(GitCredential.objects.values()))          # encrypted at rest
    url = f"http://localhost:{private_http}/{repository[1].name}"
    response = submit(client, url, "v1", credential=added.json()["id"])
    assert response.status_code == 201, response.json()
    assert response.json()["project"]["commit"] == repository[2]
    # A token is not for ssh://; another user cannot use it, nor see it.
    assert "is a token: it is for https:// URLs" in \
        submit(client, "ssh://git@127.0.0.1/x.git", "v1", credential=added.json()["id"]).json()["git"][0]
    bob = api_client(make_user("bob"))
    refused = submit(bob, url, "v1", credential=added.json()["id"])
    assert refused.status_code == 400 and "No git credential with id" in refused.json()["git"][0]
    assert bob.get(f"/api/git-credentials/{added.json()['id']}/").status_code == 404
    assert client.delete(f"/api/git-credentials/{added.json()['id']}/").status_code == 204
    assert GitCredential.objects.count() == 0


@pytest.mark.django_db
@pytest.mark.skipif(not sshd.available(), reason="needs openssh-server")
def test_a_deploy_key_the_portal_made_fetches_over_ssh_from_a_known_host(client, image, repository, settings,
                                                                        tmp_path):
    added = client.post("/api/git-credentials/", {"name": "deploy", "kind": "ssh_key"}, format="json").json()
    assert added["public_key"].startswith("ssh-ed25519 ")
    assert "PRIVATE KEY" not in str(added) and "PRIVATE KEY" not in str(list(GitCredential.objects.values()))
    (tmp_path / "deploy.pub").write_text(added["public_key"] + "\n")
    server = sshd.Sshd(tmp_path, "127.0.0.2", sshd.free_port_on(["127.0.0.2"]), tmp_path / "deploy.pub").start()
    try:
        settings.RINGMASTER_GIT_ALLOWED_NETWORKS = ["127.0.0.0/8"]
        settings.RINGMASTER_GIT_SSH_KNOWN_HOSTS = str(tmp_path / "known_hosts")
        url = f"ssh://root@127.0.0.2:{server.port}{repository[1]}"
        (tmp_path / "known_hosts").write_text("")
        unknown = submit(client, url, "v1", credential=added["id"])
        assert unknown.status_code == 400 and "Host key verification failed" in unknown.json()["git"][0]
        (tmp_path / "known_hosts").write_text(f"[127.0.0.2]:{server.port} {server.host_key_line()}\n")
        response = submit(client, url, "v1", credential=added["id"])
        assert response.status_code == 201, response.json()
        assert response.json()["project"]["commit"] == repository[2]
    finally:
        server.stop()
