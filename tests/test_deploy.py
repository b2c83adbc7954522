"""deploy/: the portal's images and its Kubernetes manifests, checked offline.

Pure and fast: no cluster, no Docker, no database, no network. The manifests are validated with
kubernetes-validate's bundled schemas (strict: unknown fields fail) for one fixed Kubernetes
version, and cross-checked against what the code really reads and runs (portal/settings.py,
deploy/Procfile, deploy/docker-entrypoint.sh, portal/urls.py).
"""
import copy
import fnmatch
import functools
import json
import os
import re
import shlex
import shutil
import socket
import stat
import subprocess
import urllib.request
from pathlib import Path

import kubernetes_validate
import pytest
import yaml

ROOT = Path(__file__).resolve().parent.parent
DEPLOY = ROOT / "deploy"
KUBE = DEPLOY / "kubernetes"
ENTRYPOINT = DEPLOY / "docker-entrypoint.sh"

# The Kubernetes version the manifests are validated for (kubernetes-validate 1.37.0 bundles
# schemas 1.28 to 1.37; 1.33 is a release every supported managed Kubernetes offers).
KUBERNETES_VERSION = "1.33"

PORTAL_IMAGE = "ringmaster"           # the image name the manifests use; kustomization rewrites it
PORTAL_COMPONENTS = ("web", "worker", "beat")
MUST_HAVE_ENV = {"DATABASE_URL", "REDIS_URL", "SECRET_KEY", "RINGMASTER_FERNET_KEYS"}

# (apiGroup, resource, verb): exactly what the MPIJob backend needs, nothing more.
EXPECTED_RULES = {
    *(("kubeflow.org", "mpijobs", v) for v in ("create", "get", "list", "watch", "delete", "patch")),
    *(("", "configmaps", v) for v in ("create", "get", "delete")),
    *(("", "pods", v) for v in ("get", "list", "watch", "delete")),
    ("", "pods/log", "get"),
    *(("", "events", v) for v in ("get", "list", "watch")),
}


# --- loading ---------------------------------------------------------------------------------

def kustomization():
    return yaml.safe_load((KUBE / "kustomization.yaml").read_text())


Loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


def load_documents(path):
    return [doc for doc in yaml.load_all(Path(path).read_text(), Loader=Loader) if doc]


@functools.lru_cache(maxsize=None)
def _parsed(path, mtime):
    return tuple(load_documents(path))


def resources():
    """Every document of every file the kustomization lists, as (file name, document).
    Parsed once per file version; a test that changes a document works on a deep copy."""
    return [(name, doc) for name in kustomization()["resources"]
            for doc in _parsed(KUBE / name, (KUBE / name).stat().st_mtime_ns)]


def of_kind(kind):
    return [doc for _, doc in resources() if doc["kind"] == kind]


def named(kind, name):
    found = [doc for doc in of_kind(kind) if doc["metadata"]["name"] == name]
    assert len(found) == 1, f"expected exactly one {kind} {name}, found {len(found)}"
    return found[0]


def workloads():
    return [doc for _, doc in resources() if doc["kind"] in ("Deployment", "StatefulSet", "Job")]


def component(name):
    """The workload of one portal component (web, worker, beat), by its component label."""
    found = [w for w in workloads()
             if w["spec"]["template"]["metadata"]["labels"].get("app.kubernetes.io/component") == name]
    assert len(found) == 1, f"expected one workload labelled component={name}, found {len(found)}"
    return found[0]


def pod_spec(workload):
    return workload["spec"]["template"]["spec"]


def all_containers(spec):
    return [*spec.get("initContainers", []), *spec["containers"]]


def portal_containers():
    """Every container (init ones included) that runs the portal image, with its workload name."""
    return [(w["metadata"]["name"], c) for w in workloads() for c in all_containers(pod_spec(w))
            if c["image"] == PORTAL_IMAGE]


