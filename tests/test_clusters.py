"""Clusters for the Kubernetes backend: registering one, submitting to one, and seeing the MPIJob
a job becomes (command and page), without a cluster to talk to."""
import io
import json

import pytest
import yaml
from django.contrib.auth.models import Group
from django.core.management import CommandError, call_command
from django.db import connection
from django.test.utils import CaptureQueriesContext

from jobs.backends.kubernetes.clusters import render
from jobs.backends.kubernetes.models import Cluster
from jobs.models import Image, Job
from runners import mpijob
from tests.conftest import job_name
from tests.clusterjobs import on_cluster

pytestmark = pytest.mark.django_db

# A cluster nobody listens on: everything here works without reaching it.
UNREACHABLE = "https://127.0.0.1:9"


def kubeconfig(server=UNREACHABLE, token="s3cr3t-token-value", context="prod"):
    return yaml.safe_dump({
        "apiVersion": "v1", "kind": "Config", "current-context": context,
        "clusters": [{"name": "c", "cluster": {"server": server, "insecure-skip-tls-verify": True}}],
        "users": [{"name": "u", "user": {"token": token}}],
        "contexts": [{"name": context, "context": {"cluster": "c", "user": "u", "namespace": "default"}}],
    })


def run(*args):
    out = io.StringIO()
    call_command(*args, stdout=out)
    return out.getvalue()


@pytest.fixture
def cluster(db):
    item = Cluster(name="gpu-east", namespace="training", gpus_per_node=8)
    item.set_kubeconfig(kubeconfig())
    item.save()
    return item


@pytest.fixture
def k8s_image(db):
    return Image.objects.create(name="horovod-gpu", container_image="registry.example/horovod:0.28.1",
                                python="python3")


def test_add_cluster_stores_the_kubeconfig_encrypted_and_reports_the_check(tmp_path):
    path = tmp_path / "kubeconfig"
    path.write_text(kubeconfig())
    out = run("add_cluster", "--name", "gpu-east", "--kubeconfig", str(path), "--namespace", "training",
              "--gpus-per-node", "8", "--node-selector", '{"gpu": "a100"}', "--kueue-queue", "team")
    assert "cluster gpu-east saved" in out
    assert "check: FAILED: cannot reach the API server: Failed to establish a new connection: [Errno 111] Connection refused" in out  # nobody listens
    cluster = Cluster.objects.get(name="gpu-east")
    assert (cluster.namespace, cluster.gpus_per_node, cluster.node_selector, cluster.kueue_queue) == (
        "training", 8, {"gpu": "a100"}, "team")
    assert cluster.kubeconfig() == kubeconfig()
    with connection.cursor() as cursor:
        cursor.execute("SELECT kubeconfig_encrypted FROM jobs_cluster")
        stored = cursor.fetchone()[0]
    assert "s3cr3t-token-value" not in stored and "127.0.0.1" not in stored
    # Running it again updates the same cluster.
    run("add_cluster", "--name", "gpu-east", "--kubeconfig", str(path), "--namespace", "team-{group}",
        "--gpus-per-node", "4", "--no-check")
    assert Cluster.objects.get().namespace == "team-{group}"


@pytest.mark.parametrize(("text", "message"), [
    ("not: [valid", "not valid YAML"),
    ("apiVersion: v1\n", "no clusters or contexts"),
    (kubeconfig(context="other").replace("current-context: other", "current-context: missing"), "no context 'missing'"),
])
def test_add_cluster_refuses_a_broken_kubeconfig_saying_why(tmp_path, text, message):
    path = tmp_path / "kubeconfig"
    path.write_text(text)
    with pytest.raises(CommandError, match=message):
        run("add_cluster", "--name", "x", "--kubeconfig", str(path), "--namespace", "n", "--gpus-per-node", "8")
    assert not Cluster.objects.exists()


def test_add_cluster_in_cluster_needs_no_kubeconfig():
    run("add_cluster", "--name", "here", "--in-cluster", "--namespace", "training", "--gpus-per-node", "8",
        "--no-check")
    assert Cluster.objects.get().connection == Cluster.Connection.IN_CLUSTER


