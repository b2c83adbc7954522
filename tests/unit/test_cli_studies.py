"""`ringmaster study` without a portal: the file it sends, what it prints, a stranger's study."""
import pytest

from cli import main as cli

STUDY = {"id": 3, "name": "lr sweep", "state": "DONE", "reason": "2 trials run",
         "best": {"number": 1, "params": {"lr": 0.01}, "value": 0.25, "job": 12},
         "trials": [{"number": 0, "params": {"lr": 0.1}, "state": "FAIL", "value": None, "job": 11,
                     "retry_of": None, "reason": "its job failed: exit 1"},
                    {"number": 1, "params": {"lr": 0.01}, "state": "COMPLETE", "value": 0.25, "job": 12,
                     "retry_of": None, "reason": ""}]}


class Portal:
    """A client of a portal holding study 3 only; the requests sent."""

    def __init__(self):
        self.sent = []

    def request(self, method, path, **kwargs):
        self.sent.append((method, path, kwargs.get("json")))
        if path not in ("/api/studies/", "/api/studies/3/", "/api/studies/3/stop/"):
            raise cli.NotFound("not found")
        return [STUDY] if (method, path) == ("GET", "/api/studies/") else STUDY


def run(portal, *argv):
    args = cli.parse_args(["study", *argv])
    return cli.COMMANDS[args.command](portal, args)


def test_create_sends_the_yaml_file_as_the_study_and_prints_its_id(tmp_path, capsys):
    path = tmp_path / "study.yaml"
    path.write_text("name: lr sweep\nbase:\n  image: horovod-cpu\n  gpus: 1\n  script: 4\n  args: [--lr, '{lr}']\n"
                    "space:\n  lr: {type: float, low: 0.001, high: 0.1, log: true}\n"
                    "objective: {metric: loss, direction: minimize}\ntrials: 8\nparallel: 2\n")
    portal = Portal()
    assert run(portal, "create", "-f", str(path)) == 0
    method, url, sent = portal.sent[-1]
    assert (method, url) == ("POST", "/api/studies/")
    assert sent["base"]["args"] == ["--lr", "{lr}"] and sent["space"]["lr"]["log"] is True and sent["trials"] == 8
    assert capsys.readouterr().out == "3\n"


def test_show_prints_the_best_trial_and_every_trial(capsys):
    assert run(Portal(), "show", "3") == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0] == "study 3 lr sweep: DONE (2 trials run)"
    assert out[1] == 'best: trial 1, 0.25, job 12, {"lr": 0.01}'
    assert out[2] == '  #0  FAIL  -  job 11  {"lr": 0.1}  its job failed: exit 1'


def test_a_study_that_is_not_yours_and_a_file_that_is_not_a_study_are_errors(tmp_path):
    with pytest.raises(cli.NotFound, match="study 9 not found"):
        run(Portal(), "show", "9")
    path = tmp_path / "study.yaml"
    path.write_text("- just a list\n")
    with pytest.raises(cli.CliError, match="a study is a mapping"):
        run(Portal(), "create", "-f", str(path))
