"""schemathesis against the portal's own OpenAPI schema (/api/schema/), in-process, over a
database that already holds jobs in each state with their log lines, metric points and system
samples (with no rows, a paging bug has nothing to LIMIT and hides).

tests/test_api_fuzz.py runs it on the test database (PostgreSQL), and on the embedded portal as
`make run` configures it (SQLite in a folder, every other setting its default) by running this
module in a process of its own: `python -m tests.api_fuzzing DATA_DIR EXAMPLES`, which writes the
failures it finds to DATA_DIR/failures.json. That process imports this module before Django is
set up: what needs Django's settings is imported inside the functions that use it.
"""
import json
import os
import sys
from pathlib import Path

import schemathesis
from hypothesis import HealthCheck, given, settings
from schemathesis.core.failures import Failure, FailureGroup
from schemathesis.core.parameters import ParameterLocation
from schemathesis.generation import GenerationMode
from schemathesis.specs.openapi.checks import (
    content_type_conformance, response_schema_conformance, status_code_conformance)

CHECKS = [status_code_conformance, content_type_conformance, response_schema_conformance]
FAILURES_FILE = "failures.json"
SCHEMA_PATH = "/api/schema/"
# The seeded jobs by id: small ids, which generated path parameters often name.
JOB_STATES = {1: "QUEUED", 2: "RUNNING", 3: "SUCCEEDED", 4: "FAILED"}
RUNNING_JOB = 2


def seed(owner, image):
    """JOB_STATES's jobs, of `owner`; those that started with output stored the way a follower
    stores it, and system samples."""
    from django.core.management.color import no_style
    from django.db import connection
    from django.utils import timezone

    from jobs.models import Job, JobEvent, State, SystemSample

    now = timezone.now()
    for pk, state in JOB_STATES.items():
        ended = state in (State.SUCCEEDED, State.FAILED)
        job = Job.objects.create(
            pk=pk, owner=owner, image=image, gpus=2, script_path="train.py", time_limit_minutes=5, state=state,
            started_at=None if state == State.QUEUED else now, finished_at=now if ended else None,
            exit_code={State.SUCCEEDED: 0, State.FAILED: 1}.get(state),
            failed_rank=1 if state == State.FAILED else None)
        JobEvent.objects.create(job=job, state=state, message=f"now {state}", gpus=2)
        if state != State.QUEUED:
            _store_output(job)
            SystemSample.objects.bulk_create(
                SystemSample(job=job, ts=now, host="localhost", device=f"gpu{index}", utilization=50.0 + index,
                             memory_used=1024.0, memory_total=81920.0, power=100.0) for index in range(2))
    with connection.cursor() as cursor:            # ids the database gives from here on follow these
        for statement in connection.ops.sequence_reset_sql(no_style(), [Job]):
            cursor.execute(statement)


def _store_output(job):
    """Two ranks' lines, a launcher line and metric lines, as horovodrun prints them."""
    from jobs.domain.logstore import append_output
    from runners.output import OutputSplitter

    splitter = OutputSplitter()
    output = b"Launching 2 ranks\n" + b"".join(
        f"[{rank}]<stdout>:step {step} loss {1 / (step + 1):.3f}\n"
        f'[{rank}]<stdout>:RINGMASTER_METRIC {{"step": {step}, "loss": {1 / (step + 1):.3f}}}\n'
        f"[{rank}]<stderr>:warning {step}\n".encode() for step in range(20) for rank in (0, 1))
    assert append_output(job.pk, splitter.feed(output) + splitter.finish(), 0, len(output), splitter.state())


def fuzz(app, headers, examples, job_id):
    """Requests to every operation of the WSGI `app`: schemathesis's coverage phase (each
    parameter's and body field's boundaries, one past them, wrong types, other methods), then up
    to `examples` generated ones per operation. Returns the failures: a server error, or an
    answer the schema does not describe (its status code, content type or body)."""
    schema = _schema(app)
    operations = [result.ok() for result in schema.get_all_operations()]
    assert len(operations) >= 9, [f"{o.method} {o.path}" for o in operations]
    failures = []
    for operation in operations:
        for case in _coverage_cases(schema, operation, job_id):
            _check(case, headers, failures)
        for mode, count in _modes(operation, examples):
            @settings(max_examples=count, deadline=None, derandomize=True, database=None,
                      suppress_health_check=list(HealthCheck))
            @given(case=operation.as_strategy(generation_mode=mode))
            def call(case):
                _check(case, headers, failures)
            call()
    return failures


