"""API tokens expire and may be read-only (issue 59): `create_api_token <user> [--expires-days N]
[--read-only]`; a token lives RINGMASTER_API_TOKEN_DAYS (90) days unless made otherwise; an
expired one, a revoked one and one of a deactivated user get 401 at once; a read-only one reads
(GET) and gets 403 on anything else, whatever the view."""
import importlib
import io
from datetime import timedelta

import pytest
from django.apps import apps
from django.core.management import CommandError, call_command
from django.utils import timezone
from rest_framework.test import APIClient

from jobs.models import ApiToken

pytestmark = pytest.mark.django_db


def create_token(*args):
    out = io.StringIO()
    call_command("create_api_token", *args, stdout=out)
    return out.getvalue().strip()


def api(key):
    client = APIClient(REMOTE_ADDR="198.51.100.59")     # an address of this module's own (throttling)
    client.credentials(HTTP_AUTHORIZATION=f"Token {key}")
    return client


def test_a_token_lives_the_sites_lifetime_unless_made_with_another(make_user, settings):
    settings.RINGMASTER_API_TOKEN_DAYS = 90
    alice = make_user("alice")
    create_token("alice")
    expires = ApiToken.objects.get(user=alice).expires
    assert abs(expires - (timezone.now() + timedelta(days=90))) < timedelta(minutes=1)
    create_token("alice", "--expires-days", "7")
    assert abs(ApiToken.objects.get(user=alice).expires - (timezone.now() + timedelta(days=7))) < timedelta(minutes=1)
    create_token("alice", "--expires-days", "0")
    assert ApiToken.objects.get(user=alice).expires is None
    with pytest.raises(CommandError, match="--expires-days"):
        create_token("alice", "--expires-days", "-1")


def test_an_expired_token_and_a_deactivated_users_token_get_401(make_user):
    alice = make_user("alice")
    key = create_token("alice", "--expires-days", "1")
    assert api(key).get("/api/jobs/").status_code == 200
    ApiToken.objects.filter(user=alice).update(expires=timezone.now() - timedelta(seconds=1))
    assert api(key).get("/api/jobs/").status_code == 401

    key = create_token("alice")
    alice.is_active = False
    alice.save()
    assert api(key).get("/api/jobs/").status_code == 401
    alice.is_active = True
    alice.save()
    assert api(key).get("/api/jobs/").status_code == 200


def test_a_read_only_token_reads_and_gets_403_on_anything_else(make_user, image):
    make_user("alice")
    key = create_token("alice", "--read-only")
    reader = api(key)
    assert reader.get("/api/jobs/").status_code == 200
    assert reader.get("/api/images/").status_code == 200
    submit = reader.post("/api/jobs/", {"image": image.name, "gpus": 1, "script_path": "/x.py"}, format="json")
    assert submit.status_code == 403 and "read-only" in submit.json()["detail"]
    assert reader.post("/api/scripts/", {}).status_code == 403
    assert reader.delete("/api/jobs/1/").status_code == 403
    writer = api(create_token("alice"))                           # a full token of the same user writes
    assert writer.post("/api/scripts/", {}).status_code == 400


def test_tokens_made_before_expire_a_lifetime_after_the_upgrade(make_user, settings):
    settings.RINGMASTER_API_TOKEN_DAYS = 30
    key = create_token("alice") if make_user("alice") else None
    ApiToken.objects.update(expires=None)
    importlib.import_module("jobs.migrations.0029_api_token_expiry").expire_in_a_lifetime(apps, None)
    expires = ApiToken.objects.get().expires
    assert abs(expires - (timezone.now() + timedelta(days=30))) < timedelta(minutes=1)
    assert api(key).get("/api/jobs/").status_code == 200


def test_the_settings_page_makes_a_read_only_token_and_says_when_it_expires(client, make_user):
    alice = make_user("alice")
    client.force_login(alice)
    page = client.post("/settings/", {"action": "create-token", "read_only": "1"}).content.decode()
    token = ApiToken.objects.get(user=alice)
    assert token.read_only and token.expires is not None
    assert "You have a read-only token" in page and "It expires" in page
    client.post("/settings/", {"action": "create-token"})
    assert not ApiToken.objects.get(user=alice).read_only