def settings_env_vars():
    """The environment variables portal/settings.py reads, from its text."""
    text = (ROOT / "portal" / "settings.py").read_text()
    names = set(re.findall(
        r"""(?:os\.environ\.get|os\.getenv|env_[a-z_]+)\(\s*["']([A-Z][A-Z0-9_]*)["']""", text))
    names |= set(re.findall(r"""os\.environ\[\s*["']([A-Z][A-Z0-9_]*)["']\s*\]""", text))
    return names


def entrypoint_env_vars():
    """Variables deploy/docker-entrypoint.sh itself reads (host, port, worker concurrency...)."""
    return set(re.findall(r"\$\{?([A-Z][A-Z0-9_]*)", ENTRYPOINT.read_text()))


def container_env(container):
    """name -> where it comes from, for every variable a container gets (env and envFrom)."""
    env = {}
    for source in container.get("envFrom", []):
        if "configMapRef" in source:
            config = named("ConfigMap", source["configMapRef"]["name"])
            keys = config.get("data", {})
        else:
            secret = named("Secret", source["secretRef"]["name"])
            keys = {**secret.get("data", {}), **secret.get("stringData", {})}
        env.update({key: source for key in keys})
    for item in container.get("env", []):
        ref = item.get("valueFrom", {})
        if "configMapKeyRef" in ref:
            assert ref["configMapKeyRef"]["key"] in named("ConfigMap", ref["configMapKeyRef"]["name"])["data"]
        if "secretKeyRef" in ref:
            secret = named("Secret", ref["secretKeyRef"]["name"])
            assert ref["secretKeyRef"]["key"] in {**secret.get("data", {}), **secret.get("stringData", {})}
        env[item["name"]] = item
    return env


def dockerfile(path):
    """[(INSTRUCTION, arguments)], continuation lines joined, comments dropped, ARGs before the
    first FROM substituted into FROM (the way `docker build` does without --build-arg)."""
    lines, current = [], ""
    for raw in Path(path).read_text().splitlines():
        stripped = raw.strip()
        if not current and (not stripped or stripped.startswith("#")):
            continue
        if current and stripped.startswith("#"):
            continue
        if stripped.endswith("\\"):
            current += stripped[:-1] + " "
            continue
        current += stripped
        lines.append(current)
        current = ""
    instructions, global_args = [], {}
    for line in lines:
        word, _, rest = line.partition(" ")
        word, rest = word.upper(), rest.strip()
        if word == "ARG" and not any(i == "FROM" for i, _ in instructions):
            name, _, default = rest.partition("=")
            global_args[name] = default
        if word == "FROM":
            rest = re.sub(r"\$\{?(\w+)\}?", lambda m: global_args.get(m.group(1), m.group(0)), rest)
        instructions.append((word, rest))
    return instructions


def instruction_text(instructions, word):
    return "\n".join(rest for w, rest in instructions if w == word)


@pytest.fixture
def no_network(monkeypatch):
    """Fail loudly if anything tries to reach the network (schemas must come from the package)."""
    def refuse(*args, **kwargs):
        raise AssertionError(f"network access attempted: {args!r}")

    monkeypatch.setattr(socket.socket, "connect", refuse)
    monkeypatch.setattr(socket.socket, "connect_ex", refuse)
    monkeypatch.setattr(socket, "create_connection", refuse)
    monkeypatch.setattr(socket, "getaddrinfo", refuse)
    monkeypatch.setattr(urllib.request, "urlopen", refuse)


# --- the kustomization -----------------------------------------------------------------------

def test_kustomization_lists_every_manifest_and_only_existing_ones():
    listed = kustomization()["resources"]
    assert len(listed) == len(set(listed)), "a resource is listed twice"
    for name in listed:
        assert (KUBE / name).is_file(), f"kustomization.yaml lists {name}, which does not exist"
    on_disk = {p.name for p in KUBE.iterdir() if p.suffix in (".yaml", ".yml")} - {"kustomization.yaml"}
    assert on_disk - set(listed) == set(), "manifests in deploy/kubernetes/ that kustomization.yaml leaves out"
    assert set(listed) == on_disk


