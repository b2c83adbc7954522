"""The ringmaster command without a portal: configuration, arguments, output format, errors."""
import json
import re
import subprocess
import sys

import pytest

from cli import main as cli
from tests.conftest import ROOT

TOKEN = "0123456789abcdef0123456789abcdef01234567"


def write_config(path, **values):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("[ringmaster]\n" + "".join(f"{k} = {v}\n" for k, v in values.items()))
    return path


@pytest.fixture
def home(tmp_path, monkeypatch):
    """A clean environment: no RINGMASTER_* variables, HOME in a temporary folder."""
    for name in ("RINGMASTER_URL", "RINGMASTER_TOKEN", "RINGMASTER_CONFIG", "XDG_CONFIG_HOME"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))
    return tmp_path


# --- configuration ----------------------------------------------------------------------------

def test_defaults_without_environment_or_file(tmp_path):
    config = cli.load_config({"HOME": str(tmp_path)})
    assert config.url == "http://127.0.0.1:8000" and config.token is None
    assert config.path == tmp_path / ".config" / "ringmaster" / "config.ini"


def test_the_default_config_file_gives_url_and_token(tmp_path):
    write_config(tmp_path / ".config" / "ringmaster" / "config.ini", url="https://rm.example.com/", token=TOKEN)
    config = cli.load_config({"HOME": str(tmp_path)})
    assert (config.url, config.token) == ("https://rm.example.com", TOKEN)


def test_environment_wins_over_the_file(tmp_path):
    path = write_config(tmp_path / "rm.ini", url="http://file:1", token="from-file")
    config = cli.load_config({"RINGMASTER_CONFIG": str(path), "RINGMASTER_URL": "http://env:2",
                              "RINGMASTER_TOKEN": "from-env", "HOME": str(tmp_path)})
    assert (config.url, config.token) == ("http://env:2", "from-env")
    only_url = cli.load_config({"RINGMASTER_CONFIG": str(path), "RINGMASTER_URL": "http://env:2"})
    assert (only_url.url, only_url.token) == ("http://env:2", "from-file")


def test_xdg_config_home_is_honoured(tmp_path):
    write_config(tmp_path / "xdg" / "ringmaster" / "config.ini", token="xdg")
    assert cli.load_config({"XDG_CONFIG_HOME": str(tmp_path / "xdg"), "HOME": "/nonexistent"}).token == "xdg"


def test_a_missing_explicit_config_file_or_a_bad_url_is_a_usage_error(tmp_path):
    with pytest.raises(cli.CliError) as missing:
        cli.load_config({"RINGMASTER_CONFIG": str(tmp_path / "nope.ini")})
    assert missing.value.code == 2 and "nope.ini" in str(missing.value)
    with pytest.raises(cli.CliError) as bad:
        cli.load_config({"RINGMASTER_URL": "127.0.0.1:8000", "HOME": str(tmp_path)})
    assert bad.value.code == 2 and "http://host:port" in str(bad.value)


def test_a_broken_config_file_is_reported_without_its_content(tmp_path):
    path = tmp_path / "rm.ini"
    path.write_text(f"token = {TOKEN}\n")                   # no section header
    with pytest.raises(cli.CliError) as error:
        cli.load_config({"RINGMASTER_CONFIG": str(path)})
    assert error.value.code == 2 and TOKEN not in str(error.value)


def test_the_token_never_shows_in_the_config_repr(tmp_path):
    config = cli.load_config({"RINGMASTER_TOKEN": TOKEN, "HOME": str(tmp_path)})
    assert TOKEN not in repr(config) and TOKEN not in str(config)


def test_no_token_tells_how_to_get_one(home, capsys):
    assert cli.main(["ls"]) == 2
    err = capsys.readouterr().err
    assert "no API token" in err and "RINGMASTER_TOKEN" in err
    assert "python manage.py create_api_token <username>" in err
    assert str(home / ".config" / "ringmaster" / "config.ini") in err