def _schema(app):
    """The portal's OpenAPI schema, served by `app`, with every integer of no stated width read
    as 64 bits: the widest the portal takes anywhere, so the coverage phase sends one past it
    (2**63) to each integer parameter and field, documented bounds or not."""
    from werkzeug.test import Client

    raw = json.loads(Client(app).get(SCHEMA_PATH, query_string={"format": "json"}).get_data())
    _widen_integers(raw)
    schema = schemathesis.openapi.from_dict(raw)
    schema.app, schema.location = app, SCHEMA_PATH     # as schemathesis.openapi.from_wsgi sets them
    return schema


def _widen_integers(node):
    """Give every integer schema in `node` without a format the format int64, in place."""
    stack = [node]
    while stack:
        item = stack.pop()
        if isinstance(item, dict):
            if item.get("type") == "integer" and "format" not in item:
                item["format"] = "int64"
            stack.extend(item.values())
        elif isinstance(item, list):
            stack.extend(item)


def _check(case, headers, failures):
    """Send `case`; note it in `failures` if it gets a server error or an answer the schema
    does not describe."""
    response = case.call(headers=headers)
    if response.status_code >= 500:
        failures.append([case.method, case.path, case.path_parameters, case.query, repr(case.body),
                         response.status_code, response.text[:300]])
        return
    try:
        case.validate_response(response, checks=CHECKS)
    except (Failure, FailureGroup) as found:
        failures.append([case.method, case.path, response.status_code, str(found)[:300]])


def _coverage_cases(schema, operation, job_id):
    """schemathesis's coverage phase of `operation`: one parameter or field at a time at a
    boundary, past it or of a wrong type, the others valid. Bodies in the operation's first media
    type only (JSON, where it takes JSON): the same fields in a form differ only in their
    encoding, which the generated requests vary. A case that varies anything but the path names
    job `job_id`, so that its query reaches the view behind the job's lookup (the phase's own
    path value names no job: every such request would be a 404)."""
    media_types = [alternative.media_type for alternative in operation.body]
    for case in schema.iter_coverage_cases(operation, generation_modes=list(GenerationMode),
                                           generation_config=schema.config.generation_for(operation=operation)):
        if media_types and case.media_type not in (None, media_types[0]):
            continue
        if case.path_parameters and case.meta.phase.data.parameter_location != ParameterLocation.PATH:
            case.path_parameters = {name: str(job_id) for name in case.path_parameters}
        yield case


def _modes(operation, examples):
    """[(generation mode, examples)] for `operation`: half its generated requests within the
    schema, half outside it (schemathesis's negative mode: a wrong type, a number past the
    schema's bounds, a missing field). Nothing for an operation that takes no input (no path or
    query parameter, no body): the coverage phase has sent its one request."""
    if not (operation.path_parameters or operation.query or operation.body):
        return []
    return [(GenerationMode.POSITIVE, examples - examples // 2), (GenerationMode.NEGATIVE, examples // 2)]


def main(data_dir, examples):
    """The embedded portal's database in `data_dir`: migrated, seeded, fuzzed."""
    import django

    django.setup()
    from django.contrib.auth import get_user_model
    from django.core.management import call_command
    from django.core.wsgi import get_wsgi_application
    from jobs.domain import tokens

    from jobs.models import Image

    call_command("migrate", verbosity=0)
    alice = get_user_model().objects.create_user("alice", password="pw-alice")
    seed(alice, Image.objects.create(name="horovod-cpu", python=sys.executable, description="fuzz image"))
    headers = {"Authorization": f"Token {tokens.issue(alice).key}"}
    failures = fuzz(get_wsgi_application(), headers, examples, job_id=RUNNING_JOB)
    (Path(data_dir) / FAILURES_FILE).write_text(json.dumps(failures, default=str))


if __name__ == "__main__":
    # Seeding writes jobs 1 to 4: only ever into the embedded database of the folder named.
    if os.environ.get("RINGMASTER_DATA_DIR") != sys.argv[1] or "DATABASE_URL" in os.environ:
        sys.exit("usage: RINGMASTER_DATA_DIR=DIR python -m tests.api_fuzzing DIR EXAMPLES, without DATABASE_URL")
    main(sys.argv[1], int(sys.argv[2]))