def test_kustomization_sets_namespace_and_rewrites_the_portal_image():
    kust = kustomization()
    assert kust["namespace"] == "ringmaster"
    images = {image["name"]: image for image in kust["images"]}
    assert images[PORTAL_IMAGE]["newName"] and images[PORTAL_IMAGE]["newTag"]
    used = {c["image"] for w in workloads() for c in all_containers(pod_spec(w))}
    assert used <= set(images), f"images with no entry in kustomization.yaml images: {used - set(images)}"
    assert named("Namespace", kust["namespace"])


def test_every_resource_kind_is_expected():
    kinds = {doc["kind"] for _, doc in resources()}
    assert {"Namespace", "ServiceAccount", "Role", "RoleBinding", "ConfigMap", "Secret", "Service",
            "Deployment", "StatefulSet", "Ingress"} <= kinds
    assert not kinds & {"ClusterRole", "ClusterRoleBinding"}, "the portal must have no cluster-wide rights"


# --- schema validation -----------------------------------------------------------------------

def _documents():
    # At collection time: a listed file that is missing fails the test above, not the collection.
    return [pytest.param(doc, id=f"{name}:{doc['kind']}/{doc['metadata']['name']}")
            for name in kustomization()["resources"] if (KUBE / name).is_file()
            for doc in load_documents(KUBE / name)]


@pytest.mark.parametrize("document", _documents())
def test_manifest_validates_against_the_kubernetes_schema(document, no_network):
    validated = kubernetes_validate.validate(document, KUBERNETES_VERSION, strict=True)
    assert validated == KUBERNETES_VERSION


def test_strict_validation_rejects_unknown_and_mistyped_fields(no_network):
    """The check above is real: the same validator fails a typo and a wrong type."""
    web = component("web")
    typo = copy.deepcopy(web)
    pod_spec(typo)["containers"][0]["readinessProbe"]["httpGett"] = {"path": "/"}
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(typo, KUBERNETES_VERSION, strict=True)
    wrong_type = copy.deepcopy(web)
    wrong_type["spec"]["replicas"] = "one"
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(wrong_type, KUBERNETES_VERSION, strict=True)


def test_no_network_fixture_really_blocks(no_network):
    with pytest.raises(AssertionError, match="network access"):
        socket.create_connection(("127.0.0.1", 9))


@pytest.mark.skipif(shutil.which("kubectl") is None, reason="kubectl (for `kubectl kustomize`) not installed")
def test_kustomize_build_output_validates_and_is_rewritten(no_network):
    out = subprocess.run(["kubectl", "kustomize", str(KUBE)], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    built = [doc for doc in yaml.safe_load_all(out.stdout) if doc]
    assert len(built) == len(resources())
    image = {i["name"]: i for i in kustomization()["images"]}[PORTAL_IMAGE]
    for doc in built:
        kubernetes_validate.validate(doc, KUBERNETES_VERSION, strict=True)
        if doc["kind"] != "Namespace":
            assert doc["metadata"]["namespace"] == "ringmaster", doc["metadata"]["name"]
        if doc["kind"] in ("Deployment", "StatefulSet"):
            for c in all_containers(doc["spec"]["template"]["spec"]):
                assert c["image"] != PORTAL_IMAGE
                if c["name"] in ("web", "worker", "beat", "migrate", "wait-for-migrations"):
                    assert c["image"] == f"{image['newName']}:{image['newTag']}"


# --- RBAC ------------------------------------------------------------------------------------

def rule_triples(rules):
    triples = set()
    for rule in rules:
        assert set(rule) == {"apiGroups", "resources", "verbs"}, f"unexpected rule fields: {rule}"
        for group in rule["apiGroups"]:
            for resource in rule["resources"]:
                for verb in rule["verbs"]:
                    assert "*" not in (group, resource, verb), f"wildcard in {rule}"
                    triples.add((group, resource, verb))
    return triples


def test_role_grants_exactly_what_the_portal_needs():
    (role,) = of_kind("Role")
    assert rule_triples(role["rules"]) == EXPECTED_RULES


def test_rule_check_notices_an_added_or_removed_verb():
    (role,) = of_kind("Role")
    more, fewer = copy.deepcopy(role["rules"]), copy.deepcopy(role["rules"])
    more[0]["verbs"].append("update")
    fewer[0]["verbs"].remove("delete")
    assert rule_triples(more) != EXPECTED_RULES
    assert rule_triples(fewer) != EXPECTED_RULES


def test_role_binding_binds_the_role_to_the_portals_service_account():
    (role,) = of_kind("Role")
    (binding,) = of_kind("RoleBinding")
    (account,) = of_kind("ServiceAccount")
    assert binding["roleRef"] == {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role",
                                  "name": role["metadata"]["name"]}
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": account["metadata"]["name"],
                                    "namespace": kustomization()["namespace"]}]
    for name in PORTAL_COMPONENTS:
        assert pod_spec(component(name))["serviceAccountName"] == account["metadata"]["name"], name
    for workload in workloads():
        if pod_spec(workload).get("serviceAccountName") != account["metadata"]["name"]:
            assert pod_spec(workload)["automountServiceAccountToken"] is False, workload["metadata"]["name"]


