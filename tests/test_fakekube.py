"""The fake kube-apiserver (tests/fakekube), driven only through the real `kubernetes` client."""
import datetime
import json
import re
import threading
import time

import pytest
import urllib3
from kubernetes import client, config, watch
from kubernetes.client.rest import ApiException

from tests.fakekube import FakeKube, Scenario

NS = "team-a"
GROUP, VERSION, PLURAL = "kubeflow.org", "v2beta1", "mpijobs"
STAMP = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{9}Z ")
LAUNCHER = "training.kubeflow.org/job-role=launcher"


def body(name, workers=2, slots=1, backoff=0, clean="Running", **spec):
    def replica(n, role):
        return {"replicas": n, "restartPolicy": "Never",
                "template": {"metadata": {"labels": {"app": "ringmaster"}},
                             "spec": {"containers": [{"name": role, "image": "ghcr.io/ringmaster/train:1",
                                                      "resources": {"limits": {"nvidia.com/gpu": slots}}
                                                      if role == "worker" else {}}]}}}
    return {"apiVersion": "kubeflow.org/v2beta1", "kind": "MPIJob",
            "metadata": {"name": name, "labels": {"ringmaster/job": name}},
            "spec": {"slotsPerWorker": slots,
                     "runPolicy": {"cleanPodPolicy": clean, "backoffLimit": backoff},
                     "mpiReplicaSpecs": {"Launcher": replica(1, "launcher"), "Worker": replica(workers, "worker")},
                     **spec}}


@pytest.fixture
def fake():
    with FakeKube() as fk:
        yield fk
        assert not fk.errors, fk.errors


@pytest.fixture
def api(fake, tmp_path):
    path = fake.write_kubeconfig(tmp_path / "kubeconfig", namespace=NS)
    api_client = config.new_client_from_config(config_file=str(path))
    yield api_client
    api_client.close()


@pytest.fixture
def co(api):
    return client.CustomObjectsApi(api)


@pytest.fixture
def core(api):
    return client.CoreV1Api(api)


def create(co, name, **kw):
    return co.create_namespaced_custom_object(GROUP, VERSION, NS, PLURAL, body(name, **kw))


def condition(fake, name, ctype):
    job = fake.mpijob(NS, name) or {}
    return next((c for c in job.get("status", {}).get("conditions", [])
                 if c["type"] == ctype and c["status"] == "True"), None)


def launcher(fake, name, state=None, index=-1):
    """The newest (or index-th) launcher pod, once its container is in `state`."""
    pods = fake.launcher_pods(NS, name)
    if len(pods) <= index or not pods or (index < 0 and not pods):
        return None
    pod = pods[index]
    if state is None:
        return pod
    statuses = pod["status"].get("containerStatuses") or [{}]
    return pod if state in statuses[0].get("state", {}) else None


def test_unauthorized_without_the_token(fake):
    cfg = client.Configuration(host=fake.url)
    with client.ApiClient(cfg) as anonymous:
        with pytest.raises(ApiException) as exc:
            client.CoreV1Api(anonymous).list_namespaced_pod(NS)
    assert exc.value.status == 401
    assert json.loads(exc.value.body)["reason"] == "Unauthorized"
    assert fake.requests == []


def test_load_kube_config_and_discovery(fake, tmp_path):
    path = fake.write_kubeconfig(tmp_path / "kc", namespace="team-b", context="ctx")
    cfg = client.Configuration()
    config.load_kube_config(config_file=str(path), client_configuration=cfg)
    assert cfg.host == fake.url
    _, active = config.list_kube_config_contexts(config_file=str(path))
    assert active["context"]["namespace"] == "team-b"
    with client.ApiClient(cfg) as api:
        assert client.VersionApi(api).get_code().git_version.startswith("v1.")


