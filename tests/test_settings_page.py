"""The settings page (issue 12, item 7): a user makes, regenerates and revokes their own API
token (the key shown once, the old one refused at once), and picks their default group."""
import re

import pytest
from django.contrib.auth.models import Group
from django.test import Client
from rest_framework.test import APIClient

from jobs.domain import tokens
from jobs.models import ApiToken, UserSettings

pytestmark = pytest.mark.django_db


def api_status(key):
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Token {key}")
    return client.get("/api/quota/").status_code


def shown_key(response):
    match = re.search(r'id="new-token-key" value="([0-9a-f]{40})"', response.content.decode())
    return match.group(1) if match else None


def test_the_nav_links_the_settings_page_which_needs_a_login(client, alice):
    assert client.get("/settings/")["Location"].startswith("/login/")
    client.force_login(alice)
    assert '<a href="/settings/">Settings</a>' in client.get("/").content.decode()
    page = client.get("/settings/").content.decode()
    assert "You have no API token." in page and shown_key(client.get("/settings/")) is None


def test_make_use_regenerate_and_revoke_a_token(client, alice, caplog):
    client.force_login(alice)
    made = client.post("/settings/", {"action": "create-token"})
    key = shown_key(made)
    assert made.status_code == 200 and ApiToken.objects.get(user=alice).digest == tokens.digest(key)
    assert "no-store" in made["Cache-Control"]
    assert api_status(key) == 200
    later = client.get("/settings/").content.decode()             # shown once: never again
    assert key not in later and "You have a token, made" in later
    # When, as every time on the portal: in the viewer's zone (time.js), from the ISO moment.
    assert f'made <time datetime="{ApiToken.objects.get(user=alice).created.isoformat()}"' in later

    again = shown_key(client.post("/settings/", {"action": "create-token"}))
    assert again and again != key
    assert api_status(key) == 401 and api_status(again) == 200   # the old one stops at once

    response = client.post("/settings/", {"action": "revoke-token"}, follow=True)
    assert "API token revoked" in response.content.decode() and "You have no API token." in response.content.decode()
    assert api_status(again) == 401 and not ApiToken.objects.filter(user=alice).exists()
    assert key not in caplog.text and again not in caplog.text


def test_the_token_forms_need_csrf_and_touch_only_ones_own_token(alice, make_user):
    bob = make_user("bob")
    bobs = tokens.issue(bob)
    strict = Client(enforce_csrf_checks=True)
    strict.force_login(alice)
    assert strict.post("/settings/", {"action": "create-token"}).status_code == 403
    assert not ApiToken.objects.filter(user=alice).exists()
    client = Client()
    client.force_login(alice)
    client.post("/settings/", {"action": "revoke-token"})
    client.post("/settings/", {"action": "create-token"})
    assert ApiToken.objects.get(user=bob).digest == bobs.digest and api_status(bobs.key) == 200


def test_the_default_group_is_chosen_among_ones_own_groups(client, alice):
    team, alpha, foreign = (Group.objects.create(name=name) for name in ("team", "alpha", "foreign"))
    alice.groups.add(team, alpha)
    client.force_login(alice)
    page = client.get("/settings/").content.decode()
    assert '<option value="%d" selected>alpha</option>' % alpha.pk in page and "foreign" not in page
    client.post("/settings/", {"action": "default-group", "default_group": team.pk})
    assert UserSettings.objects.get(user=alice).default_group == team
    response = client.post("/settings/", {"action": "default-group", "default_group": foreign.pk})
    assert response.status_code == 200 and 'data-field="default_group"' in response.content.decode()
    assert UserSettings.objects.get(user=alice).default_group == team
    assert 'value="team" selected' in client.get("/jobs/new/").content.decode()
