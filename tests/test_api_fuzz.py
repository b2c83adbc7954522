"""schemathesis against the portal's own OpenAPI schema (/api/schema/), in-process: a bounded
number of generated requests per operation, as a logged-in user with a token. No request may get
a server error, and every answer must be what the schema says: a documented status code, content
type and body."""
import pytest
import schemathesis
from hypothesis import HealthCheck, given, settings

pytestmark = pytest.mark.django_db
EXAMPLES = 100         # per operation: about 1,000 requests in all


def test_generated_requests_to_every_operation_never_get_a_server_error(make_user, image):
    from django.core import signals
    from django.core.wsgi import get_wsgi_application
    from django.db import close_old_connections
    from rest_framework.authtoken.models import Token

    from jobs.models import Job

    alice = make_user("alice")
    headers = {"Authorization": f"Token {Token.objects.create(user=alice).key}"}
    Job.objects.create(pk=1, owner=alice, image=image, gpus=1, script_path="t.py", time_limit_minutes=5)
    # As Django's test client does: the test's transaction holds the data, so requests must not
    # close the connection when they end.
    signals.request_started.disconnect(close_old_connections)
    signals.request_finished.disconnect(close_old_connections)
    try:
        _fuzz(get_wsgi_application(), headers)
    finally:
        signals.request_started.connect(close_old_connections)
        signals.request_finished.connect(close_old_connections)


def _fuzz(app, headers):
    from schemathesis.specs.openapi.checks import (
        content_type_conformance, response_schema_conformance, status_code_conformance)

    checks = [status_code_conformance, content_type_conformance, response_schema_conformance]
    schema = schemathesis.openapi.from_wsgi("/api/schema/", app)
    operations = [result.ok() for result in schema.get_all_operations()]
    assert len(operations) >= 9, [f"{o.method} {o.path}" for o in operations]
    failures = []
    for operation in operations:
        @settings(max_examples=EXAMPLES, deadline=None, derandomize=True, database=None,
                  suppress_health_check=list(HealthCheck))
        @given(case=operation.as_strategy())
        def call(case):
            response = case.call(headers=headers)
            if response.status_code >= 500:
                failures.append((case.method, case.path, case.path_parameters, case.query, case.body,
                                 response.status_code))
                return
            try:                          # the answer is what the schema says it is
                case.validate_response(response, checks=checks)
            except Exception as exc:      # schemathesis raises a group of failures
                failures.append((case.method, case.path, response.status_code, str(exc)[:300]))
        call()
    assert failures == []