def test_commented_example_for_another_namespace_matches_the_role():
    text = (KUBE / "rbac.yaml").read_text()
    example = text.split("# --- Jobs in another namespace", 1)[1]
    uncommented = "\n".join(re.sub(r"^# ?", "", line) for line in example.splitlines()[1:]
                            if line.startswith("#") and not line.startswith("# ---") or line == "# ---")
    docs = [d for d in yaml.safe_load_all(uncommented.split("\n---\n", 1)[1]) if isinstance(d, dict)]
    role = next(d for d in docs if d["kind"] == "Role")
    binding = next(d for d in docs if d["kind"] == "RoleBinding")
    (real_binding,) = of_kind("RoleBinding")
    assert rule_triples(role["rules"]) == EXPECTED_RULES
    assert role["metadata"]["namespace"] == binding["metadata"]["namespace"] != "ringmaster"
    assert binding["subjects"] == real_binding["subjects"]
    assert binding["roleRef"] == real_binding["roleRef"]
    for doc in docs:
        kubernetes_validate.validate(doc, KUBERNETES_VERSION, strict=True)


# --- environment -----------------------------------------------------------------------------

def test_settings_parser_finds_the_variables_it_should():
    found = settings_env_vars()
    assert MUST_HAVE_ENV | {"ALLOWED_HOSTS", "CSRF_TRUSTED_ORIGINS", "SECURE_COOKIES", "DATABASE_CONN_MAX_AGE",
                            "RINGMASTER_DATA_DIR", "RINGMASTER_LOCAL_GPUS", "LOG_LEVEL"} <= found
    assert "NOT_A_SETTING" not in found


def test_every_variable_the_portal_containers_get_is_one_the_portal_reads():
    known = settings_env_vars() | entrypoint_env_vars()
    containers = portal_containers()
    assert {name for name, _ in containers} >= {"ringmaster-web", "ringmaster-worker", "ringmaster-beat"}
    for workload, container in containers:
        unknown = set(container_env(container)) - known
        assert not unknown, f"{workload}/{container['name']} sets variables nothing reads: {sorted(unknown)}"


@pytest.mark.parametrize("name", PORTAL_COMPONENTS)
def test_web_worker_and_beat_get_the_must_have_variables(name):
    for container in all_containers(pod_spec(component(name))):
        assert container["image"] == PORTAL_IMAGE
        missing = MUST_HAVE_ENV - set(container_env(container))
        assert not missing, f"{name}/{container['name']} lacks {sorted(missing)}"


def test_the_three_components_share_one_configuration():
    """Web, worker and beat read the same ConfigMap and Secret (the Fernet keys must agree)."""
    sources = {name: [json.dumps(s, sort_keys=True) for s in pod_spec(component(name))["containers"][0]["envFrom"]]
               for name in PORTAL_COMPONENTS}
    assert sources["web"] == sources["worker"] == sources["beat"]