def test_create_then_409_and_defaults(fake, co):
    created = create(co, "rm-job-7")
    meta = created["metadata"]
    assert meta["uid"] and meta["generation"] == 1 and int(meta["resourceVersion"]) > 0
    assert re.match(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ$", meta["creationTimestamp"])
    # the apiserver applies the CRD's defaults
    assert created["spec"]["mpiImplementation"] == "OpenMPI"
    assert created["spec"]["launcherCreationPolicy"] == "AtStartup"
    with pytest.raises(ApiException) as exc:
        create(co, "rm-job-7")
    assert exc.value.status == 409
    status = json.loads(exc.value.body)
    assert status["reason"] == "AlreadyExists"
    assert status["message"] == 'mpijobs.kubeflow.org "rm-job-7" already exists'
    assert status["details"] == {"name": "rm-job-7", "group": "kubeflow.org", "kind": "mpijobs"}
    assert ("create", "kubeflow.org", "mpijobs", "", NS, "") in fake.requests
    with pytest.raises(ApiException) as exc:
        co.get_namespaced_custom_object(GROUP, VERSION, NS, PLURAL, "nope")
    assert exc.value.status == 404 and json.loads(exc.value.body)["reason"] == "NotFound"


def test_422_for_what_the_crd_rejects(fake, co):
    bad = body("rm-job-8", mpiImplementation="LAM")
    with pytest.raises(ApiException) as exc:
        co.create_namespaced_custom_object(GROUP, VERSION, NS, PLURAL, bad)
    status = json.loads(exc.value.body)
    assert exc.value.status == 422 and status["reason"] == "Invalid"
    assert status["details"]["causes"][0]["field"] == "spec.mpiImplementation"
    assert status["details"]["causes"][0]["reason"] == "FieldValueNotSupported"

    bad = body("rm-job-8")
    del bad["spec"]["mpiReplicaSpecs"]
    with pytest.raises(ApiException) as exc:
        co.create_namespaced_custom_object(GROUP, VERSION, NS, PLURAL, bad)
    assert json.loads(exc.value.body)["details"]["causes"][0] == {
        "reason": "FieldValueRequired", "message": "Required value", "field": "spec.mpiReplicaSpecs"}

    with pytest.raises(ApiException) as exc:
        co.create_namespaced_custom_object(GROUP, VERSION, NS, PLURAL, body("Bad_Name"))
    assert exc.value.status == 422
    assert "metadata.name: Invalid value" in json.loads(exc.value.body)["message"]

    # unknown fields are pruned with a warning header, and rejected with fieldValidation=Strict
    unknown = body("rm-job-9", bogus=1)
    with pytest.raises(ApiException) as exc:
        co.create_namespaced_custom_object(GROUP, VERSION, NS, PLURAL, unknown, field_validation="Strict")
    assert exc.value.status == 400
    created = co.create_namespaced_custom_object(GROUP, VERSION, NS, PLURAL, unknown)
    assert "bogus" not in created["spec"]
    assert fake.mpijobs(NS)[0]["metadata"]["name"] == "rm-job-9"


def test_watch_from_a_resource_version_sees_created_running_succeeded(fake, co):
    rv = create(co, "rm-job-7")["metadata"]["resourceVersion"]
    seen = []
    w = watch.Watch()
    for event in w.stream(co.list_namespaced_custom_object, GROUP, VERSION, NS, PLURAL,
                          field_selector="metadata.name=rm-job-7", resource_version=rv, timeout_seconds=5):
        assert event["type"] == "MODIFIED"
        for c in event["object"]["status"].get("conditions", []):
            if c["status"] == "True" and c["type"] not in seen:
                seen.append(c["type"])
        if "Succeeded" in seen:
            w.stop()
    assert seen == ["Created", "Running", "Succeeded"]
    job = fake.mpijob(NS, "rm-job-7")
    assert job["status"]["completionTime"] and job["status"]["startTime"]
    assert {c["type"]: c["status"] for c in job["status"]["conditions"]} == {
        "Created": "True", "Running": "False", "Succeeded": "True"}
    assert ("watch", "kubeflow.org", "mpijobs", "", NS, "") in fake.requests
    # list: kind, current resourceVersion, selectors
    listed = co.list_namespaced_custom_object(GROUP, VERSION, NS, PLURAL, label_selector="ringmaster/job=rm-job-7")
    assert listed["kind"] == "MPIJobList" and listed["metadata"]["resourceVersion"] == str(fake.store.rv)
    assert [i["metadata"]["name"] for i in listed["items"]] == ["rm-job-7"]
    assert co.list_namespaced_custom_object(GROUP, VERSION, NS, PLURAL,
                                            field_selector="metadata.name=other")["items"] == []


def test_watch_without_rv_starts_with_added_and_ends_at_timeout(fake, co):
    fake.scenario = Scenario(hold=threading.Event())
    create(co, "rm-job-7")
    started = time.monotonic()
    events = list(watch.Watch().stream(co.list_namespaced_custom_object, GROUP, VERSION, NS, PLURAL,
                                       timeout_seconds=1, allow_watch_bookmarks=True))
    assert 0.9 < time.monotonic() - started < 3
    assert events[0]["type"] == "ADDED" and events[0]["object"]["metadata"]["name"] == "rm-job-7"
    assert events[-1]["type"] == "BOOKMARK"   # Watch.stream hands BOOKMARK events to the caller
    fake.scenario.hold.set()


def test_a_client_resuming_from_each_bookmark_misses_no_change(tmp_path):
    """An informer resumes each watch from the last version it got, a bookmark's included: every
    change made while its watches end and start again reaches it, in order."""
    with FakeKube(history_limit=100_000) as fake:       # (a resume is never too old here: no 410)
        api_client = config.new_client_from_config(
            config_file=str(fake.write_kubeconfig(tmp_path / "kubeconfig", namespace=NS)))
        co = client.CustomObjectsApi(api_client)
        rv = create(co, "rm-job-7")["metadata"]["resourceVersion"]
        writes, written = [0], threading.Event()

        def write():                            # as fast as it can for 2.5 s: across the watches' ends
            until = time.monotonic() + 2.5
            while time.monotonic() < until:
                n = writes[0] + 1
                fake.store.update("mpijobs", NS, "rm-job-7", lambda obj: obj["metadata"]["labels"].update(n=str(n)))
                writes[0] = n
            written.set()
        seen, bookmarks, deadline = [], 0, time.monotonic() + 60
        threading.Thread(target=write, daemon=True).start()
        while not (written.is_set() and seen and seen[-1] == writes[0]) and time.monotonic() < deadline:
            for event in watch.Watch().stream(co.list_namespaced_custom_object, GROUP, VERSION, NS, PLURAL,
                                              field_selector="metadata.name=rm-job-7", resource_version=rv,
                                              timeout_seconds=1, allow_watch_bookmarks=True):
                rv = event["raw_object"]["metadata"]["resourceVersion"]
                if event["type"] == "BOOKMARK":
                    bookmarks += 1
                    continue
                n = int(event["object"]["metadata"]["labels"].get("n", 0))
                if n != (seen[-1] if seen else 0):  # (the operator's status changes keep the label)
                    seen.append(n)
        api_client.close()
        assert bookmarks >= 2                   # the writes spanned watches
        assert seen == list(range(1, writes[0] + 1))
        assert not fake.errors, fake.errors


def test_410_for_a_resource_version_older_than_the_history(fake, co):
    rv = create(co, "rm-job-7")["metadata"]["resourceVersion"]
    fake.wait_for(lambda: condition(fake, "rm-job-7", "Succeeded"), 5)
    fake.compact()
    # with timeout_seconds, Watch.stream does not retry: the 410 surfaces as an ApiException
    with pytest.raises(ApiException) as exc:
        list(watch.Watch().stream(co.list_namespaced_custom_object, GROUP, VERSION, NS, PLURAL,
                                  resource_version=rv, timeout_seconds=2))
    assert exc.value.status == 410
    assert exc.value.reason.startswith(f"Expired: too old resource version: {rv} (")
    # the raw stream: one ERROR event, then the response ends
    resp = co.list_namespaced_custom_object(GROUP, VERSION, NS, PLURAL, watch=True, resource_version=rv,
                                            _preload_content=False)
    lines = resp.data.decode().splitlines()
    assert len(lines) == 1 and json.loads(lines[0])["object"]["code"] == 410


def test_watch_gone_once_then_the_client_retries_by_itself(fake, co):
    rv = create(co, "rm-job-7")["metadata"]["resourceVersion"]
    fake.faults.watch_gone_once = True
    w = watch.Watch()
    # without timeout_seconds Watch.stream retries once after a 410, from the same resourceVersion
    for event in w.stream(co.list_namespaced_custom_object, GROUP, VERSION, NS, PLURAL, resource_version=rv,
                          field_selector="metadata.name=rm-job-7", _request_timeout=5):
        if any(c["type"] == "Succeeded" for c in event["object"].get("status", {}).get("conditions", [])):
            w.stop()
    assert [r for r in fake.requests if r[0] == "watch"] == [("watch", GROUP, PLURAL, "", NS, "")] * 2


def test_follow_log_with_timestamps_gives_the_lines_in_order_then_ends(fake, co, core):
    hold = threading.Event()
    chunks = [b"[1,0]<stdout>:epoch 1\n[1,1]<stdout>:ep", b"och 1\n", b"[1,0]<stdout>:loss=0.5\n",
              b"[1,1]<stdout>:no newline at exit"]
    fake.scenario = Scenario(attempts=[(chunks, 0)], hold=hold)
    create(co, "rm-job-7")
    pod = fake.wait_for(lambda: launcher(fake, "rm-job-7", "running"), 5)["metadata"]["name"]
    fake.wait_for(lambda: fake.logs(NS, pod), 5)
    lines = []
    for line in watch.Watch().stream(core.read_namespaced_pod_log, pod, NS, container="launcher",
                                     timestamps=True, _request_timeout=5):
        lines.append(line)
        hold.set()
    assert all(STAMP.match(line) for line in lines)
    assert [line.split(" ", 1)[1] for line in lines] == [
        "[1,0]<stdout>:epoch 1", "[1,1]<stdout>:epoch 1", "[1,0]<stdout>:loss=0.5",
        "[1,1]<stdout>:no newline at exit"]
    stamps = [line.split(" ", 1)[0] for line in lines]
    assert stamps == sorted(stamps)
    assert ("get", "", "pods", "log", NS, pod) in fake.requests
    fake.wait_for(lambda: condition(fake, "rm-job-7", "Succeeded"), 5)
    terminated = fake.pods(NS, LAUNCHER)[0]["status"]["containerStatuses"][0]["state"]["terminated"]
    assert terminated["exitCode"] == 0 and terminated["reason"] == "Completed"
    # a plain read of a finished container; note the client returns str(bytes) for text bodies
    text = core.read_namespaced_pod_log(pod, NS, _preload_content=False).data.decode()
    assert text.splitlines()[1] == "[1,1]<stdout>:epoch 1"
    assert core.read_namespaced_pod_log(pod, NS).startswith("b'[1,0]")


def test_since_time_since_seconds_tail_lines_limit_bytes(fake, co, api):
    hold = threading.Event()
    fake.scenario = Scenario(attempts=[([b"first\n", b"second\n", b"third\n"], 0)], hold=hold)
    create(co, "rm-job-7")
    pod = fake.wait_for(lambda: launcher(fake, "rm-job-7", "running"), 5)["metadata"]["name"]
    fake.wait_for(lambda: fake.logs(NS, pod), 5)
    # sinceTime has whole seconds: release the rest only once the clock is in the next second
    boundary = datetime.datetime.now(datetime.timezone.utc).replace(microsecond=0) + datetime.timedelta(seconds=1)
    fake.wait_for(lambda: datetime.datetime.now(datetime.timezone.utc) >= boundary, 3, "the next second")
    hold.set()
    fake.wait_for(lambda: condition(fake, "rm-job-7", "Succeeded"), 5)

    def log(**query):
        # read_namespaced_pod_log has no since_time parameter in this client: call the API directly
        resp = api.call_api(f"/api/v1/namespaces/{NS}/pods/{pod}/log", "GET",
                            query_params=list(query.items()), auth_settings=["BearerToken"],
                            _preload_content=False, _return_http_data_only=True)
        return resp.data.decode()
    assert log() == "first\nsecond\nthird\n"
    assert log(sinceTime=boundary.strftime("%Y-%m-%dT%H:%M:%SZ")) == "second\nthird\n"
    assert log(sinceSeconds=60) == "first\nsecond\nthird\n"
    assert log(tailLines=2) == "second\nthird\n"
    assert log(limitBytes=8) == "first\nse"
    assert log(timestamps="true", tailLines=1).endswith(" third\n")


def test_cut_log_leaves_a_partial_line(fake, co, core):
    hold = threading.Event()
    fake.scenario = Scenario(attempts=[([b"alpha line\n", b"beta line\n"], 0)], hold=hold)
    create(co, "rm-job-7")
    pod = fake.wait_for(lambda: launcher(fake, "rm-job-7", "running"), 5)["metadata"]["name"]
    fake.faults.cut_log_once_after = 14
    resp = core.read_namespaced_pod_log(pod, NS, follow=True, _preload_content=False, _request_timeout=5)
    got = b""
    with pytest.raises(urllib3.exceptions.ProtocolError):
        for piece in resp.stream(amt=None, decode_content=False):
            got += piece
            hold.set()
    assert got == b"alpha line\nbet"
    # Watch.stream raises the same way; the partial "bet" never reaches its caller
    fake.wait_for(lambda: condition(fake, "rm-job-7", "Succeeded"), 5)
    fake.faults.cut_log_once_after = 14
    lines = []
    with pytest.raises(urllib3.exceptions.ProtocolError):
        for line in watch.Watch().stream(core.read_namespaced_pod_log, pod, NS, _request_timeout=5):
            lines.append(line)
    assert lines == ["alpha line"]


def test_waiting_container_and_unknown_pod(fake, co, core):
    fake.scenario = Scenario(pull_seconds=30)
    create(co, "rm-job-7")
    pod = fake.wait_for(lambda: launcher(fake, "rm-job-7", "waiting"), 5)["metadata"]["name"]
    with pytest.raises(ApiException) as exc:
        core.read_namespaced_pod_log(pod, NS, container="launcher", follow=True)
    assert exc.value.status == 400
    assert json.loads(exc.value.body)["message"] == (
        f'container "launcher" in pod "{pod}" is waiting to start: ContainerCreating')
    with pytest.raises(ApiException) as exc:
        core.read_namespaced_pod_log("rm-job-7-launcher-zzzzz", NS)
    assert exc.value.status == 404
    with pytest.raises(ApiException) as exc:
        core.read_namespaced_pod_log(pod, NS, container="nope")
    assert exc.value.status == 400


def test_failed_launcher_is_retried_in_a_new_pod(fake, co, core):
    fake.scenario = Scenario(attempts=[([b"[1,0]<stderr>:CUDA error\n"], 1), ([b"[1,0]<stdout>:ok\n"], 0)])
    create(co, "rm-job-7", backoff=1)
    fake.wait_for(lambda: condition(fake, "rm-job-7", "Succeeded"), 5)
    pods = core.list_namespaced_pod(NS, label_selector=f"training.kubeflow.org/job-name=rm-job-7,{LAUNCHER}").items
    assert len(pods) == 2
    first, second = sorted(pods, key=lambda p: int(p.metadata.resource_version))
    assert first.metadata.name != second.metadata.name
    assert re.match(r"^rm-job-7-launcher-[a-z0-9]{5}$", second.metadata.name)
    assert first.status.phase == "Failed" and second.status.phase == "Succeeded"
    term = first.status.container_statuses[0].state.terminated
    assert (term.exit_code, term.reason) == (1, "Error")
    assert fake.logs(NS, first.metadata.name) == "[1,0]<stderr>:CUDA error\n"
    assert fake.logs(NS, second.metadata.name) == "[1,0]<stdout>:ok\n"
    assert fake.mpijob(NS, "rm-job-7")["status"]["replicaStatuses"]["Launcher"] == {
        "active": 0, "failed": 1, "succeeded": 1}


def test_backoff_limit_exceeded(fake, co):
    fake.scenario = Scenario(attempts=[([b"boom\n"], 2)])
    create(co, "rm-job-7", backoff=1)
    failed = fake.wait_for(lambda: condition(fake, "rm-job-7", "Failed"), 5)
    # mpi-operator appends "/<last failed pod's status.reason>": empty for a plain non-zero exit
    assert failed["reason"] == "BackoffLimitExceeded/"
    assert failed["message"].startswith("Job has reached the specified backoff limit")
    job = fake.mpijob(NS, "rm-job-7")
    assert job["status"]["replicaStatuses"]["Launcher"]["failed"] == 2 and job["status"]["completionTime"]
    assert len(fake.launcher_pods(NS, "rm-job-7")) == 2
    # cleanPodPolicy Running: the operator deletes the workers once the job is finished
    fake.wait_for(lambda: fake.pods(NS, "training.kubeflow.org/job-role=worker") == [], 5)
    event = fake.wait_for(lambda: fake.events(NS, "rm-job-7", reason="BackoffLimitExceeded/"), 5)
    assert event[0]["type"] == "Warning"


@pytest.mark.parametrize("how", ["api", "behind the portal's back"])
def test_delete_removes_pods_and_owned_configmaps(fake, co, core, how):
    hold = threading.Event()
    fake.scenario = Scenario(hold=hold)
    job = create(co, "rm-job-7")
    core.create_namespaced_config_map(NS, {"metadata": {"name": "rm-job-7-script", "ownerReferences": [
        {"apiVersion": "kubeflow.org/v2beta1", "kind": "MPIJob", "name": "rm-job-7", "uid": job["metadata"]["uid"]}]},
        "data": {"train.py": "print(1)"}})
    core.create_namespaced_config_map(NS, {"metadata": {"name": "unrelated"}})
    with pytest.raises(ApiException) as exc:
        core.create_namespaced_config_map(NS, {"metadata": {"name": "unrelated"}})
    assert exc.value.status == 409
    pod = fake.wait_for(lambda: launcher(fake, "rm-job-7", "running"), 5)["metadata"]["name"]
    fake.wait_for(lambda: fake.logs(NS, pod), 5)
    assert {c["metadata"]["name"] for c in fake.configmaps(NS)} == {"rm-job-7-config", "rm-job-7-script", "unrelated"}
    assert len(fake.pods(NS)) == 3
    rv = fake.mpijob(NS, "rm-job-7")["metadata"]["resourceVersion"]
    follow = core.read_namespaced_pod_log(pod, NS, follow=True, _preload_content=False, _request_timeout=5)

    if how == "api":
        status = co.delete_namespaced_custom_object(GROUP, VERSION, NS, PLURAL, "rm-job-7",
                                                    body=client.V1DeleteOptions(propagation_policy="Background"))
        assert status["status"] == "Success" and status["details"]["uid"] == job["metadata"]["uid"]
        assert ("delete", GROUP, PLURAL, "", NS, "rm-job-7") in fake.requests
    else:
        fake.delete_mpijob(NS, "rm-job-7")
    assert follow.read() == b"[1,0]<stdout>:step 1 rank 0\n[1,1]<stdout>:step 1 rank 1\n"   # ends cleanly
    assert fake.pods(NS) == []
    assert [c["metadata"]["name"] for c in fake.configmaps(NS)] == ["unrelated"]
    assert fake.mpijob(NS, "rm-job-7") is None
    events = list(watch.Watch().stream(co.list_namespaced_custom_object, GROUP, VERSION, NS, PLURAL,
                                       resource_version=rv, timeout_seconds=1))
    assert events[-1]["type"] == "DELETED" and events[-1]["object"]["metadata"]["name"] == "rm-job-7"
    pod_events = list(watch.Watch().stream(core.list_namespaced_pod, NS, resource_version=rv, timeout_seconds=1))
    assert sum(e["type"] == "DELETED" for e in pod_events) == 3
    with pytest.raises(ApiException) as exc:
        co.delete_namespaced_custom_object(GROUP, VERSION, NS, PLURAL, "rm-job-7")
    assert exc.value.status == 404


def test_unschedulable_workers_stay_pending(fake, co, core):
    fake.scenario = Scenario(unschedulable=True)
    create(co, "rm-job-7")
    events = fake.wait_for(lambda: len(fake.events(NS, reason="FailedScheduling")) == 2 and
                           fake.events(NS, reason="FailedScheduling"), 5)
    assert events[0]["type"] == "Warning"
    assert events[0]["message"] == "0/3 nodes are available: 3 Insufficient nvidia.com/gpu."
    assert events[0]["source"]["component"] == "default-scheduler"
    workers = core.list_namespaced_pod(NS, label_selector="training.kubeflow.org/job-role=worker").items
    assert [p.metadata.name for p in workers] == ["rm-job-7-worker-0", "rm-job-7-worker-1"]
    for p in workers:
        assert p.status.phase == "Pending"
        (cond,) = p.status.conditions
        assert (cond.type, cond.status, cond.reason) == ("PodScheduled", "False", "Unschedulable")
        assert p.metadata.labels["training.kubeflow.org/replica-index"] in ("0", "1")
        assert p.metadata.owner_references[0].kind == "MPIJob"
    listed = core.list_namespaced_event(NS, field_selector="involvedObject.name=rm-job-7-worker-0").items
    assert [e.reason for e in listed] == ["FailedScheduling"]
    assert condition(fake, "rm-job-7", "Running") is None
    fake.release_unschedulable("rm-job-7")
    fake.wait_for(lambda: condition(fake, "rm-job-7", "Succeeded"), 5)


def test_image_pull_error(fake, co, core):
    fake.scenario = Scenario(image_pull_error=True)
    create(co, "rm-job-7")
    pod = fake.wait_for(lambda: (p := launcher(fake, "rm-job-7", "waiting")) and
                        p["status"]["containerStatuses"][0]["state"]["waiting"]["reason"] == "ImagePullBackOff"
                        and p, 5)
    waiting = pod["status"]["containerStatuses"][0]["state"]["waiting"]
    assert waiting["message"] == 'Back-off pulling image "ghcr.io/ringmaster/train:1"'
    events = core.list_namespaced_event(
        NS, field_selector=f"involvedObject.name={pod['metadata']['name']},type=Warning").items
    assert events[0].reason == "Failed"
    assert any(e.message.startswith('Failed to pull image "ghcr.io/ringmaster/train:1": ') and
               e.message.endswith("not found") for e in events)
    with pytest.raises(ApiException) as exc:
        core.read_namespaced_pod_log(pod["metadata"]["name"], NS)
    assert "is waiting to start: trying and failing to pull image" in json.loads(exc.value.body)["message"]
    for worker in fake.pods(NS, "training.kubeflow.org/job-role=worker"):
        assert worker["status"]["containerStatuses"][0]["state"]["waiting"]["reason"] == "ImagePullBackOff"


def test_oom_killed_worker_fails_the_job(fake, co):
    fake.scenario = Scenario(oom_worker=1)
    create(co, "rm-job-7", backoff=1, clean="None")
    fake.wait_for(lambda: condition(fake, "rm-job-7", "Failed"), 5)
    worker = fake.mpijob and fake.store.get("pods", NS, "rm-job-7-worker-1")
    assert worker["status"]["phase"] == "Failed"
    assert worker["status"]["containerStatuses"][0]["state"]["terminated"]["reason"] == "OOMKilled"
    assert worker["status"]["containerStatuses"][0]["state"]["terminated"]["exitCode"] == 137
    first = fake.launcher_pods(NS, "rm-job-7")[0]["metadata"]["name"]
    assert "mpirun noticed that process rank 1" in fake.logs(NS, first)
    assert condition(fake, "rm-job-7", "Failed")["reason"].startswith("BackoffLimitExceeded")


def test_evicted_worker_fails_the_job(fake, co):
    fake.scenario = Scenario(evict_worker=0)
    create(co, "rm-job-7", clean="None")
    failed = fake.wait_for(lambda: condition(fake, "rm-job-7", "Failed"), 5)
    assert (failed["reason"], failed["message"]) == ("MPIJobEvicted", "1/2 workers are evicted")
    worker = fake.store.get("pods", NS, "rm-job-7-worker-0")
    assert (worker["status"]["phase"], worker["status"]["reason"], worker["status"]["message"]) == (
        "Failed", "Evicted", "The node was low on resource: memory.")
    # The operator records its event after the condition, as a separate write.
    event = fake.wait_for(lambda: fake.events(NS, "rm-job-7", reason="MPIJobEvicted"), 5)
    assert event[0]["type"] == "Warning"


def test_validation_error_is_only_an_event(fake, co, core):
    fake.scenarios["rm-job-7"] = Scenario(validation_error="Invalid MPIJob: bad things")
    create(co, "rm-job-7")
    bad = body("rm-job-8")
    bad["spec"]["mpiReplicaSpecs"]["Launcher"]["replicas"] = 2   # the CRD allows it, the controller does not
    co.create_namespaced_custom_object(GROUP, VERSION, NS, PLURAL, bad)
    fake.wait_for(lambda: len(fake.events(NS, reason="ValidationError")) == 2, 5)
    listed = core.list_namespaced_event(NS, field_selector="involvedObject.kind=MPIJob,reason=ValidationError").items
    messages = {e.involved_object.name: e.message for e in listed}
    assert messages["rm-job-7"] == "Invalid MPIJob: bad things"
    assert messages["rm-job-8"] == ("Invalid MPIJob: spec.mpiReplicaSpecs[Launcher].replicas: "
                                    "Invalid value: 2: must be 1")
    assert all(e.type == "Warning" and e.count == 1 and e.first_timestamp for e in listed)
    for name in ("rm-job-7", "rm-job-8"):
        assert "status" not in fake.mpijob(NS, name) or not fake.mpijob(NS, name)["status"].get("conditions")
    assert fake.pods(NS) == []


def test_create_errors_and_a_slow_create(fake, co):
    fake.faults.create_errors = [500, 503]
    for code in (500, 503):
        with pytest.raises(ApiException) as exc:
            create(co, "rm-job-7")
        assert exc.value.status == code
    assert fake.mpijob(NS, "rm-job-7") is None
    fake.faults.create_slow_once = 1.0
    # a POST that times out raises urllib3's ReadTimeoutError (urllib3 does not retry POST reads)
    with pytest.raises(urllib3.exceptions.ReadTimeoutError):
        co.create_namespaced_custom_object(GROUP, VERSION, NS, PLURAL, body("rm-job-7"), _request_timeout=0.3)
    assert fake.mpijob(NS, "rm-job-7") is not None
    with pytest.raises(ApiException) as exc:
        create(co, "rm-job-7")
    assert exc.value.status == 409


def test_suspended_job_waits_until_patched(fake, co):
    b = body("rm-job-7")
    b["spec"]["runPolicy"]["suspend"] = True
    co.create_namespaced_custom_object(GROUP, VERSION, NS, PLURAL, b)
    fake.wait_for(lambda: condition(fake, "rm-job-7", "Suspended"), 5)
    assert fake.pods(NS) == []
    patched = co.patch_namespaced_custom_object(GROUP, VERSION, NS, PLURAL, "rm-job-7",
                                                {"spec": {"runPolicy": {"suspend": False}}})
    assert patched["metadata"]["generation"] == 2
    fake.wait_for(lambda: condition(fake, "rm-job-7", "Succeeded"), 5)
    assert ("patch", GROUP, PLURAL, "", NS, "rm-job-7") in fake.requests


def test_selectors_and_recorded_verbs(fake, co, core):
    create(co, "rm-job-7")
    fake.wait_for(lambda: condition(fake, "rm-job-7", "Succeeded"), 5)
    pods = core.list_namespaced_pod(NS, label_selector="training.kubeflow.org/job-name=rm-job-7,"
                                                       "training.kubeflow.org/job-role in (launcher)").items
    assert len(pods) == 1 and pods[0].metadata.labels["training.kubeflow.org/operator-name"] == "mpi-operator"
    assert core.read_namespaced_pod(pods[0].metadata.name, NS).status.phase == "Succeeded"
    events = core.list_namespaced_event(NS, field_selector="involvedObject.name=rm-job-7,involvedObject.kind=MPIJob")
    assert {e.reason for e in events.items} == {"MPIJobCreated", "MPIJobRunning", "MPIJobSucceeded"}
    with pytest.raises(ApiException) as exc:
        core.list_namespaced_pod(NS, field_selector="metadata.labels=x")
    assert exc.value.status == 400
    assert fake.verbs() >= {("create", GROUP, PLURAL, ""), ("list", "", "pods", ""), ("get", "", "pods", ""),
                            ("list", "", "events", "")}
    assert all(r[0] in {"get", "list", "watch", "create", "update", "patch", "delete", "deletecollection"}
               for r in fake.requests)


# --- elastic MPIJobs: what mpi-operator v2 does (getOrCreateWorker, updateDiscoverHostsInConfigMap) --

def elastic_body(name, workers, slots=1, min_np=1):
    b = body(name, workers=workers, slots=slots)
    launcher = b["spec"]["mpiReplicaSpecs"]["Launcher"]["template"]["spec"]["containers"][0]
    launcher["command"] = ["horovodrun", "-np", str(workers * slots), "--min-np", str(min_np), "--max-np", "8",
                           "--slots-per-host", str(slots), "--host-discovery-script", "/etc/mpi/discover_hosts.sh",
                           "python", "train.py"]
    return b


def discovered(fake, name):
    cm = fake.store.get("configmaps", NS, f"{name}-config")
    return cm["data"]["discover_hosts.sh"] if cm else None


def sizes(fake, name):
    pods = fake.launcher_pods(NS, name)
    log = fake.logs(NS, pods[0]["metadata"]["name"]) if pods else ""
    return [int(m[1]) for m in re.finditer(r"\[0\]<stdout>:step \d+ size (\d+)", log)]


def test_scaling_the_worker_replicas_remakes_pods_and_the_discovery_script(fake, co, core):
    hold = threading.Event()
    fake.scenario = Scenario(hold=hold, step_seconds=0.05)
    co.create_namespaced_custom_object(GROUP, VERSION, NS, PLURAL, elastic_body("rm-job-7", 2, slots=2))
    hosts = "".join(f"echo rm-job-7-worker-{i}.rm-job-7.{NS}.svc\n" for i in range(2))
    fake.wait_for(lambda: discovered(fake, "rm-job-7") == "#!/bin/sh\n" + hosts, 5)
    fake.wait_for(lambda: 4 in sizes(fake, "rm-job-7"), 5)            # 2 hosts x --slots-per-host 2
    co.patch_namespaced_custom_object(GROUP, VERSION, NS, PLURAL, "rm-job-7",
                                      {"spec": {"mpiReplicaSpecs": {"Worker": {"replicas": 1}}}})
    fake.wait_for(lambda: fake.store.get("pods", NS, "rm-job-7-worker-1") is None, 5)   # the highest index goes
    fake.wait_for(lambda: discovered(fake, "rm-job-7") == f"#!/bin/sh\necho rm-job-7-worker-0.rm-job-7.{NS}.svc\n", 5)
    fake.wait_for(lambda: sizes(fake, "rm-job-7")[-1:] == [2], 5)
    co.patch_namespaced_custom_object(GROUP, VERSION, NS, PLURAL, "rm-job-7",
                                      {"spec": {"mpiReplicaSpecs": {"Worker": {"replicas": 3}}}})
    fake.wait_for(lambda: sizes(fake, "rm-job-7")[-1:] == [6], 5)
    hold.set()
    fake.wait_for(lambda: condition(fake, "rm-job-7", "Succeeded"), 5)


def test_an_evicted_worker_of_an_elastic_job_fails_nothing_until_the_launcher_ends(fake, co, core):
    hold = threading.Event()
    fake.scenario = Scenario(hold=hold, step_seconds=0.05, evict_worker=0)
    co.create_namespaced_custom_object(GROUP, VERSION, NS, PLURAL, elastic_body("rm-job-7", 2))
    failed = fake.wait_for(lambda: condition(fake, "rm-job-7", "Failed"), 5)
    assert failed["reason"] == "MPIJobEvicted" and "completionTime" not in fake.mpijob(NS, "rm-job-7")["status"]
    fake.wait_for(lambda: sizes(fake, "rm-job-7")[-1:] == [1], 5)     # it goes on with the other worker
    core.delete_namespaced_pod("rm-job-7-worker-0", NS)              # a replacement is made at that index
    fake.wait_for(lambda: sizes(fake, "rm-job-7")[-1:] == [2], 5)
    hold.set()
    fake.wait_for(lambda: condition(fake, "rm-job-7", "Succeeded"), 5)
    assert condition(fake, "rm-job-7", "Failed") is None            # filterOutCondition turned it False