def test_a_missing_local_script_is_refused_before_any_request(home, monkeypatch, capsys, closed_port):
    monkeypatch.setenv("RINGMASTER_TOKEN", TOKEN)
    monkeypatch.setenv("RINGMASTER_URL", f"http://127.0.0.1:{closed_port}")   # nothing listens there
    assert cli.main(["submit", "--image", "horovod-cpu", "--gpus", "2", str(home / "nope.py")]) == 2
    err = capsys.readouterr().err
    assert "nope.py: no such file" in err and "--script-path" in err and TOKEN not in err
    assert cli.main(["submit", "--image", "i", "--gpus", "2", "--script-path", "/a.py", str(home / "x.py")]) == 2
    assert "not both" in capsys.readouterr().err
    assert cli.main(["submit", "--image", "i", "--gpus", "2"]) == 2
    assert "give the script to run" in capsys.readouterr().err


@pytest.fixture
def closed_port():
    """A port of this machine that is bound (so nothing else takes it) but not listening: a
    connection to it is refused."""
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        yield sock.getsockname()[1]


def test_an_unreachable_portal_is_a_clear_error(home, monkeypatch, capsys, closed_port):
    monkeypatch.setenv("RINGMASTER_TOKEN", TOKEN)
    monkeypatch.setenv("RINGMASTER_URL", f"http://127.0.0.1:{closed_port}")
    assert cli.main(["ls"]) == 1
    err = capsys.readouterr().err
    assert f"cannot reach the portal at http://127.0.0.1:{closed_port}" in err and TOKEN not in err


# --- arguments --------------------------------------------------------------------------------

def test_submit_arguments_and_everything_after_the_double_dash():
    args = cli.parse_args(["submit", "--image", "horovod-cpu", "--gpus", "2", "--name", "n", "--env", "LR=0.1",
                           "--env", "EMPTY=", "--env", "EQ=a=b", "--backend", "local", "--time-limit", "30", "-f",
                           "--group", "vision", "--cluster", "gpu-east", "--gpu-model", "A100",
                           "train.py", "--", "--epochs", "2", "--", "$(id)"])
    assert (args.command, args.image, args.gpus) == ("submit", "horovod-cpu", 2)
    assert (args.name, args.script) == ("n", "train.py")
    assert args.env == [("LR", "0.1"), ("EMPTY", ""), ("EQ", "a=b")]
    assert (args.backend, args.time_limit, args.follow, args.quiet) == ("local", 30, True, False)
    assert (args.group, args.backend_options, args.gpu_model) == ("vision", {"cluster": "gpu-east"}, "A100")
    assert args.script_args == ["--epochs", "2", "--", "$(id)"]                # literally, never a shell


def test_a_backends_own_options_are_taken_in_either_form_and_never_from_the_scripts_arguments():
    args = cli.parse_args(["submit", "--image", "i", "--gpus", "1", "--node-pool=a=b", "--env=--x=1",
                           "--cluster", "gpu-a", "train.py", "--epochs", "2", "--", "--zone", "z"])
    # --epochs before `--` is an option for the portal to check (it refuses one no backend has).
    assert args.backend_options == {"node_pool": "a=b", "cluster": "gpu-a", "epochs": "2"}
    assert (args.env, args.script, args.script_args) == ([("--x", "1")], "train.py", ["--zone", "z"])


def test_submit_with_a_path_inside_the_image_and_no_args():
    args = cli.parse_args(["submit", "--image", "3", "--gpus", "1", "--script-path", "/opt/train.py", "-q"])
    assert (args.script, args.script_path, args.script_args, args.quiet) == (None, "/opt/train.py", [], True)


@pytest.mark.parametrize("argv", [
    ["submit", "--gpus", "2", "t.py"],                                # --image is required
    ["submit", "--image", "i", "--gpus", "two", "t.py"],              # not a number
    ["submit", "--image", "i", "--gpus", "2", "--env", "NOVALUE", "t.py"],
    ["submit", "--image", "i", "--gpus", "2", "t.py", "--epochs"],    # a backend's option needs a value
    ["submit", "--image", "i", "--gpus", "2", "t.py", "--Bad=1"],
    ["logs", "7", "--rank", "worker"],
    ["logs", "seven"],
    ["logs", "7", "--", "x"],                                          # `--` only goes with submit
    ["ls", "--limit", "0"],
    ["cancel"],
    [],
])
def test_bad_arguments_exit_2(argv, capsys):
    with pytest.raises(SystemExit) as exit_:
        cli.parse_args(argv)
    assert exit_.value.code == 2
    assert "usage:" in capsys.readouterr().err