@pytest.fixture
def alice_api(api_client, alice):
    return api_client(alice)


def submit(client, **data):
    body = {"image": "horovod-gpu", "gpus": 16, "script_path": "/examples/train.py", "backend": "kubernetes", **data}
    return client.post("/api/jobs/", body, format="json")


def test_a_kubernetes_job_goes_to_the_only_cluster(alice_api, cluster, k8s_image):
    """16 GPUs (2 workers of 8) out of the box: no hidden cap on a cluster without a GPU limit."""
    response = submit(alice_api)
    assert response.status_code == 201, response.json()
    assert response.json()["backend"] == "kubernetes" and response.json()["cluster"] == "gpu-east"


def test_with_two_clusters_the_job_must_name_one(alice_api, cluster, k8s_image):
    Cluster.objects.create(name="gpu-west", namespace="training", gpus_per_node=4)
    response = submit(alice_api)
    assert response.status_code == 400
    assert response.json()["cluster"] == ["Choose a cluster: gpu-east, gpu-west."]
    response = submit(alice_api, cluster="gpu-west")
    assert response.status_code == 201 and response.json()["cluster"] == "gpu-west"


def test_the_job_list_names_each_jobs_cluster_in_as_many_queries_for_many_jobs_as_for_two(alice, alice_api, cluster,
                                                                                      k8s_image):
    other = Cluster.objects.create(name="gpu-west", namespace="training", gpus_per_node=4)

    def job(on):
        return on_cluster(Job.objects.create(owner=alice, image=k8s_image, gpus=2, script_path="/t.py",
                                             backend="kubernetes", time_limit_minutes=5), on).pk

    def listed():
        with CaptureQueriesContext(connection) as captured:
            response = alice_api.get("/api/jobs/?limit=100")
        assert response.status_code == 200
        return {row["id"]: row["cluster"] for row in response.json()["results"]}, len(captured)

    expected = {job(cluster): "gpu-east", job(other): "gpu-west"}
    few, queries = listed()
    assert few == expected
    expected |= {job(cluster if i % 2 else other): "gpu-east" if i % 2 else "gpu-west" for i in range(20)}
    expected[job(None)] = None                                  # a job that names no cluster
    many, more_queries = listed()
    assert many == expected
    assert more_queries == queries


@pytest.mark.parametrize(("data", "field", "message"), [
    ({"cluster": "nowhere"}, "cluster", "No enabled cluster 'nowhere'. Available: gpu-east."),
    ({"image": "plain"}, "image", "Image plain has no container image, so it cannot run on Kubernetes."),
    ({"max_gpus": 8}, "max_gpus", "Most GPUs must be at least GPUs (16)."),
])
def test_bad_kubernetes_input_names_the_field(alice_api, cluster, k8s_image, data, field, message):
    Image.objects.create(name="plain")
    response = submit(alice_api, **data)
    assert response.status_code == 400 and response.json()[field] == [message]
    assert not Job.objects.exists()


def test_an_elastic_kubernetes_job_grows_by_whole_workers_within_the_clusters_limit(alice_api, cluster, k8s_image):
    Cluster.objects.filter(pk=cluster.pk).update(gpu_limit=24)
    response = submit(alice_api, max_gpus=24)
    assert response.status_code == 201 and response.json()["max_gpus"] == 24
    kind, document = render(Job.objects.get())     # 16 to 24 GPUs on 8-GPU nodes: 2 to 3 workers of 8
    assert document["spec"]["slotsPerWorker"] == 8 and document["spec"]["mpiReplicaSpecs"]["Worker"]["replicas"] == 2
    assert document["metadata"]["annotations"] == {mpijob.BOUNDS_ANNOTATION: "2-3"}


def test_a_namespace_per_group_needs_a_group(alice_api, alice, cluster, k8s_image):
    cluster.namespace = "team-{group}"
    cluster.save()
    response = submit(alice_api)
    assert response.status_code == 400 and "charge the job to a group" in response.json()["group"][0]
    vision = Group.objects.create(name="Vision_Lab")
    vision.user_set.add(alice)
    response = submit(alice_api, group="Vision_Lab")
    assert response.status_code == 201
    job = Job.objects.get()
    out = run("render_mpijob", str(job.pk))
    assert json.loads(out)["metadata"]["namespace"] == "team-vision-lab"