def test_public_host_and_probe_host_are_allowed():
    config = named("ConfigMap", "ringmaster-config")["data"]
    allowed = [h.strip() for h in config["ALLOWED_HOSTS"].split(",")]
    origins = [o.strip() for o in config["CSRF_TRUSTED_ORIGINS"].split(",")]
    for ingress in of_kind("Ingress"):
        tls_hosts = {h for t in ingress["spec"].get("tls", []) for h in t["hosts"]}
        for rule in ingress["spec"]["rules"]:
            assert rule["host"] in allowed
            scheme = "https" if rule["host"] in tls_hosts else "http"
            assert f"{scheme}://{rule['host']}" in origins
    for container in pod_spec(component("web"))["containers"]:
        for probe in ("readinessProbe", "livenessProbe"):
            headers = {h["name"].lower(): h["value"] for h in container[probe]["httpGet"].get("httpHeaders", [])}
            assert headers.get("host") in allowed, f"{probe} would get 400 DisallowedHost"


# --- programs --------------------------------------------------------------------------------

def _stub_bin(directory, log):
    """uvicorn, celery and python that only record how they were called."""
    directory.mkdir(parents=True, exist_ok=True)
    for program in ("uvicorn", "celery", "python"):
        stub = directory / program
        stub.write_text(f'#!/bin/sh\n{{ echo "{program}"; for a in "$@"; do echo "$a"; done; }} > "{log}"\n')
        stub.chmod(stub.stat().st_mode | stat.S_IXUSR)


def _procfile():
    entries = {}
    for line in (DEPLOY / "Procfile").read_text().splitlines():
        if line.strip() and not line.startswith("#"):
            name, _, command = line.partition(":")
            entries[name.strip()] = command.strip()
    return entries


def _run(argv, cwd, path_dir, log):
    env = {"PATH": f"{path_dir}:/usr/bin:/bin", "RINGMASTER_HOST": "0.0.0.0", "RINGMASTER_PORT": "8000",
           "RINGMASTER_DATA_DIR": "/data"}
    subprocess.run(argv, cwd=cwd, env=env, check=True, timeout=30)
    return log.read_text().splitlines()


@pytest.mark.parametrize("name", PORTAL_COMPONENTS)
def test_entrypoint_starts_what_the_procfile_starts(name, tmp_path):
    """Run both (with stand-ins for uvicorn and celery) and compare the argv they exec."""
    log = tmp_path / "argv"
    _stub_bin(tmp_path / ".venv" / "bin", log)          # the Procfile calls .venv/bin/<program>
    _stub_bin(tmp_path / "bin", log)                    # the image has them on PATH
    from_procfile = _run(["sh", "-c", _procfile()[name]], tmp_path, tmp_path / "bin", log)
    from_entrypoint = _run(["sh", str(ENTRYPOINT), name], tmp_path, tmp_path / "bin", log)
    assert from_entrypoint == from_procfile
    assert from_entrypoint[0] in ("uvicorn", "celery")


def test_the_web_server_speaks_websockets_with_the_portals_protocol(tmp_path):
    """Its frames compressed at level 1 (portal/websocket.py; the tests' server runs the same)."""
    from uvicorn.importer import import_from_string

    from portal.websocket import WebSocketProtocol

    log = tmp_path / "argv"
    _stub_bin(tmp_path / ".venv" / "bin", log)
    argv = _run(["sh", "-c", _procfile()["web"]], tmp_path, tmp_path / "bin", log)
    assert import_from_string(argv[argv.index("--ws") + 1]) is WebSocketProtocol


def test_entrypoint_runs_migrations_and_manage_commands(tmp_path):
    log = tmp_path / "argv"
    _stub_bin(tmp_path / "bin", log)
    assert _run(["sh", str(ENTRYPOINT), "migrate"], tmp_path, tmp_path / "bin", log) == [
        "python", "manage.py", "migrate", "--noinput"]
    assert _run(["sh", str(ENTRYPOINT), "manage", "createsuperuser"], tmp_path, tmp_path / "bin", log) == [
        "python", "manage.py", "createsuperuser"]
    assert _run(["sh", str(ENTRYPOINT), "wait-for-migrations"], tmp_path, tmp_path / "bin", log) == [
        "python", "manage.py", "migrate", "--check"]


