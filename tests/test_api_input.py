"""Input that, unchecked, would reach the database or the encoder and come back as a 500 (what
fuzzing turns up): each is a 400 naming the field, or a 404, on the API and the pages."""
import json

import pytest

from jobs.backends.kubernetes.models import Cluster
from jobs.models import Job
from tests import failing_urls

pytestmark = pytest.mark.django_db


@pytest.fixture
def alice_client(client, make_user, image):
    client.force_login(make_user("alice"))
    return client


@pytest.fixture
def job(alice_client, image):
    from django.contrib.auth import get_user_model

    return Job.objects.create(owner=get_user_model().objects.get(username="alice"), image=image, gpus=1,
                              script_path="t.py", time_limit_minutes=5)


def post(client, body):
    return client.post("/api/jobs/", data=body if isinstance(body, str) else json.dumps(body),
                       content_type="application/json")


GOOD = {"image": "horovod-cpu", "gpus": 1, "script_path": "/x.py"}


@pytest.mark.parametrize(("change", "field"), [
    ({"image": "\x00"}, "image"),
    ({"image": "²"}, "image"),
    ({"image": 99999999999999999999}, "image"),
    ({"image": "9999999999999999999999"}, "image"),
    ({"backend": "kubernetes", "cluster": "²"}, "cluster"),
    ({"backend": "kubernetes", "cluster": "\x00"}, "cluster"),
    ({"script_path": "/x\ud800.py"}, "script_path"),
    ({"name": "\ud800"}, "name"),
    ({"args": ["\udcff"]}, "args"),
    ({"env": {"A": "\udcff"}}, "env"),
    ({"env": {"\x00": "x"}}, "env"),
    ({"group": "\x00"}, "group"),
    ({"gpus": 2 ** 64}, "gpus"),
    ({"time_limit_minutes": 2 ** 63}, "time_limit_minutes"),
    ({"name": 2 ** 63}, "name"),
    ({"env": {"A": -(2 ** 63) - 1}}, "env"),
])
def test_bad_text_and_numbers_in_a_submission_are_400_naming_the_field(alice_client, change, field):
    if "cluster" in change:
        Cluster.objects.create(name="gpu-east", namespace="training", gpus_per_node=8)
    response = post(alice_client, {**GOOD, **change})
    assert response.status_code == 400, response.content
    assert field in response.json(), response.json()
    assert not Job.objects.exists()


def test_json_nested_a_thousand_deep_is_400(alice_client):
    deep = "[" * 1000 + "]" * 1000
    response = post(alice_client, '{"image": "horovod-cpu", "gpus": 1, "script_path": "/x.py", "args": %s}' % deep)
    assert response.status_code == 400
    nested = "x"
    for _ in range(40):                                   # deep enough for the parser's own limit
        nested = [nested]
    response = post(alice_client, {**GOOD, "args": nested})
    assert response.status_code == 400 and "args" in response.json()


@pytest.mark.parametrize(("url", "field"), [
    ("/api/jobs/?state=%00", "state"),
    ("/api/jobs/?state=nope", "state"),
    ("/api/jobs/?limit=9223372036854775808", "limit"),
    ("/api/jobs/?limit=99999999999999999999", "limit"),
    ("/api/jobs/?offset=9223372036854775808", "offset"),
    ("/api/jobs/?limit=0", "limit"),
    ("/api/jobs/?offset=1.5", "offset"),
    ("/api/jobs/{job}/logs/?q=%00", "q"),
    ("/api/jobs/{job}/logs/?limit=9223372036854775808", "limit"),
    ("/api/jobs/{job}/logs/?since=9223372036854775808", "since"),
    ("/api/jobs/{job}/logs/?before=-9223372036854775809", "before"),
    ("/api/jobs/{job}/logs/?since=%C2%B2", "since"),
    ("/api/jobs/{job}/logs/?since=--5", "since"),
    ("/api/jobs/{job}/logs/?rank=99999999999", "rank"),
    ("/api/jobs/{job}/logs/?rank=%C2%B2", "rank"),
])
def test_bad_query_parameters_are_400_naming_the_field(alice_client, job, url, field):
    response = alice_client.get(url.format(job=job.pk))
    assert response.status_code == 400, response.content
    assert field in response.json()


def test_the_largest_64_bit_limit_lists_every_job(alice_client, job):
    page = alice_client.get("/api/jobs/?limit=9223372036854775807").json()
    assert [row["id"] for row in page["results"]] == [job.pk]
    page = alice_client.get("/api/jobs/?limit=9223372036854775807&offset=1").json()
    assert page["count"] == 1 and page["results"] == []


@pytest.mark.parametrize("url", ["/usage/?days=%C2%B2", "/usage.csv?days=%C2%B2"])
def test_a_digit_int_cannot_read_is_a_400_on_the_usage_pages(alice_client, url):
    response = alice_client.get(url)
    assert response.status_code == 400 and b"days" in response.content


def test_staff_usage_export_refuses_a_nul_in_the_user_or_group(client, make_user):
    client.force_login(make_user("root", is_staff=True))
    for url in ("/usage.csv?user=%00", "/usage.csv?group=%00"):
        response = client.get(url)
        assert response.status_code == 400 and b"NUL" in response.content


@pytest.mark.parametrize("url", ["/api/jobs/-1/", "/api/jobs/9223372036854775808/", "/api/jobs/99999999999999999999/",
                                 "/api/jobs/9223372036854775808/logs/", "/api/nowhere/"])
def test_not_found_under_the_api_is_json(alice_client, url):
    """A path naming an id past 64 bits names no job: a 404, as for any job that does not exist."""
    response = alice_client.get(url)
    assert response.status_code == 404
    assert response["Content-Type"] == "application/json" and response.json() == {"detail": "Not found."}


def test_a_page_for_a_number_past_the_id_column_is_a_404(alice_client):
    assert alice_client.get("/jobs/99999999999999999999/").status_code == 404
    assert b"<html" in alice_client.get("/jobs/-1/").content                      # pages stay HTML


def test_a_body_too_large_for_django_is_json_under_the_api(alice_client, settings):
    settings.DATA_UPLOAD_MAX_NUMBER_FIELDS = 5
    alice_client.raise_request_exception = False
    response = alice_client.post("/api/jobs/", data={f"f{i}": "x" for i in range(10)})
    assert response.status_code == 400
    assert response["Content-Type"] == "application/json" and "Bad request" in response.json()["detail"]


@pytest.mark.urls("tests.failing_urls")
def test_an_unexpected_error_under_the_api_is_a_problem_document_that_hides_it(alice_client, caplog):
    alice_client.raise_request_exception = False
    response = alice_client.get("/api/failing/")
    assert response.status_code == 500
    assert response["Content-Type"] == "application/problem+json"
    problem = response.json()
    assert problem["type"] == "about:blank" and problem["title"] == "Internal Server Error"
    assert problem["status"] == 500 and problem["detail"]
    assert failing_urls.SECRET not in response.content.decode() and "Traceback" not in response.content.decode()
    assert failing_urls.SECRET in caplog.text and "Traceback" in caplog.text       # logged, for the admin


@pytest.mark.urls("tests.failing_urls")
def test_an_unexpected_error_on_a_page_is_an_html_page(alice_client):
    alice_client.raise_request_exception = False
    response = alice_client.get("/failing/")
    assert response.status_code == 500
    assert response["Content-Type"].startswith("text/html")
    assert failing_urls.SECRET not in response.content.decode()
