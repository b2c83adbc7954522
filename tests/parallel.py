"""A pytest plugin, loaded before Django's settings (`-p tests.parallel` in pyproject.toml): each
pytest-xdist worker gets a Redis database of its own.

pytest-django gives each xdist worker a test database of its own (test_ringmaster_gw0, ...).
Celery's queues and the portal's keys live in a Redis database number, so worker gwN takes
REDIS_URL's number minus N: with `make test`'s 15, gw0 takes 15, gw1 14, and so on. Pub/sub
channels span every number of a server; the portal names them with its installation id, which
differs between test databases.
"""
import os
import re

_worker = os.environ.get("PYTEST_XDIST_WORKER", "")
_url = os.environ.get("REDIS_URL", "")
if _worker.startswith("gw") and _url:
    _index = int(_worker[2:])
    _match = re.fullmatch(r"(redis://[^/]*)(?:/(\d+))?", _url)
    if _match is None:
        raise RuntimeError(f"tests.parallel: cannot give each worker a database of REDIS_URL={_url!r}")
    _number = int(_match.group(2) or 0) - _index
    if _number < 0:
        raise RuntimeError(f"tests.parallel: REDIS_URL's database number is too low for xdist worker {_worker}")
    os.environ["REDIS_URL"] = f"{_match.group(1)}/{_number}"
