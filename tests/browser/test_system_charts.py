"""The job page's System section in headless Chromium: the charts drawn from stored samples,
samples pushed live over the websocket, the idle-GPU hint, and the note where nothing is collected.

Samples are stored and pushed the way the follower's sampler does (telemetry.store, then
live.publish_system); the sampler itself, from nvidia-smi to the API, is covered by
tests/integration/test_gpu_binding.py.
"""
from datetime import timedelta

import pytest
from django.utils import timezone

from jobs.domain import live, telemetry
from jobs.models import Job, Script
from runners.telemetry import Sample
from tests.browser.conftest import expect
from tests.browser.test_live_job_page import job, off_loop  # noqa: F401 (a fixture)

pytestmark = [pytest.mark.browser, pytest.mark.integration, pytest.mark.django_db(transaction=True)]


def gpu(host, index, utilization, memory_used=1000.0, power=100.0):
    return Sample(host=host, device=f"gpu{index}", utilization=utilization, memory_used=memory_used,
                  memory_total=40960.0, power=power)


def push(job, samples, at=None):
    """Store one round of samples and tell the page, as the sampler does."""
    def store_and_publish():
        rows = telemetry.store(job.pk, samples, now=at)
        live.publish_system(job.pk, [telemetry.as_dict(row) for row in rows], telemetry.idle_hint(job.pk))
    off_loop(store_and_publish)


def points(page, quantity):
    box = page.locator(f"#system-charts .chart[data-quantity={quantity}]")
    return int(box.get_attribute("data-points") or 0)


def test_the_system_section_draws_stored_samples_and_then_live_ones(log_in, alice, job):  # noqa: F811
    now = timezone.now()
    for i in range(3):
        push(job, [gpu("node-a", 0, 90.0), gpu("node-a", 1, 80.0)], at=now - timedelta(seconds=30 - 5 * i))

    page = log_in(alice)
    page.goto(f"/jobs/{job.pk}/")
    expect(page.locator("#system-card")).to_be_visible()
    for quantity in ("utilization", "memory_used", "power"):
        expect(page.locator(f"#system-charts .chart[data-quantity={quantity}]")).to_have_attribute("data-points", "6")
    # one series per host and GPU, named so
    legend = page.locator("#system-charts .chart[data-quantity=utilization] .u-legend").inner_text()
    assert "node-a gpu0" in legend and "node-a gpu1" in legend
    expect(page.locator("#live-status")).to_have_attribute("data-status", "live")

    push(job, [gpu("node-a", 0, 95.0), gpu("node-a", 1, 85.0)])
    expect(page.locator("#system-charts .chart[data-quantity=utilization]")).to_have_attribute("data-points", "8")
    expect(page.locator("#system-hint")).to_be_hidden()                      # busy GPUs: no hint


def test_cpu_samples_draw_utilization_and_memory_without_a_power_chart(log_in, alice, job):  # noqa: F811
    # The first CPU reading has no rate yet: memory is seen before utilization.
    push(job, [Sample(host="localhost", device="cpu", utilization=None, memory_used=800.0, memory_total=None)],
         at=timezone.now() - timedelta(seconds=15))
    for i in range(2):
        push(job, [Sample(host="localhost", device="cpu", utilization=150.0, memory_used=812.0, memory_total=None)],
             at=timezone.now() - timedelta(seconds=10 - 5 * i))
    page = log_in(alice)
    page.goto(f"/jobs/{job.pk}/")
    expect(page.locator("#system-charts .chart")).to_have_count(2)
    assert page.locator("#system-charts .chart").evaluate_all("els => els.map(e => e.dataset.quantity)") == [
        "utilization", "memory_used"]                                     # in one order, always
    expect(page.locator("#system-charts .chart[data-quantity=utilization]")).to_have_attribute("data-points", "3")
    expect(page.locator("#system-charts .chart[data-quantity=memory_used]")).to_have_attribute("data-points", "3")
    assert page.locator("#system-charts .chart[data-quantity=power]").count() == 0


def test_idle_gpus_are_named_on_the_page_as_they_become_idle(log_in, alice, job):  # noqa: F811
    page = log_in(alice)
    page.goto(f"/jobs/{job.pk}/")
    expect(page.locator("#live-status")).to_have_attribute("data-status", "live")
    expect(page.locator("#system-card")).to_be_hidden()                     # nothing sampled yet

    now = timezone.now()
    for i in range(telemetry.IDLE_MIN_SAMPLES):
        push(job, [gpu("node-a", 0, 12.0)], at=now - timedelta(minutes=6 - i))
    expect(page.locator("#system-hint")).to_be_visible()
    expect(page.locator("#system-hint")).to_contain_text("GPU utilization 12% over the last")
    expect(page.locator("#system-hint")).to_contain_text("is the input pipeline the bottleneck?")

    page.reload()                                                            # and it stays after a reload
    expect(page.locator("#system-hint")).to_contain_text("GPU utilization 12%")


def test_a_kubernetes_job_says_system_metrics_are_not_collected(log_in, alice, image):
    script = Script.objects.create(owner=alice, name="train.py", sha256="0" * 64, size=1, content="x")
    job = Job.objects.create(owner=alice, name="on a cluster", image=image, gpus=2, script=script,
                             time_limit_minutes=30, backend="kubernetes")
    page = log_in(alice)
    page.goto(f"/jobs/{job.pk}/")
    expect(page.locator("#system-note")).to_be_visible()
    expect(page.locator("#system-note")).to_contain_text("System metrics are not collected on Kubernetes")
    assert page.locator("#system-charts .chart").count() == 0