def test_logs_cancel_and_ls_arguments():
    logs = cli.parse_args(["logs", "-f", "12", "--rank", "launcher"])
    assert (logs.job_id, logs.follow, logs.rank) == (12, True, "launcher")
    assert cli.parse_args(["logs", "12", "--rank", "3"]).rank == "3"
    assert cli.parse_args(["cancel", "5"]).job_id == 5
    ls = cli.parse_args(["ls", "--state", "RUNNING", "--limit", "5"])
    assert (ls.state, ls.limit) == ("RUNNING", 5)


# --- output -----------------------------------------------------------------------------------

def test_lines_are_labelled_by_rank_and_stream():
    assert cli.format_line({"seq": 1, "rank": 0, "stream": "stdout", "text": "hi"}) == "[0] hi"
    assert cli.format_line({"seq": 2, "rank": 1, "stream": "stderr", "text": "oops"}) == "[1 stderr] oops"
    assert cli.format_line({"seq": 3, "rank": "launcher", "stream": "stdout", "text": "x"}) == "[launcher] x"
    assert cli.rank_matches({"rank": "launcher"}, "launcher") and cli.rank_matches({"rank": 3}, "3")
    assert not cli.rank_matches({"rank": 3}, "1") and cli.rank_matches({"rank": 3}, None)


def test_field_errors_name_each_field():
    error = cli.FieldErrors({"gpus": ["Ensure this value is greater than or equal to 1."],
                             "non_field_errors": ["Send a JSON object."]})
    assert error.code == 2
    assert str(error).splitlines() == ["gpus: Ensure this value is greater than or equal to 1.", "Send a JSON object."]


def test_the_cli_imports_no_django_and_nothing_of_the_portal():
    code = ("import sys, cli.main; bad = sorted(m for m in sys.modules if m.split('.')[0] in "
            "('django', 'rest_framework', 'channels', 'celery', 'portal') or m in ('jobs.models', 'jobs.domain.services')); "
            "print(bad); sys.exit(1 if bad else 0)")
    result = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True,
                            env={"PATH": "/usr/bin:/bin"}, timeout=60)
    assert result.returncode == 0, result.stdout + result.stderr


def test_the_follower_prints_each_seq_once_and_stops_at_an_end_state(capsys):
    follower = cli.LogFollower(client=None, job_id=7, rank=None)

    def lines(*seqs):
        return json.dumps({"type": "lines", "lines": [
            {"seq": s, "rank": s % 2, "stream": "stdout", "ts": None, "text": f"line {s}"} for s in seqs]})

    assert not follower._handle(json.dumps({"type": "state", "state": "QUEUED", "reason": "waiting for capacity"}))
    assert not follower._handle(json.dumps({"type": "state", "state": "QUEUED", "reason": "waiting for capacity"}))
    assert not follower._handle(lines(0, 1, 2))
    assert not follower._handle(lines(1, 2, 3))                       # a replay overlapping what was printed
    assert not follower._handle(json.dumps({"type": "metrics", "points": []}))
    assert follower._handle(json.dumps({"type": "state", "state": "FAILED", "reason": "rank 1 exited"}))
    out, err = capsys.readouterr()
    assert out.splitlines() == ["[0] line 0", "[1] line 1", "[0] line 2", "[1] line 3"]
    assert err.splitlines() == ["ringmaster: job 7 QUEUED: waiting for capacity"]
    assert follower.last_seq == 3


def test_the_follower_filters_by_rank_but_remembers_every_seq(capsys):
    follower = cli.LogFollower(client=None, job_id=7, rank="launcher")
    follower._handle(json.dumps({"type": "lines", "lines": [
        {"seq": 0, "rank": "launcher", "stream": "stdout", "ts": None, "text": "start"},
        {"seq": 1, "rank": 0, "stream": "stderr", "ts": None, "text": "warn"}]}))
    assert capsys.readouterr().out == "[launcher] start\n" and follower.last_seq == 1


@pytest.fixture
def kolkata(monkeypatch):
    """This process in Asia/Kolkata (UTC+05:30), as a user there would run the CLI."""
    import time
    monkeypatch.setenv("TZ", "Asia/Kolkata")
    time.tzset()
    yield
    monkeypatch.undo()
    time.tzset()