def test_render_mpijob_prints_the_valid_mpijob_without_reaching_the_cluster(alice_api, cluster, k8s_image):
    job_id = submit(alice_api, args=["--epochs", "3"], env={"LR": "0.1"}).json()["id"]
    document = json.loads(run("render_mpijob", str(job_id)))
    assert document["metadata"]["name"] == job_name(job_id)
    assert document["spec"]["slotsPerWorker"] == 8
    assert document["spec"]["mpiReplicaSpecs"]["Worker"]["replicas"] == 2
    assert mpijob.schema_problems(document) == [] and mpijob.controller_problems(document) == []
    command = document["spec"]["mpiReplicaSpecs"]["Launcher"]["template"]["spec"]["containers"][0]["command"]
    assert command[-4:] == ["python3", "/examples/train.py", "--epochs", "3"] and "LR" in command


def test_render_mpijob_refuses_other_backends_and_unknown_jobs(make_user, image):
    job = Job.objects.create(owner=make_user("alice"), image=image, gpus=1, script_path="t.py",
                             backend="local", time_limit_minutes=5)
    with pytest.raises(CommandError, match="local backend"):
        run("render_mpijob", str(job.pk))
    with pytest.raises(CommandError, match="no job 999999"):
        run("render_mpijob", "999999")


def test_the_job_page_links_the_mpijob_which_only_its_owner_and_staff_see(
        client, alice_api, make_user, cluster, k8s_image):
    job_id = submit(alice_api).json()["id"]
    client.force_login(Job.objects.get().owner)
    page = client.get(f"/jobs/{job_id}/").content.decode()
    assert f'href="/jobs/{job_id}/mpijob/"' in page and "View MPIJob" in page
    shown = client.get(f"/jobs/{job_id}/mpijob/")
    assert shown.status_code == 200 and job_name(job_id) in shown.content.decode()
    document = client.get(f"/jobs/{job_id}/mpijob/?format=json").json()
    assert document == json.loads(run("render_mpijob", str(job_id)))
    client.force_login(make_user("mallory"))
    assert client.get(f"/jobs/{job_id}/mpijob/").status_code == 404
    assert client.get(f"/jobs/{job_id}/mpijob/?format=json").status_code == 404
    client.force_login(make_user("root", is_staff=True))
    assert client.get(f"/jobs/{job_id}/mpijob/").status_code == 200


def test_the_job_form_offers_kubernetes_only_when_a_cluster_exists(client, make_user, k8s_image):
    client.force_login(make_user("alice"))
    assert 'value="kubernetes"' not in client.get("/jobs/new/").content.decode()
    Cluster.objects.create(name="gpu-east", namespace="training", gpus_per_node=8)
    page = client.get("/jobs/new/").content.decode()
    assert 'value="kubernetes"' in page and "gpu-east" in page


def test_the_admin_never_shows_a_stored_kubeconfig(client, make_user, cluster):
    client.force_login(make_user("root", is_staff=True, is_superuser=True))
    page = client.get(f"/admin/kubernetes/cluster/{cluster.pk}/change/").content.decode()
    assert "s3cr3t-token-value" not in page and cluster.kubeconfig_encrypted not in page


def test_make_runs_seed_registers_the_cluster_kubeconfig_names(tmp_path, monkeypatch):
    path = tmp_path / "config"
    path.write_text(kubeconfig())
    monkeypatch.setenv("KUBECONFIG", str(path))
    monkeypatch.setenv("RINGMASTER_KUBE_GPUS_PER_NODE", "4")
    out = run("seed_demo")
    assert "cluster default saved" in out
    cluster = Cluster.objects.get(name="default")
    assert (cluster.namespace, cluster.gpus_per_node) == ("default", 4)
    assert Image.objects.get(name="horovod-0.28.1").container_image == "horovod/horovod:0.28.1"
    run("seed_demo")
    assert Cluster.objects.count() == 1


