"""deploy/kueue/: the example ResourceFlavor, ClusterQueue and LocalQueues, checked offline
against Kueue's CRDs (tests/fakekube/crds/kueue-*-crd.yaml, copies of ../shared/schemas, through the fake API server's
validator) and against what the portal's jobs ask for."""
from pathlib import Path

import pytest
import yaml

from runners import mpijob
from runners.base import JobSpec
from tests.fakekube import schema as crd

KUEUE = Path(__file__).resolve().parents[1] / "deploy" / "kueue"
PLURALS = {"ClusterQueue": "clusterqueues", "LocalQueue": "localqueues"}
# ResourceFlavor's CRD is not among the shared schemas: its v1beta1 spec fields, from Kueue's API.
FLAVOR_SPEC_FIELDS = {"nodeLabels", "nodeTaints", "tolerations", "topologyName"}


def documents():
    docs = [doc for path in sorted(KUEUE.glob("*.yaml")) for doc in yaml.safe_load_all(path.read_text()) if doc]
    assert docs, "deploy/kueue has no manifests"
    return docs


def of_kind(kind):
    return [doc for doc in documents() if doc["kind"] == kind]


def test_every_example_is_kueue_v1beta1_and_valid_against_its_crd():
    kinds = {doc["kind"] for doc in documents()}
    assert kinds == {"ResourceFlavor", "ClusterQueue", "LocalQueue"}
    for doc in documents():
        assert doc["apiVersion"] == "kueue.x-k8s.io/v1beta1", doc["metadata"]["name"]
        if doc["kind"] == "ResourceFlavor":
            assert set(doc.get("spec") or {}) <= FLAVOR_SPEC_FIELDS
            continue
        schema = crd.kueue_schema(PLURALS[doc["kind"]])
        assert schema.errors(doc) == [], doc["metadata"]["name"]
        assert schema.default_and_prune(doc)[1] == [], f"{doc['metadata']['name']}: fields Kueue would drop"


def test_the_validation_would_catch_a_broken_example():
    (queue,) = of_kind("ClusterQueue")
    queue["spec"]["preemption"]["withinClusterQueue"] = "Always"
    queue["spec"]["resourceGroups"][0]["flavors"][0]["resources"][0].pop("nominalQuota")
    fields = {cause["field"] for cause in crd.kueue_schema("clusterqueues").errors(queue)}
    assert fields == {"spec.preemption.withinClusterQueue",
                      "spec.resourceGroups[0].flavors[0].resources[0].nominalQuota"}


def test_the_queues_point_at_each_other_and_cover_what_the_portals_pods_request():
    (flavor,) = of_kind("ResourceFlavor")
    (queue,) = of_kind("ClusterQueue")
    locals_ = of_kind("LocalQueue")
    assert {q["spec"]["clusterQueue"] for q in locals_} == {queue["metadata"]["name"]}
    assert all(q["metadata"].get("namespace") for q in locals_)
    (group,) = queue["spec"]["resourceGroups"]
    assert [f["name"] for f in group["flavors"]] == [flavor["metadata"]["name"]]
    spec = JobSpec(job_id=1, gpus=16, python="python", script_name="", script_content=None, script_path="/t.py",
                   container_image="image")
    job = mpijob.new_mpijob(spec, mpijob.ClusterSpec(namespace="ringmaster", gpus_per_node=8, kueue_queue="team-queue"))
    requested = {name for replica in job["spec"]["mpiReplicaSpecs"].values()
                 for container in replica["template"]["spec"]["containers"]
                 for part in ("requests", "limits") for name in (container.get("resources") or {}).get(part, {})}
    assert requested and requested <= set(group["coveredResources"]), requested - set(group["coveredResources"])


@pytest.mark.parametrize("name", ["team-queue"])
def test_the_default_queue_of_the_guide_is_among_the_examples(name):
    assert name in {q["metadata"]["name"] for q in of_kind("LocalQueue")}
    assert f"--kueue-queue {name}" in (KUEUE.parent / "KUBERNETES.md").read_text()
