"""The log API's search with context (grep -C) and the hidden metric lines: what the job page's
log view asks for. The plain paging is tested in test_api.py."""
import pytest
from django.utils import timezone

from jobs.models import Job, LogLine, Script

pytestmark = pytest.mark.django_db


@pytest.fixture
def client(api_client, alice):
    return api_client(alice)


@pytest.fixture
def job(alice, image):
    script = Script.objects.create(owner=alice, name="train.py", sha256="0" * 64, size=1, content="x")
    return Job.objects.create(owner=alice, image=image, gpus=2, script=script, time_limit_minutes=5)


def store(job, texts):
    """[(rank, text)] as lines 0..n-1."""
    LogLine.objects.bulk_create(LogLine(job=job, seq=i, rank=rank, stream="stdout", ts=timezone.now(), text=text)
                                for i, (rank, text) in enumerate(texts))


def logs(client, job, query):
    response = client.get(f"/api/jobs/{job.pk}/logs/?{query}")
    assert response.status_code == 200, response.content
    return response.json()


def shown(page):
    return [(line["seq"], line["hit"]) for line in page["lines"]]


def test_hits_come_with_the_lines_around_them_once_each(client, job):
    store(job, [(i % 2, "boom" if i in (5, 8, 30) else f"line {i}") for i in range(40)])
    page = logs(client, job, "q=BOOM&context=2")
    assert shown(page) == [(3, False), (4, False), (5, True), (6, False), (7, False), (8, True), (9, False),
                           (10, False), (28, False), (29, False), (30, True), (31, False), (32, False)]
    assert (page["prev"], page["next"]) == (5, 30)                         # paging follows the hits
    tail = logs(client, job, "q=boom&context=1&before=40&limit=1")
    assert shown(tail) == [(29, False), (30, True), (31, False)] and tail["prev"] == 30
    above = logs(client, job, f"q=boom&context=1&before={tail['prev']}&limit=1")
    assert shown(above) == [(7, False), (8, True), (9, False)]
    assert [line["seq"] for line in logs(client, job, "q=boom")["lines"]] == [5, 8, 30]   # no context: hits
    assert "hit" not in logs(client, job, "q=boom")["lines"][0]
    assert "hit" not in logs(client, job, "context=3&limit=2")["lines"][0]                 # no search: no context


def test_a_neighbour_that_matches_is_a_hit_and_the_edges_of_the_log_are_kept(client, job):
    store(job, [(0, "boom one"), (0, "line"), (0, "boom two"), (0, "line")])
    page = logs(client, job, "q=boom&context=3&limit=1")                   # the first hit only...
    assert shown(page) == [(0, True), (1, False), (2, True), (3, False)]    # ...its neighbour still reads as one


def test_context_keeps_to_the_rank_filter_and_the_hidden_metric_lines(client, job):
    texts = []
    for i in range(12):
        texts.append((0, 'RINGMASTER_METRIC {"step": %d, "loss": 1}' % i if i % 2 else f"r0 {i}"))
        texts.append((1, "r1 target" if i == 6 else f"r1 {i}"))
    store(job, texts)                                   # seq 2i: rank 0, seq 2i+1: rank 1
    page = logs(client, job, "q=target&context=2&rank=1")
    assert [line["text"] for line in page["lines"]] == ["r1 4", "r1 5", "r1 target", "r1 7", "r1 8"]
    page = logs(client, job, "q=r&context=1&rank=0&hide_metrics=1&limit=1&before=13")
    assert [line["text"] for line in page["lines"]] == ["r0 4", "r0 6", "r0 8"]
    assert [line["hit"] for line in page["lines"]] == [True, True, True]


def test_hide_metrics_leaves_out_the_metric_lines_in_every_kind_of_page(client, job):
    store(job, [(0, "start"), (0, 'RINGMASTER_METRIC {"step": 1, "loss": 0.5}'),
                (1, 'INFO RINGMASTER_METRIC {"step": 1, "loss": 0.5}'), (1, "end")])
    assert [line["seq"] for line in logs(client, job, "hide_metrics=1")["lines"]] == [0, 3]
    assert [line["seq"] for line in logs(client, job, "hide_metrics=true&before=4&limit=1")["lines"]] == [3]
    assert [line["seq"] for line in logs(client, job, "hide_metrics=0")["lines"]] == [0, 1, 2, 3]
    assert [line["seq"] for line in logs(client, job, "hide_metrics=1&q=loss")["lines"]] == []


def test_bad_values_are_a_400_naming_the_parameter(client, job):
    response = client.get(f"/api/jobs/{job.pk}/logs/?context=21&hide_metrics=maybe")
    assert response.status_code == 400
    assert set(response.json()) == {"context", "hide_metrics"}
    assert client.get(f"/api/jobs/{job.pk}/logs/?context=-1").status_code == 400


def test_context_of_a_sparse_rank_reaches_past_the_lines_near_the_hit(client, job):
    """The launcher prints a line now and then among the ranks' thousands: its context lines are
    far away in seq, and still the nearest ones of its own."""
    store(job, [(None, f"launcher {i}") if i % 300 == 0 else (i % 2, f"rank line {i}") for i in range(3000)])
    page = logs(client, job, "q=launcher 1500&context=2&rank=launcher")
    assert [line["text"] for line in page["lines"]] == ["launcher 900", "launcher 1200", "launcher 1500",
                                                        "launcher 1800", "launcher 2100"]
    page = logs(client, job, "q=launcher&context=2&rank=launcher&limit=1&since=-1")   # at the top of the log
    assert [line["text"] for line in page["lines"]] == ["launcher 0", "launcher 300", "launcher 600"]
    page = logs(client, job, "q=launcher 2700&context=2&rank=launcher")                  # and at its end
    assert [line["text"] for line in page["lines"]] == ["launcher 2100", "launcher 2400", "launcher 2700"]
    page = logs(client, job, "q=rank line 1501&context=2&rank=1")                       # a dense rank: near lines
    assert [line["text"] for line in page["lines"]] == ["rank line 1497", "rank line 1499", "rank line 1501",
                                                        "rank line 1503", "rank line 1505"]
