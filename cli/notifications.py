"""`ringmaster notifications ...`: your notification preferences and targets, through
/api/notifications/ (the Settings page's rules: the portal checks every change).

An address is read from standard input when given as "-", so that it stays out of the shell's
history and the process list; the portal answers with addresses masked."""
import argparse
import sys

PREFERENCE_SWITCHES = {"on_end": "a job ends", "on_wait": "a job waits long", "on_idle": "a job's GPUs sit idle"}
KINDS = ("email", "apprise", "webhook")


def add_command(commands, positive):
    """The `notifications` command and its subcommands, on the parser's `commands`."""
    parser = commands.add_parser("notifications", help="your notification preferences and targets",
                                 description="Where notifications of your jobs go and which events send them "
                                             "(as on the portal's Settings page). With no subcommand: list.")
    sub = parser.add_subparsers(dest="action", metavar="ACTION")
    sub.add_parser("ls", help="the preferences, and the targets (addresses masked)")
    change = sub.add_parser("set", help="change the preferences named")
    for name, what in PREFERENCE_SWITCHES.items():
        change.add_argument(f"--{name.replace('_', '-')}", dest=name, action=argparse.BooleanOptionalAction,
                            help=f"notify when {what}")
    change.add_argument("--wait-minutes", type=positive, metavar="MIN", help="how long a wait is long")
    change.add_argument("--idle-minutes", type=positive, metavar="MIN", help="how long GPUs sit idle first")
    add = sub.add_parser("add", help="add a target; prints its id (and a webhook secret the portal made, once)")
    add.add_argument("--kind", choices=KINDS, required=True)
    add.add_argument("--name", help="what you call it")
    add.add_argument("address", help='an e-mail address, an Apprise URL or a webhook URL; "-": read it from '
                                     "standard input")
    for action, what in (("remove", "remove a target"), ("test", "send a test message now; exit 1 if it was "
                                                                  "not delivered")):
        sub.add_parser(action, help=what).add_argument("target_id", type=int)
    log = sub.add_parser("log", help="a target's deliveries, newest first")
    log.add_argument("target_id", type=int)
    log.add_argument("--limit", type=positive, default=50, help="at most this many (default 50)")


def run(client, args):
    return {None: _list, "ls": _list, "set": _set, "add": _add, "remove": _remove, "test": _test,
            "log": _log}[args.action](client, args)


def _print_preferences(prefs):
    on = [what for name, what in PREFERENCE_SWITCHES.items() if prefs[name]]
    print(f"notify when: {', '.join(on) or 'never'} (long wait: {prefs['wait_minutes']} min, "
          f"idle: {prefs['idle_minutes']} min)")


def _list(client, args):
    answer = client.request("GET", "/api/notifications/")
    _print_preferences(answer["preferences"])
    for target in answer["targets"]:
        last = target["last_delivery"]
        print("\t".join([str(target["id"]), target["kind"], target["name"] or "-", target["address"],
                         f"last: {last['status']}" if last else "nothing sent"]))
    return 0


def _set(client, args):
    body = {name: getattr(args, name) for name in (*PREFERENCE_SWITCHES, "wait_minutes", "idle_minutes")
            if getattr(args, name) is not None}
    _print_preferences(client.request("PATCH", "/api/notifications/", json=body)["preferences"])
    return 0


def _add(client, args):
    address = sys.stdin.read().strip() if args.address == "-" else args.address
    body = {"kind": args.kind, "address": address, **({"name": args.name} if args.name else {})}
    target = client.request("POST", "/api/notifications/targets/", expect=(201,), json=body)
    print(f"target {target['id']}: {target['kind']} {target['address']}")
    if target.get("secret"):
        print(f"webhook secret (shown only now): {target['secret']}")
    return 0


def _missing(args):
    return f"notification target {args.target_id} not found"


def _remove(client, args):
    client.request("DELETE", f"/api/notifications/targets/{args.target_id}/", expect=(204,), missing=_missing(args))
    print(f"target {args.target_id} removed")
    return 0


def _test(client, args):
    delivery = client.request("POST", f"/api/notifications/targets/{args.target_id}/test/", missing=_missing(args))
    if delivery["status"] == "delivered":
        print(f"test message delivered to target {args.target_id}")
        return 0
    print(f"test message to target {args.target_id} not delivered: {delivery['detail']}", file=sys.stderr)
    return 1


def _log(client, args):
    page = client.request("GET", f"/api/notifications/targets/{args.target_id}/deliveries/",
                          params={"limit": args.limit}, missing=_missing(args))
    for delivery in page["results"]:
        print("\t".join([delivery["created_at"], delivery["event"], str(delivery["job"] or "-"), delivery["status"],
                         str(delivery["attempts"]), delivery["detail"]]))
    return 0