class OnePage:
    """What the portal answers to GET /api/jobs/: one page with one job (no portal needed)."""

    def request(self, method, path, **kwargs):
        assert (method, path) == ("GET", "/api/jobs/")
        return {"count": 1, "results": [{"id": 7, "name": "resnet", "state": "RUNNING", "gpus": 2, "backend": "local",
                                         "created_at": "2026-11-25T06:15:02.123456Z", "reason": ""}]}


def test_ls_names_the_zone_of_the_times_it_prints(kolkata, capsys):
    assert cli.cmd_ls(OnePage(), cli.parse_args(["ls"])) == 0
    out, err = capsys.readouterr()
    assert "ringmaster: times in Asia/Kolkata (UTC+05:30)" in err.splitlines()
    header, row = out.splitlines()
    assert header.split() == ["ID", "NAME", "STATE", "GPUS", "BACKEND", "CREATED", "TAGS", "REASON"]
    assert "2026-11-25 11:45:02" in row                      # 06:15:02 UTC, in Kolkata


def test_the_zone_is_named_by_its_offset_where_it_has_no_name(monkeypatch):
    from datetime import datetime, timedelta, timezone
    monkeypatch.setenv("TZ", "EST5EDT")
    winter = datetime(2026, 1, 5, 12, tzinfo=timezone(timedelta(hours=-5), "EST"))
    assert cli.local_zone(winter) == "EST (UTC-05:00)"
    odd = datetime(2026, 1, 5, 12, tzinfo=timezone(timedelta(hours=3, minutes=30)))
    assert cli.local_zone(odd) == "UTC+03:30"


def test_ls_shows_an_elastic_jobs_size_now_and_its_bounds():
    _gpus_cell = cli._gpus_cell
    assert _gpus_cell({"gpus": 4, "max_gpus": None, "size": 4}) == "4"
    assert _gpus_cell({"gpus": 2, "max_gpus": 4, "size": 3}) == "3 (2..4)"
    assert _gpus_cell({"gpus": 2, "max_gpus": 4, "size": None}) == "2 (2..4)"     # not admitted yet


def test_submit_takes_the_most_gpus_of_an_elastic_job():
    args = cli.parse_args(["submit", "--image", "horovod-cpu", "--gpus", "2", "--max-gpus", "8", "train.py"])
    assert (args.gpus, args.max_gpus) == (2, 8)


def test_submit_and_ls_take_tags_and_a_note():
    args = cli.parse_args(["submit", "--image", "i", "--gpus", "1", "--tag", "resnet", "--tag", "lr sweep",
                           "--note", "why", "t.py"])
    assert (args.tag, args.note) == (["resnet", "lr sweep"], "why")
    assert cli.parse_args(["submit", "--image", "i", "--gpus", "1", "t.py"]).tag == []
    assert cli.parse_args(["ls", "--tag", "a", "--tag", "b"]).tag == ["a", "b"]


class FakePortal:
    """A client of a portal that holds one job (7): its tags and note, and the requests sent."""

    def __init__(self, tags=(), note=""):
        self.stored = {"id": 7, "name": "n", "state": "RUNNING", "gpus": 1, "backend": "local", "reason": "",
                       "created_at": "2026-11-25T06:15:02Z", "tags": list(tags), "note": note}
        self.sent = []

    def job(self, job_id):
        assert job_id == 7
        return dict(self.stored)

    def request(self, method, path, **kwargs):
        self.sent.append((method, path, kwargs.get("json") or kwargs.get("params")))
        if method == "PATCH":
            self.stored.update(kwargs["json"])
        if path == "/api/jobs/":
            return {"count": 1, "results": [dict(self.stored)]}
        return dict(self.stored)


def test_tag_adds_and_removes_keeping_the_others(capsys):
    portal = FakePortal(tags=["resnet", "old", "lr sweep"])
    assert cli.cmd_tag(portal, cli.parse_args(["tag", "7", "--add", "best", "--remove", "old",
                                               "--remove", "lr  sweep"])) == 0
    assert portal.sent[-1] == ("PATCH", "/api/jobs/7/", {"tags": ["resnet", "best"]})
    assert capsys.readouterr().out.splitlines() == ["resnet", "best"]
    sent = len(portal.sent)
    assert cli.cmd_tag(portal, cli.parse_args(["tag", "7"])) == 0            # no change: only printed
    assert len(portal.sent) == sent and capsys.readouterr().out.splitlines() == ["resnet", "best"]


