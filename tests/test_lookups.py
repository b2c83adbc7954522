"""`field__anyof`: the rows `__in` names, with one array parameter on PostgreSQL (the heartbeat's
and the group writer's lists of every followed job), on PostgreSQL and on the embedded SQLite."""
import json

import pytest
from django.contrib.auth.models import User
from django.db import connection, transaction
from django.test.utils import CaptureQueriesContext

from tests.test_embedded_secrets import manage

QUERIES = """
import json
from django.contrib.auth.models import User
users = [User.objects.create(username=name) for name in ("ann", "bob", "cy")]
ids = [users[0].pk, users[2].pk, 10**9]
print(json.dumps([sorted(User.objects.filter(pk__anyof=ids).values_list("username", flat=True)),
                  sorted(User.objects.filter(username__anyof=["bob", "cy", "zed"]).values_list("pk", flat=True))
                  == sorted([users[1].pk, users[2].pk]),
                  User.objects.filter(pk__anyof=[]).count()]))
"""


@pytest.mark.django_db
def test_anyof_names_what_in_names_with_one_parameter_on_postgresql():
    users = [User.objects.create(username=name) for name in ("ann", "bob", "cy")]
    ids = [users[0].pk, users[2].pk, 10**9]
    with CaptureQueriesContext(connection) as queries:
        named = sorted(User.objects.filter(pk__anyof=ids).values_list("username", flat=True))
    assert named == sorted(User.objects.filter(pk__in=ids).values_list("username", flat=True)) == ["ann", "cy"]
    assert "= ANY(" in queries[0]["sql"] and " IN (" not in queries[0]["sql"]
    assert sorted(User.objects.filter(username__anyof=["bob", "cy", "zed"]).values_list("pk", flat=True)) == \
        sorted([users[1].pk, users[2].pk])
    assert User.objects.filter(pk__anyof=[]).count() == 0
    with transaction.atomic():
        assert list(User.objects.select_for_update().filter(pk__anyof=ids).order_by("pk")
                    .values_list("username", flat=True)) == ["ann", "cy"]


def test_anyof_on_the_embedded_sqlite(tmp_path):
    assert manage(tmp_path, "migrate", "-v0").returncode == 0
    result = manage(tmp_path, code=QUERIES)
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout.splitlines()[-1]) == [["ann", "cy"], True, 0]