def test_manifests_run_the_image_entrypoint_with_the_component_name():
    instructions = dockerfile(DEPLOY / "Dockerfile")
    entrypoint = json.loads(instruction_text(instructions, "ENTRYPOINT"))
    assert entrypoint == ["/app/deploy/docker-entrypoint.sh"]      # COPY . /app puts deploy/ there
    assert os.access(ENTRYPOINT, os.X_OK)
    for name in PORTAL_COMPONENTS:
        spec = pod_spec(component(name))
        main = spec["containers"][0]
        assert "command" not in main, f"{name} must not bypass the entrypoint"
        assert main["args"] == [name]
        for init in spec.get("initContainers", []):
            assert "command" not in init and init["args"][0] in ("migrate", "wait-for-migrations")
    inits = {c["args"][0] for c in pod_spec(component("web")).get("initContainers", [])}
    assert "migrate" in inits, "nothing applies the migrations"


def test_beat_runs_once_and_never_twice():
    beat = component("beat")
    assert beat["kind"] == "Deployment"
    assert beat["spec"]["replicas"] == 1
    assert beat["spec"]["strategy"] == {"type": "Recreate"}


def test_web_probes_a_page_that_needs_no_login():
    from django.urls import resolve

    container = pod_spec(component("web"))["containers"][0]
    ports = {p["name"] for p in container["ports"]}
    for probe in ("readinessProbe", "livenessProbe"):
        get = container[probe]["httpGet"]
        assert get["port"] in ports
        match = resolve(get["path"])
        assert match.url_name == "login", f"{get['path']} is not the login page"


def test_services_and_ingress_point_at_something():
    pods = [w["spec"]["template"] for w in workloads()]
    for service in of_kind("Service"):
        selector = service["spec"]["selector"]
        selected = [p for p in pods if selector.items() <= p["metadata"]["labels"].items()]
        assert len(selected) == 1, f"Service {service['metadata']['name']} selects {len(selected)} workloads"
        port_names = {p.get("name") for c in selected[0]["spec"]["containers"] for p in c.get("ports", [])}
        for port in service["spec"]["ports"]:
            assert port["targetPort"] in port_names
    services = {s["metadata"]["name"]: s for s in of_kind("Service")}
    for ingress in of_kind("Ingress"):
        for rule in ingress["spec"]["rules"]:
            for path in rule["http"]["paths"]:
                backend = path["backend"]["service"]
                assert backend["port"]["name"] in {p["name"] for p in services[backend["name"]]["spec"]["ports"]}
    (postgres,) = of_kind("StatefulSet")
    assert postgres["spec"]["serviceName"] in services
    assert postgres["spec"]["volumeClaimTemplates"]


def test_every_pod_runs_as_non_root_without_privilege_escalation():
    for workload in workloads():
        spec = pod_spec(workload)
        assert spec["securityContext"]["runAsNonRoot"] is True, workload["metadata"]["name"]
        assert spec["securityContext"].get("runAsUser", 1) != 0
        for container in all_containers(spec):
            where = f"{workload['metadata']['name']}/{container['name']}"
            assert container["securityContext"]["allowPrivilegeEscalation"] is False, where
            assert container["securityContext"]["capabilities"]["drop"] == ["ALL"], where
            assert container["resources"]["requests"] and container["resources"]["limits"]["memory"], where
    for _, container in portal_containers():
        assert container["securityContext"]["readOnlyRootFilesystem"] is True


def test_portal_user_in_the_image_is_the_one_the_pods_run_as():
    user = instruction_text(dockerfile(DEPLOY / "Dockerfile"), "USER").splitlines()[-1]
    uid = user.split(":")[0]
    assert uid.isdigit() and uid != "0", "USER must be numeric and not root (runAsNonRoot checks it)"
    for name in PORTAL_COMPONENTS:
        assert str(pod_spec(component(name))["securityContext"]["runAsUser"]) == uid


# --- Dockerfiles (light) ---------------------------------------------------------------------