def test_note_sets_clears_and_prints(capsys, monkeypatch):
    import io
    portal = FakePortal()
    assert cli.cmd_note(portal, cli.parse_args(["note", "7", "diverged at step 900"])) == 0
    assert portal.sent[-1] == ("PATCH", "/api/jobs/7/", {"note": "diverged at step 900"})
    monkeypatch.setattr("sys.stdin", io.StringIO("two\nlines\n"))
    cli.cmd_note(portal, cli.parse_args(["note", "7", "-"]))
    assert portal.sent[-1][2] == {"note": "two\nlines\n"}
    capsys.readouterr()
    assert cli.cmd_note(portal, cli.parse_args(["note", "7"])) == 0
    assert capsys.readouterr().out == "two\nlines\n\n"
    cli.cmd_note(portal, cli.parse_args(["note", "7", ""]))
    assert portal.sent[-1] == ("PATCH", "/api/jobs/7/", {"note": ""})


def test_ls_sends_every_tag_and_shows_each_jobs_tags(capsys):
    portal = FakePortal(tags=["resnet", "lr sweep"])
    assert cli.cmd_ls(portal, cli.parse_args(["ls", "--tag", "resnet", "--tag", "lr sweep"])) == 0
    assert portal.sent == [("GET", "/api/jobs/", {"limit": 50, "tag": ["resnet", "lr sweep"]})]
    header, row = capsys.readouterr().out.splitlines()
    assert row[header.index("TAGS"):].startswith("resnet,lr sweep")


# --- a folder packed for submit -----------------------------------------------------------------

def make_tree(root, files):
    """Files under `root` from {"path": text, or bytes}; a path ending in "*" is made executable."""
    for name, content in files.items():
        path = root / name.rstrip("*")
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(content if isinstance(content, bytes) else content.encode())
        if name.endswith("*"):
            path.chmod(0o755)
    return root


FOLDER = {
    "train.py": "import datautils\n",
    "datautils.py": "X = 1\n",
    "run.sh*": "#!/bin/sh\n",
    ".gitignore": "*.log\n!keep.log\ndata/\n/build\nweights/\n",
    ".ringmasterignore": "notes/\n!weights/\n",
    ".git/HEAD": "ref: refs/heads/main\n",
    ".git/objects/ab/cdef": b"\0" * 1000,
    "data/big.bin": b"\1" * 2500,
    "data/more/x.bin": b"\2" * 500,
    "keep.log": "kept\n",
    "debug.log": "left\n",
    "build/out.o": "o",
    "weights/w.pt": "w",
    "notes/todo.md": "t",
    "src/.gitignore": "!debug2.log\nsecret.txt\n",
    "src/debug2.log": "taken back by the deeper file\n",
    "src/secret.txt": "s",
    "src/mod.py": "Y = 2\n",
    "src/build/gen.py": "# /build is anchored at the root: this one is sent\n",
    "vendor/lib/.git": "gitdir: ../../.git/modules/lib\n",
    "vendor/lib/lib.py": "Z = 3\n",
}


def test_a_folder_is_sent_without_git_what_its_ignore_files_match_and_links(tmp_path):
    import os

    from cli import pack

    root = make_tree(tmp_path / "my-project", FOLDER)
    (root / "link.py").symlink_to("train.py")
    (root / "outside").symlink_to(tmp_path)
    os.mkfifo(root / "pipe")
    selection = pack.select(root)
    assert sorted(selection.paths()) == [
        ".gitignore", ".ringmasterignore", "datautils.py", "keep.log", "run.sh", "src/.gitignore",
        "src/build/gen.py", "src/debug2.log", "src/mod.py", "train.py", "vendor/lib/lib.py", "weights/w.pt"]
    assert [file.path for file in selection.files if file.executable] == ["run.sh"]
    assert {(left.path, left.why, left.files) for left in selection.left_out} == {
        (".git/", "always", 2), ("data/", "by .gitignore", 2), ("debug.log", "by .gitignore", 1),
        ("build/", "by .gitignore", 1), ("notes/", "by .ringmasterignore", 1),
        ("src/secret.txt", "by src/.gitignore", 1), ("vendor/lib/.git", "always", 1),
        ("link.py", pack.LINK, 1), ("outside", pack.LINK, 1), ("pipe", pack.NOT_A_FILE, 1)}
    assert pack.summary(selection) == [
        "left out: .git/ (2 files, 1.0 kB) always",
        "left out: build/ (1 file, 1 B) by .gitignore",
        "left out: data/ (2 files, 3.0 kB) by .gitignore",
        "left out: debug.log (1 file, 5 B) by .gitignore",
        "left out: link.py (1 file, 0 B) as symbolic links (not followed)",
        "left out: notes/ (1 file, 1 B) by .ringmasterignore",
        "left out: outside (1 file, 0 B) as symbolic links (not followed)",
        "left out: pipe (1 file, 0 B) as neither files nor folders",
        "left out: src/ (1 file, 1 B) by src/.gitignore",
        "left out: vendor/ (1 file, 31 B) always"]