def test_the_default_backend_is_a_setting(alice_api, cluster, k8s_image, settings):
    settings.RINGMASTER_DEFAULT_BACKEND = "kubernetes"
    response = alice_api.post("/api/jobs/", {"image": "horovod-gpu", "gpus": 2, "script_path": "/t.py"},
                              format="json")
    assert response.status_code == 201 and response.json()["backend"] == "kubernetes"


def test_a_clusters_gpu_limit_holds_jobs_in_the_portals_queue_with_the_reason(alice, cluster, k8s_image):
    from jobs.domain import scheduler

    cluster.gpu_limit = 4
    cluster.save()
    other = Cluster.objects.create(name="gpu-west", namespace="training", gpus_per_node=8)

    def job(on, gpus=2):
        return on_cluster(Job.objects.create(owner=alice, image=k8s_image, gpus=gpus, script_path="/t.py",
                                             backend="kubernetes", time_limit_minutes=5), on).pk

    first, second, third, elsewhere = job(cluster), job(cluster), job(cluster), job(other, 8)
    assert sorted(scheduler.admit()) == sorted([first, second, elsewhere])
    waiting = Job.objects.get(pk=third)
    assert waiting.state == "QUEUED"
    assert waiting.reason == "waiting for capacity on cluster gpu-east: 4 of 4 GPUs in use, this job needs 2"
    Job.objects.filter(pk=first).update(state="SUCCEEDED")
    assert scheduler.admit() == [third]


def test_a_job_larger_than_the_clusters_gpu_limit_is_refused_naming_it(alice_api, cluster, k8s_image):
    cluster.gpu_limit = 8
    cluster.save()
    response = submit(alice_api, gpus=16)
    assert response.status_code == 400
    assert response.json()["gpus"] == ["Cluster gpu-east runs at most 8 GPUs at once."]
    response = submit(alice_api, gpus=8, max_gpus=16)            # nor may an elastic job grow past it
    assert response.status_code == 400
    assert response.json()["max_gpus"] == ["Cluster gpu-east runs at most 8 GPUs at once."]


def test_the_staff_cluster_page_shows_each_clusters_use_and_limit(client, make_user, alice, cluster, k8s_image):
    cluster.gpu_limit = 16
    cluster.save()
    for state in ("RUNNING", "LAUNCHING", "QUEUED", "SUCCEEDED"):
        on_cluster(Job.objects.create(owner=alice, image=k8s_image, gpus=4, script_path="/t.py", state=state,
                                      backend="kubernetes", time_limit_minutes=5), cluster)
    client.force_login(make_user("root", is_staff=True))
    page = client.get("/capacity/").content.decode()
    row = page[page.index('data-cluster="gpu-east"'):].split("</tr>")[0]
    cells = [cell.split(">", 1)[1].split("<")[0] for cell in row.split("<td")[1:]]
    assert cells[2:6] == ["8", "16", "2", "1"]          # in use, limit, active, queued


def test_the_admins_check_action_reports_an_unreachable_cluster(client, make_user, cluster):
    client.force_login(make_user("root", is_staff=True, is_superuser=True))
    page = client.post("/admin/kubernetes/cluster/", {"action": "check_now", "_selected_action": [cluster.pk]},
                       follow=True).content.decode()
    assert "gpu-east: failed: cannot reach the api server: failed to establish a new connection: [errno 111] connection refused" in page.lower()
    assert "s3cr3t-token-value" not in page


@pytest.mark.parametrize(("option", "value", "message"), [
    ("--namespace", "Team_A", "namespace: Must be a namespace name"),
    ("--kueue-queue", "bad queue!", "kueue_queue: Must be a valid label value"),
    ("--node-selector", '{"gpu": 1}', "node_selector: Must be an object of label names to strings"),
    ("--tolerations", '[{"key": "gpu", "tolerationSeconds": "soon"}]', "tolerations: "),
])
def test_add_cluster_refuses_settings_no_mpijob_could_have_naming_the_field(tmp_path, option, value, message):
    path = tmp_path / "kubeconfig"
    path.write_text(kubeconfig())
    argv = {"--namespace": "training", "--gpus-per-node": "8", option: value}
    with pytest.raises(CommandError, match=message):
        run("add_cluster", "--name", "x", "--kubeconfig", str(path), "--no-check",
            *[word for pair in argv.items() for word in pair])
    assert not Cluster.objects.exists()


