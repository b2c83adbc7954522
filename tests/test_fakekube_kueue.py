"""The fake API server playing Kueue (tests/fakekube/kueue.py), driven through the real
`kubernetes` client: discovery, the webhook's suspend, Workloads admitted by quota in order,
held with Kueue's message, preempted for a higher priority, and every object it serves valid
against Kueue's CRDs."""
import threading

import pytest
from kubernetes import client, config

from tests.fakekube import FakeKube, Scenario
from tests.fakekube import schema as crd
from tests.test_fakekube import body

NS = "team-a"
KUEUE = ("kueue.x-k8s.io", "v1beta1")
VISIBILITY = "/apis/visibility.kueue.x-k8s.io/v1beta1/namespaces/{ns}/localqueues/{q}/pendingworkloads"


@pytest.fixture
def fake():
    with FakeKube() as fk:
        fk.enable_kueue(gpus=16, queues=[(NS, "team-queue")], priorities={"urgent": 1000})
        yield fk
        assert not fk.errors, fk.errors


@pytest.fixture
def api(fake, tmp_path):
    path = fake.write_kubeconfig(tmp_path / "kubeconfig", namespace=NS)
    api_client = config.new_client_from_config(config_file=str(path))
    yield api_client
    api_client.close()


def queued(name, gpus, queue="team-queue", priority_class=""):
    job = body(name, workers=gpus // 8, slots=8)
    job["metadata"]["labels"]["kueue.x-k8s.io/queue-name"] = queue
    if priority_class:
        for replica in job["spec"]["mpiReplicaSpecs"].values():
            replica["template"]["spec"]["priorityClassName"] = priority_class
    return job


def workload(co, name):
    items = co.list_namespaced_custom_object(*KUEUE, NS, "workloads")["items"]
    found = [w for w in items if w["metadata"]["ownerReferences"][0]["name"] == name]
    return found[0] if found else None


def cond(obj, ctype):
    return next((c for c in (obj or {}).get("status", {}).get("conditions", []) if c["type"] == ctype), None)


def admitted(co, name):
    wl = workload(co, name)
    return (cond(wl, "Admitted") or {}).get("status") == "True" and wl


def test_discovery_serves_kueue_only_where_it_is_installed(api, tmp_path):
    groups = {g.name for g in client.ApisApi(api).get_api_versions().groups}
    assert "kueue.x-k8s.io" in groups
    kinds = {r.kind for r in client.CustomObjectsApi(api).get_api_resources(*KUEUE).resources}
    assert {"Workload", "ClusterQueue", "LocalQueue", "ResourceFlavor"} <= kinds
    with FakeKube() as plain:
        path = plain.write_kubeconfig(tmp_path / "plain", namespace=NS)
        other = config.new_client_from_config(config_file=str(path))
        assert "kueue.x-k8s.io" not in {g.name for g in client.ApisApi(other).get_api_versions().groups}
        with pytest.raises(client.ApiException) as err:
            client.CustomObjectsApi(other).list_namespaced_custom_object(*KUEUE, NS, "workloads")
        assert err.value.status == 404
        other.close()


def test_two_fit_the_quota_the_third_waits_with_kueues_message_and_position_then_runs(fake, api):
    co = client.CustomObjectsApi(api)
    holds = {name: threading.Event() for name in ("a", "b", "c")}
    for name, hold in holds.items():
        fake.scenarios[name] = Scenario(hold=hold)
    try:
        for name in ("a", "b", "c"):
            co.create_namespaced_custom_object("kubeflow.org", "v2beta1", NS, "mpijobs", queued(name, 8))
            fake.wait_for(lambda n=name: workload(co, n), 5, f"the Workload of {name}")
        fake.wait_for(lambda: admitted(co, "a") and admitted(co, "b"), 5, "a and b admitted")
        for name in ("a", "b"):
            assert fake.mpijob(NS, name)["spec"]["runPolicy"]["suspend"] is False
        waiting = fake.wait_for(lambda: cond(workload(co, "c"), "QuotaReserved"), 5, "c's QuotaReserved")
        assert waiting["status"] == "False" and waiting["reason"] == "Pending"
        assert waiting["message"] == ("couldn't assign flavors to pod set worker: insufficient unused quota for "
                                      "nvidia.com/gpu in flavor default-flavor, 8 more needed")
        assert fake.mpijob(NS, "c")["spec"]["runPolicy"]["suspend"] is True
        summary = api.call_api(VISIBILITY, "GET", path_params={"ns": NS, "q": "team-queue"},
                               response_types_map={200: "object"}, auth_settings=["BearerToken"],
                               _return_http_data_only=True)
        assert [(i["metadata"]["name"], i["positionInClusterQueue"]) for i in summary["items"]] == \
            [(workload(co, "c")["metadata"]["name"], 0)]
        lq = co.get_namespaced_custom_object(*KUEUE, NS, "localqueues", "team-queue")
        assert (lq["status"]["pendingWorkloads"], lq["status"]["admittedWorkloads"]) == (1, 2)
        holds["a"].set()
        fake.wait_for(lambda: admitted(co, "c"), 10, "c admitted once a finished")
        assert cond(workload(co, "a"), "Finished")["status"] == "True"
    finally:
        for hold in holds.values():
            hold.set()
    fake.wait_for(lambda: all(cond(fake.mpijob(NS, n), "Succeeded") for n in ("a", "b", "c")), 20, "all succeed")


def test_a_higher_priority_job_preempts_and_the_preempted_job_resumes_when_room_returns(fake, api):
    co = client.CustomObjectsApi(api)
    low, urgent = threading.Event(), threading.Event()
    fake.scenarios.update(low=Scenario(hold=low), urgent=Scenario(hold=urgent))
    try:
        co.create_namespaced_custom_object("kubeflow.org", "v2beta1", NS, "mpijobs", queued("low", 16))
        fake.wait_for(lambda: len(fake.pods(NS, "training.kubeflow.org/job-name=low")) == 3, 10, "low's pods")
        co.create_namespaced_custom_object("kubeflow.org", "v2beta1", NS, "mpijobs",
                                           queued("urgent", 8, priority_class="urgent"))
        fake.wait_for(lambda: admitted(co, "urgent"), 10, "urgent admitted")
        evicted = cond(workload(co, "low"), "Evicted")
        assert (evicted["status"], evicted["reason"]) == ("True", "Preempted")
        assert cond(workload(co, "low"), "Preempted")["reason"] == "InClusterQueue"
        assert "due to prioritization in the ClusterQueue" in evicted["message"]
        assert fake.mpijob(NS, "low")["spec"]["runPolicy"]["suspend"] is True
        fake.wait_for(lambda: not fake.pods(NS, "training.kubeflow.org/job-name=low"), 10, "low's pods to go")
        assert [e["reason"] for e in fake.events(NS, kind="Workload", reason="Preempted")] == ["Preempted"]
        urgent.set()
        fake.wait_for(lambda: admitted(co, "low"), 10, "low re-admitted")
        again = cond(workload(co, "low"), "Evicted")
        assert again["status"] == "False" and again["message"].startswith("Previously: Preempted")
    finally:
        low.set()
        urgent.set()
    fake.wait_for(lambda: cond(fake.mpijob(NS, "low"), "Succeeded"), 20, "low to succeed")


def test_every_kueue_object_it_serves_is_valid_against_kueues_crds(fake, api):
    co = client.CustomObjectsApi(api)
    co.create_namespaced_custom_object("kubeflow.org", "v2beta1", NS, "mpijobs", queued("v", 8))
    fake.wait_for(lambda: admitted(co, "v"), 10, "v admitted")
    served = [("workloads", o) for o in co.list_namespaced_custom_object(*KUEUE, NS, "workloads")["items"]]
    served += [("localqueues", o) for o in co.list_namespaced_custom_object(*KUEUE, NS, "localqueues")["items"]]
    served += [("clusterqueues", o) for o in co.list_cluster_custom_object(*KUEUE, "clusterqueues")["items"]]
    assert {kind for kind, _ in served} == {"workloads", "localqueues", "clusterqueues"}
    for plural, obj in served:
        schema = crd.kueue_schema(plural)
        assert schema.errors(obj) == [], (plural, obj["metadata"]["name"])
        assert schema.default_and_prune(obj)[1] == [], plural


def test_a_job_without_the_label_is_left_alone(fake, api):
    co = client.CustomObjectsApi(api)
    co.create_namespaced_custom_object("kubeflow.org", "v2beta1", NS, "mpijobs", body("plain"))
    fake.wait_for(lambda: cond(fake.mpijob(NS, "plain"), "Succeeded"), 10, "plain to succeed")
    assert workload(co, "plain") is None and not fake.mpijob(NS, "plain")["spec"]["runPolicy"].get("suspend")


def test_a_labelled_trainjob_is_suspended_queued_as_its_node_pod_set_and_preempted_like_an_mpijob(fake, api):
    from runners import mpijob, trainjob
    from tests.unit.test_trainjob import spec

    co = client.CustomObjectsApi(api)
    holds = {"tj-low": threading.Event(), "tj-urgent": threading.Event()}
    fake.scenarios.update({name: Scenario(hold=hold) for name, hold in holds.items()})
    cluster = mpijob.ClusterSpec(namespace=NS, gpus_per_node=8, kueue_queue="team-queue")
    low, _ = trainjob.build(spec(gpus=16), cluster)
    low["metadata"]["name"] = "tj-low"
    try:
        co.create_namespaced_custom_object(trainjob.GROUP, trainjob.VERSION, NS, trainjob.PLURAL, low)
        wl = fake.wait_for(lambda: admitted(co, "tj-low"), 10, "tj-low admitted")
        assert [(s["name"], s["count"]) for s in wl["spec"]["podSets"]] == [("node", 2)]
        assert wl["status"]["admission"]["podSetAssignments"][0]["resourceUsage"] == {"nvidia.com/gpu": "16"}
        fake.wait_for(lambda: len(fake.node_pods(NS, "tj-low")) == 2, 10, "tj-low's nodes")
        urgent = queued("tj-urgent", 8, priority_class="urgent")     # an MPIJob of a higher priority
        co.create_namespaced_custom_object("kubeflow.org", "v2beta1", NS, "mpijobs", urgent)
        fake.wait_for(lambda: admitted(co, "tj-urgent"), 10, "the urgent MPIJob admitted")
        assert fake.trainjob(NS, "tj-low")["spec"]["suspend"] is True
        fake.wait_for(lambda: not fake.node_pods(NS, "tj-low"), 10, "tj-low's nodes to go")
        holds["tj-urgent"].set()
        fake.wait_for(lambda: admitted(co, "tj-low"), 20, "tj-low re-admitted")
    finally:
        for hold in holds.values():
            hold.set()
    fake.wait_for(lambda: cond(fake.trainjob(NS, "tj-low"), "Complete"), 20, "tj-low to complete")
    fake.wait_for(lambda: (cond(workload(co, "tj-low"), "Finished") or {}).get("status") == "True", 10,
                  "tj-low's Workload finished")


def test_the_kueue_crds_kept_here_are_the_shared_ones():
    from tests.fakekube.schema import KUEUE_CRD_DIR, SHARED_CRD_DIR

    if not SHARED_CRD_DIR.exists():
        pytest.skip("no ../shared/schemas beside this checkout")
    kept = sorted(path.name for path in KUEUE_CRD_DIR.glob("kueue-*-crd.yaml"))
    assert kept == sorted(path.name for path in SHARED_CRD_DIR.glob("kueue-*-crd.yaml"))
    for name in kept:
        assert (KUEUE_CRD_DIR / name).read_bytes() == (SHARED_CRD_DIR / name).read_bytes(), name