def test_a_packed_folder_is_the_snapshot_of_a_zip_of_the_same_files(tmp_path):
    """The portal reads both (runners.projects, as POST /api/projects/ does): the same digest."""
    import io
    import zipfile

    from cli import pack
    from runners import projects

    limits = projects.Limits(archive_bytes=1 << 20, expanded_bytes=1 << 20, files=100)
    root = make_tree(tmp_path / "my-project", FOLDER)
    selection = pack.select(root)
    packed = io.BytesIO()
    pack.write_tar_gz(selection, packed)
    zipped = io.BytesIO()
    with zipfile.ZipFile(zipped, "w") as archive:
        for file in selection.files:
            archive.write(root / file.path, file.path)             # as a file manager zips: modes kept
    from_folder = projects.read_archive(packed.getvalue(), limits)
    assert [f.path for f in from_folder] == sorted(selection.paths())
    assert projects.digest(from_folder) == projects.digest(projects.read_archive(zipped.getvalue(), limits))
    assert [f.path for f in from_folder if f.executable] == ["run.sh"]

    # A folder whose files all lie in one subfolder keeps it: the archive's own top folder is the one taken off.
    nested = make_tree(tmp_path / "nested", {"src/train.py": "print(1)\n", "src/util.py": ""})
    packed = io.BytesIO()
    pack.write_tar_gz(pack.select(nested), packed)
    assert [f.path for f in projects.read_archive(packed.getvalue(), limits)] == ["src/train.py", "src/util.py"]


@pytest.mark.parametrize("entry, says", [
    (None, "is a folder: name the .py file the job starts with --entry"),
    ("missing.py", "--entry missing.py: {root} has no file missing.py"),
    ("datautils", "--entry datautils: the entry point must be a .py file"),
    ("../train.py", "--entry ../train.py: give a path inside the folder"),
    ("/train.py", "--entry /train.py: give a path inside the folder"),
    ("data/prep.py", "--entry data/prep.py: data/ is left out by .gitignore"),
    ("src/secret.py", "--entry src/secret.py: src/secret.py is left out by src/.gitignore"),
])
def test_a_folder_needs_an_entry_point_among_the_files_sent(entry, says, home, monkeypatch, capsys, closed_port):
    monkeypatch.setenv("RINGMASTER_TOKEN", TOKEN)
    monkeypatch.setenv("RINGMASTER_URL", f"http://127.0.0.1:{closed_port}")   # refused before any request
    root = make_tree(home / "proj", {"train.py": "", ".gitignore": "data/\n", "data/prep.py": "",
                                     "src/.gitignore": "secret.py\n", "src/secret.py": ""})
    argv = ["submit", "--image", "i", "--gpus", "1", str(root)] + (["--entry", entry] if entry else [])
    assert cli.main(argv) == 2
    err = capsys.readouterr().err
    assert says.format(root=root) in err and "cannot reach" not in err, err


def test_entry_goes_only_with_a_folder_and_an_empty_one_is_refused(home, monkeypatch, capsys, closed_port):
    monkeypatch.setenv("RINGMASTER_TOKEN", TOKEN)
    monkeypatch.setenv("RINGMASTER_URL", f"http://127.0.0.1:{closed_port}")
    script = make_tree(home, {"t.py": ""}) / "t.py"
    assert cli.main(["submit", "--image", "i", "--gpus", "1", str(script), "--entry", "t.py"]) == 2
    assert "--entry goes with a folder" in capsys.readouterr().err
    args = cli.parse_args(["submit", "--image", "i", "--gpus", "1", "./proj", "--entry", "train.py",
                           "--", "--lr", "0.1"])
    assert (args.script, args.entry, args.script_args) == ("./proj", "train.py", ["--lr", "0.1"])
    ignored = make_tree(home / "all-ignored", {".gitignore": "*\n", "train.py": ""})
    assert cli.main(["submit", "--image", "i", "--gpus", "1", str(ignored), "--entry", "train.py"]) == 2
    assert "train.py is left out by .gitignore" in capsys.readouterr().err