def _admin_errors(client, url, data):
    """The field errors the admin's form shows for `data` (nothing is saved)."""
    response = client.post(url, data)
    assert response.status_code == 200                       # the form again, not a redirect
    return {name: list(errors) for name, errors in response.context["adminform"].form.errors.items()}


@pytest.mark.parametrize(("field", "option", "named", "value"), [
    ("namespace", "--namespace", "--namespace", "Team_A"),
    ("kueue_queue", "--kueue-queue", "--kueue-queue/kueue_queue", "bad queue!"),
])
def test_the_admin_and_add_cluster_give_one_verdict_from_one_form(client, make_user, tmp_path, field, option, named,
                                                                   value):
    client.force_login(make_user("root", is_staff=True, is_superuser=True))
    data = {"name": "x", "enabled": "on", "connection": "kubeconfig", "kubeconfig": kubeconfig(), "context": "",
            "namespace": "training", "gpus_per_node": "8", "node_selector": "{}", "tolerations": "[]",
            "mpijob_command": "mpirun", "training_runtime": "torch-distributed", "cpu_per_gpu": "4", "memory_per_gpu_gib": "16", "clean_pod_policy": "Running",
            "backoff_limit": "0", "ttl_seconds_after_finished": "3600", "image_pull_grace_seconds": "300",
            field: value}
    shown = _admin_errors(client, "/admin/kubernetes/cluster/add/", data)
    path = tmp_path / "kubeconfig"
    path.write_text(kubeconfig())
    argv = {"--namespace": "training", "--gpus-per-node": "8", option: value}
    with pytest.raises(CommandError) as refused:
        run("add_cluster", "--name", "x", "--kubeconfig", str(path), "--no-check",
            *[word for pair in argv.items() for word in pair])
    assert str(refused.value) == f"{named}: {' '.join(shown[field])}"
    assert not Cluster.objects.exists()


def test_the_admin_and_add_instance_refuse_a_key_that_is_not_one_alike(client, make_user, tmp_path):
    from jobs.backends.instances.models import Instance

    client.force_login(make_user("root", is_staff=True, is_superuser=True))
    shown = _admin_errors(client, "/admin/instances/instance/add/", {
        "name": "gpu-a", "host": "127.0.0.2", "port": "22", "user": "root", "gpus": "2", "enabled": "on",
        "work_dir": ".ringmaster/jobs", "private_key": "not a key"})
    path = tmp_path / "key"
    path.write_text("not a key")
    with pytest.raises(CommandError) as refused:
        run("add_instance", "--name", "gpu-a", "--host", "127.0.0.2", "--user", "root", "--key-file", str(path),
            "--gpus", "2", "--no-check")
    assert str(refused.value) == f"--key-file: {' '.join(shown['private_key'])}"
    assert not Instance.objects.exists()


def test_add_instance_updates_the_instance_of_that_name_from_its_options(tmp_path):
    """Run again, the command sets every option it was given and clears the ones it was not (the
    work dir is kept); another host forgets the recorded host key."""
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

    from jobs.backends.instances.models import Instance

    path = tmp_path / "key"
    path.write_bytes(Ed25519PrivateKey.generate().private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.OpenSSH, serialization.NoEncryption()))
    common = ["add_instance", "--name", "gpu-a", "--user", "root", "--key-file", str(path), "--no-check"]
    run(*common, "--host", "127.0.0.2", "--gpus", "2", "--work-dir", "/scratch", "--peer-ssh-port", "2222")
    Instance.objects.update(host_key="ssh-ed25519 AAAA")
    run(*common, "--host", "127.0.0.3", "--gpus", "4")
    instance = Instance.objects.get()
    assert (instance.host, instance.gpus, instance.work_dir, instance.peer_ssh_port, instance.host_key) == (
        "127.0.0.3", 4, "/scratch", None, "")
    assert instance.private_key() == path.read_text()
    with pytest.raises(CommandError, match=r"^--gpus: Must be at least 1\.$"):
        run(*common, "--host", "127.0.0.3", "--gpus", "0")
