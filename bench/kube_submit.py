"""Kubernetes submit latency: POST /api/jobs/ -> the MPIJob exists at the API server.

The real path: each job is submitted over the REST API to a real uvicorn, admitted by a real
Celery worker (dispatch), launched by it (run_job: build, validate against the CRD, create
through the official kubernetes client) against the protocol-level fake API server of the tests
(tests/fakekube), which runs in this process and records when each MPIJob was stored. Jobs are
submitted one after another, so each figure is one job's latency, not a queue's.

Baseline, in the same run against the same server, interleaved job by job: a bare
`create_namespaced_custom_object` of the same MPIJob body (the client's and the server's own
cost, nothing of the portal's), then deleted. Each job is cancelled once its MPIJob exists
(its workers are never scheduled), so the portal follows one or two jobs at a time.

    .venv/bin/python bench/kube_submit.py [--jobs 200]
"""
import argparse
import copy
import sys
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench import common  # noqa: E402

NS = "bench"


class Recorder:
    """Wraps the fake's store: when each MPIJob was stored (time.time, as the job's events)."""

    def __init__(self, fake):
        self.created, self.event = {}, threading.Condition()
        store, original = fake.store, fake.store.create

        def create(resource, obj):
            result = original(resource, obj)
            if resource == "mpijobs":
                with self.event:
                    self.created[obj["metadata"]["name"]] = time.time()
                    self.event.notify_all()
            return result
        store.create = create

    def wait(self, name, timeout=60):
        with self.event:
            if not self.event.wait_for(lambda: name in self.created, timeout):
                raise TimeoutError(f"{name} was not created in {timeout} s")
            return self.created[name]


def portal_one(session, recorder):
    """Submit one job and cancel it once its MPIJob was stored (not timed). Returns the job id and
    the seconds from the POST to: its answer, the LAUNCHING event (admitted), the MPIJob stored."""
    from jobs.models import JobEvent, State

    started = time.time()
    response = session.post(f"{session.base}/api/jobs/", json={
        "image": "horovod-k8s", "gpus": 2, "backend": "kubernetes", "script_path": "/examples/train.py"},
        timeout=30)
    answered = time.time()
    response.raise_for_status()
    job_id = response.json()["id"]
    created = recorder.wait(common.job_name(job_id))
    admitted = JobEvent.objects.get(job_id=job_id, state=State.LAUNCHING).ts.timestamp()
    session.post(f"{session.base}/api/jobs/{job_id}/cancel/", timeout=30).raise_for_status()
    return job_id, (answered - started, admitted - started, created - started)


def bare_one(api, body):
    """The same MPIJob (renamed) created by a bare client call; seconds it took. Then deleted."""
    from runners import mpijob

    started = time.monotonic()
    api.create_namespaced_custom_object(mpijob.GROUP, mpijob.VERSION, NS, mpijob.PLURAL, body)
    latency = time.monotonic() - started
    api.delete_namespaced_custom_object(mpijob.GROUP, mpijob.VERSION, NS, mpijob.PLURAL, body["metadata"]["name"])
    return latency


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--jobs", type=int, default=200)
    args = parser.parse_args()

    import yaml
    from kubernetes import client, config

    common.setup()
    from jobs.backends.kubernetes.clusters import render
    from jobs.backends.kubernetes.models import Cluster
    from jobs.models import Image, Job
    from tests.fakekube import FakeKube, Scenario

    common.header(f"kube_submit: POST /api/jobs/ -> MPIJob created at the API server, {args.jobs} jobs")
    user, token = common.bench_user()
    Image.objects.get_or_create(name="horovod-k8s", defaults={"container_image": "registry.example/horovod:0.28.1"})
    with FakeKube() as fake, common.Services() as services:
        # Nothing runs (the workers never schedule) and each job is cancelled once its MPIJob
        # exists, so the portal follows one or two jobs at a time, as a quiet portal would.
        fake.scenario = Scenario(unschedulable=True)
        recorder = Recorder(fake)
        Cluster.objects.all().delete()
        cluster = Cluster(name="fake", namespace=NS, gpus_per_node=1)
        cluster.set_kubeconfig(fake.kubeconfig_text(namespace=NS))
        cluster.save()
        url = services.web()
        services.worker(concurrency=32)
        session = common.api_session(url, token)
        api = client.CustomObjectsApi(config.new_client_from_config_dict(
            yaml.safe_load(fake.kubeconfig_text(namespace=NS))))
        portal, bare, answered, admitted = [], [], [], []
        # Interleaved, so both see the same machine: a portal job, then a bare create of its MPIJob.
        for i in range(args.jobs + 5):                  # the first 5 warm up (imports, connections)
            job_id, (answer, admit, latency) = portal_one(session, recorder)
            body = copy.deepcopy(render(Job.objects.select_related("image", "script").get(pk=job_id)))
            body["metadata"]["name"] = f"bare-{job_id}"
            bare_latency = bare_one(api, body)
            if i >= 5:
                portal.append(latency)
                bare.append(bare_latency)
                answered.append(answer)
                admitted.append(admit)
    p, b = common.summary(portal), common.summary(bare)
    for label, values in (("POST answered (201)", answered), ("admitted (LAUNCHING)", admitted)):
        part = common.summary(values)
        print(f"  of which {label + ':':24s} p50 {part['p50'] * 1000:.1f} ms, p99 {part['p99'] * 1000:.1f} ms "
              "after the POST")
    print(f"portal (submit -> created): p50 {p['p50'] * 1000:.1f} ms, p99 {p['p99'] * 1000:.1f} ms, "
          f"max {p['max'] * 1000:.1f} ms over {p['n']} jobs")
    print(f"bare create loop:           p50 {b['p50'] * 1000:.1f} ms, p99 {b['p99'] * 1000:.1f} ms, "
          f"max {b['max'] * 1000:.1f} ms over {b['n']} creates")
    print(f"ratio portal / bare: p50 {p['p50'] / b['p50']:.2f}x, p99 {p['p99'] / b['p99']:.2f}x; "
          f"the portal's own share at p50: {(p['p50'] - b['p50']) * 1000:.1f} ms")
    print(f"machine: {common.machine()}")


if __name__ == "__main__":
    main()