def test_portal_dockerfile():
    instructions = dockerfile(DEPLOY / "Dockerfile")
    assert instructions[0] == ("FROM", "python:3.11-slim")
    run = instruction_text(instructions, "RUN")
    assert re.search(r"--index-url \S*\s.*torch==2\.13\.0", run) and "download.pytorch.org/whl/cpu" in \
        instruction_text(instructions, "ARG"), "torch must come from the CPU index"
    assert "pip install -r requirements.txt" in run
    assert "horovod" not in run.lower(), "the portal image needs no Horovod"
    assert "collectstatic" in run
    assert "RINGMASTER_DATA_DIR=" in instruction_text(instructions, "ENV")
    assert [w for w, _ in instructions].index("USER") < [w for w, rest in instructions].index("ENTRYPOINT")


def test_training_image_dockerfile():
    instructions = dockerfile(DEPLOY / "training-image" / "Dockerfile")
    froms = [rest for word, rest in instructions if word == "FROM"]
    assert froms and re.match(r"nvidia/cuda:\S+-devel-", froms[0]), froms
    run = instruction_text(instructions, "RUN")
    assert re.search(r"apt-get install[^;&]*\bopenssh-server\b", run)
    assert re.search(r"apt-get install[^;&]*\bopenmpi-bin\b", run)
    runs = [rest for word, rest in instructions if word == "RUN"]
    assert any("StrictModes no" in r and "sshd_config" in r for r in runs), "sshd needs StrictModes no"
    assert "StrictModes yes" not in run
    assert "StrictHostKeyChecking no" in run and "UserKnownHostsFile /dev/null" in run
    for flag in ("HOROVOD_WITH_PYTORCH=1", "HOROVOD_WITH_MPI=1", "HOROVOD_GPU_OPERATIONS=NCCL"):
        assert flag in run, flag
    assert "CMAKE_CXX_STANDARD 17" in run and "CMAKE_POLICY_VERSION_MINIMUM=3.5" in run


@pytest.mark.parametrize("path", ["Dockerfile", "training-image/Dockerfile"])
def test_dockerfile_copies_only_what_the_build_context_has(path):
    """Both are built from the repository root: every COPY source exists and is not ignored."""
    ignored = [p.strip() for p in (ROOT / ".dockerignore").read_text().splitlines()
               if p.strip() and not p.startswith("#")]
    assert {".venv", "var", ".git"} <= set(ignored)
    for word, rest in dockerfile(DEPLOY / path):
        if word != "COPY" or "--from" in rest:
            continue
        sources = [s for s in shlex.split(rest)[:-1] if not s.startswith("--")]
        for source in sources:
            matches = [source] if source == "." else [str(p.relative_to(ROOT)) for p in ROOT.glob(source)]
            assert matches, f"{path}: COPY {source} matches nothing"
            for match in matches:
                if match != ".":
                    assert not any(fnmatch.fnmatch(match, pattern) or match.startswith(pattern.rstrip("/") + "/")
                                   for pattern in ignored), f"{path}: COPY {match} is in .dockerignore"


# --- the guide -------------------------------------------------------------------------------

def test_guide_installs_mpi_operator_v082_and_its_role_example_matches():
    guide = (DEPLOY / "KUBERNETES.md").read_text()
    assert ("kubectl apply --server-side -f https://raw.githubusercontent.com/kubeflow/mpi-operator/"
            "v0.8.2/deploy/v2beta1/mpi-operator.yaml") in guide
    heredoc = re.search(r"kubectl apply -f - <<EOF\n(.*?)\nEOF\n", guide, re.S).group(1).replace("$NS", "team-x")
    docs = [d for d in yaml.safe_load_all(heredoc) if d]
    role = next(d for d in docs if d["kind"] == "Role")
    binding = next(d for d in docs if d["kind"] == "RoleBinding")
    (real_binding,) = of_kind("RoleBinding")
    assert rule_triples(role["rules"]) == EXPECTED_RULES
    assert binding["subjects"] == real_binding["subjects"] and binding["roleRef"] == real_binding["roleRef"]
    for doc in docs:
        kubernetes_validate.validate(doc, KUBERNETES_VERSION, strict=True)
