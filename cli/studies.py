"""`ringmaster study`: hyperparameter searches through /api/studies/ (create from a YAML or JSON
file, show, ls, stop)."""
import json
import sys


def add_command(commands):
    """The `study` command and its subcommands, on the parser's `commands`."""
    parser = commands.add_parser("study", help="hyperparameter searches whose trials are jobs",
                                 description="Studies: a base job run with the values Optuna picks for its "
                                             "{name} placeholders (README, Studies). With no subcommand: ls.")
    sub = parser.add_subparsers(dest="action", metavar="ACTION")
    create = sub.add_parser("create", help="start a study from a file; prints its id")
    create.add_argument("-f", "--file", required=True,
                        help='the study as POST /api/studies/ takes it, in YAML or JSON ("-": standard input)')
    sub.add_parser("ls", help="your studies, newest first")
    for action, what in (("show", "a study's state, best trial and trials"), ("stop", "stop a study")):
        sub.add_parser(action, help=what).add_argument("study_id", type=int)


def run(client, args):
    return {None: _list, "ls": _list, "create": _create, "show": _show, "stop": _stop}[args.action](client, args)


def read_study(path):
    """The study in a YAML (or JSON, which YAML reads too) file."""
    from cli.main import CliError

    import yaml

    try:
        text = sys.stdin.read() if path == "-" else open(path, encoding="utf-8").read()
    except OSError as exc:
        raise CliError(f"cannot read {path}: {exc.strerror}", code=2) from None
    try:
        study = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise CliError(f"{path} is not YAML or JSON: {exc}", code=2) from None
    if not isinstance(study, dict):
        raise CliError(f"{path}: a study is a mapping (name, base, space, objective, trials, ...)", code=2)
    return study


def _create(client, args):
    study = client.request("POST", "/api/studies/", json=read_study(args.file), expect=(201,))
    print(study["id"])
    return 0


def _list(client, args):
    for study in client.request("GET", "/api/studies/"):
        best = study["best"]
        shown = f"best {best['value']:g} (trial {best['number']})" if best else "no trial completed"
        print(f"{study['id']}  {study['name']}  {study['state']}  {shown}")
    return 0


def _print_study(study):
    best = study["best"]
    print(f"study {study['id']} {study['name']}: {study['state']}" + (f" ({study['reason']})" if study["reason"] else ""))
    if best:
        print(f"best: trial {best['number']}, {best['value']:g}, job {best['job']}, "
              f"{json.dumps(best['params'], sort_keys=True)}")
    for trial in study["trials"]:
        value = "-" if trial["value"] is None else f"{trial['value']:g}"
        print(f"  #{trial['number']}  {trial['state']}  {value}  job {trial['job']}  "
              f"{json.dumps(trial['params'], sort_keys=True)}" + (f"  {trial['reason']}" if trial["reason"] else ""))


def _show(client, args):
    from cli.main import NotFound

    try:
        _print_study(client.request("GET", f"/api/studies/{args.study_id}/"))
    except NotFound:
        raise NotFound(f"study {args.study_id} not found") from None
    return 0


def _stop(client, args):
    from cli.main import NotFound

    try:
        _print_study(client.request("POST", f"/api/studies/{args.study_id}/stop/"))
    except NotFound:
        raise NotFound(f"study {args.study_id} not found") from None
    return 0
