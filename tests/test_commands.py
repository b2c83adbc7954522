import io

import pytest
from django.core.management import CommandError, call_command
from rest_framework.test import APIClient

from jobs.models import Image, Script

pytestmark = pytest.mark.django_db


def run(*args):
    out = io.StringIO()
    call_command(*args, stdout=out)
    return out.getvalue()


def test_create_api_token_prints_a_key_that_works_and_replaces_the_old_one(make_user):
    make_user("alice")
    first = run("create_api_token", "alice").strip()
    second = run("create_api_token", "alice").strip()
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Token {second}")
    assert client.get("/api/jobs/").status_code == 200
    client.credentials(HTTP_AUTHORIZATION=f"Token {first}")
    assert client.get("/api/jobs/").status_code == 401


def test_create_api_token_for_an_unknown_user_fails_clearly():
    with pytest.raises(CommandError, match="no user 'ghost'"):
        run("create_api_token", "ghost")


def test_seed_demo_is_idempotent_and_keeps_the_password_in_a_private_file_never_in_its_output(
        django_user_model, settings, tmp_path):
    settings.DATA_DIR = tmp_path                                        # not the checkout's var/
    out = run("seed_demo")
    kept = settings.DATA_DIR / "initial_admin_password"                # for make run's banner, 0600
    username, password = kept.read_text().split()
    assert username == "admin" and kept.stat().st_mode & 0o077 == 0
    assert django_user_model.objects.get(username="admin").check_password(password)
    assert password not in out and f"its password is in {kept} (readable by this account only)" in out
    assert "Created admin" not in run("seed_demo")
    assert Image.objects.filter(name="horovod-cpu", enabled=True).count() == 1
    names = set(Script.objects.filter(owner=None).values_list("name", flat=True))
    assert {"hello_allreduce.py", "synthetic_benchmark.py"} <= names
    assert Script.objects.count() == len(names)