def test_the_summary_of_what_is_left_out_stays_short():
    from pathlib import Path

    from cli import pack

    selection = pack.Selection(root=Path("."), left_out=[
        pack.LeftOut(f"f{i:02}.pyc", "by .gitignore", 1, 2_000_000) for i in range(25)])
    lines = pack.summary(selection)
    assert len(lines) == pack.SUMMARY_LINES + 1 and lines[0] == "left out: f00.pyc (1 file, 2.0 MB) by .gitignore"
    assert lines[-1] == "left out: 5 more (5 files, 10.0 MB)"
    assert [pack.human_size(n) for n in (0, 999, 34_500, 2_100_000_000)] == ["0 B", "999 B", "34.5 kB", "2.1 GB"]


class ProjectPortal:
    """A client of a portal that takes projects (as project 5) or refuses them as the portal does
    past its limits, and takes jobs (as job 9); it keeps what was sent."""

    def __init__(self, refuse=None):
        self.refuse, self.sent = refuse, {}

    def request(self, method, path, **kwargs):
        if path == "/api/projects/":
            self.sent[path] = kwargs["files"]["file"][1].read()
            if self.refuse:
                raise cli.FieldErrors({"file": [self.refuse]})
            return {"id": 5, "sha256": "ab" * 32, "files": 2, "size": 9}
        self.sent[path] = kwargs["json"]
        return {"id": 9, "state": "QUEUED", "url": "http://portal/jobs/9/"}


def test_submit_of_a_folder_uploads_it_then_the_job_names_the_project_and_its_entry(tmp_path, capsys):
    root = make_tree(tmp_path / "proj", {"train.py": "import util\n", "util.py": "", ".gitignore": "*.ckpt\n",
                                         "last.ckpt": "x" * 2000})
    portal = ProjectPortal()
    args = cli.parse_args(["submit", "--image", "i", "--gpus", "2", str(root), "--entry", "train.py",
                           "--", "--lr", "1"])
    assert cli.cmd_submit(portal, args) == 0
    assert portal.sent["/api/projects/"][:2] == b"\x1f\x8b"                         # a .tar.gz
    assert portal.sent["/api/jobs/"] == {"image": "i", "gpus": 2, "args": ["--lr", "1"], "project": 5,
                                         "entry_point": "train.py"}
    out, err = capsys.readouterr()
    assert out == "job 9 submitted (QUEUED): http://portal/jobs/9/\n"
    left, sending, project = err.splitlines()
    assert left == "ringmaster: left out: last.ckpt (1 file, 2.0 kB) by .gitignore"
    assert re.fullmatch(rf"ringmaster: sending 3 files, 19 B \(packed: \d+ B\) from {re.escape(str(root))}", sending)
    assert project == f"ringmaster: project 5: sha256 {'ab' * 32}"

    refused = ProjectPortal(refuse="The archive holds more than 5,000 files.")
    with pytest.raises(cli.CliError) as error:
        cli.cmd_submit(refused, args)
    assert error.value.code == 2 and "/api/jobs/" not in refused.sent
    assert str(error.value) == "the portal refused the packed folder: The archive holds more than 5,000 files."


def test_submit_sends_a_recovery_policy(capsys):
    portal = ProjectPortal()
    args = cli.parse_args(["submit", "--image", "i", "--gpus", "1", "--script-path", "/opt/train.py",
                           "--checkpoint-pattern", "*.pt", "--max-restarts", "3", "--restart-on-exit-code", "137",
                           "--restart-on-exit-code", "139", "--restart-on", "oom", "-q"])
    assert cli.cmd_submit(portal, args) == 0
    assert portal.sent["/api/jobs/"] == {"image": "i", "gpus": 1, "args": [], "script_path": "/opt/train.py",
                                         "checkpoint_pattern": "*.pt", "max_restarts": 3,
                                         "restart_on_exit_codes": [137, 139], "restart_on": ["oom"]}
