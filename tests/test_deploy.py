"""deploy/: the portal's images and its Kubernetes manifests, checked offline.

Pure and fast: no cluster, no Docker, no database, no network. The manifests are validated with
kubernetes-validate's bundled schemas (strict: unknown fields fail) for one fixed Kubernetes
version, and cross-checked against what the code really reads and runs (portal/settings.py,
deploy/Procfile, deploy/docker-entrypoint.sh, portal/urls.py, the labels runners/mpijob.py gives
job pods). The NetworkPolicies are evaluated, connection by connection, against those labels;
Redis runs once, on a Unix socket, with its manifest's arguments.
"""
import base64
import copy
import dataclasses
import fnmatch
import functools
import ipaddress
import json
import os
import re
import shlex
import shutil
import socket
import stat
import subprocess
import urllib.parse
import urllib.request
from pathlib import Path

import kubernetes_validate
import pytest
import yaml

from runners import mpijob
from runners.base import JobSpec

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
    *(("trainer.kubeflow.org", "trainjobs", v) for v in ("create", "get", "list", "watch", "delete")),
    *(("", "configmaps", v) for v in ("create", "get", "delete")),
    *(("", "pods", v) for v in ("get", "list", "watch", "delete")),
    ("", "pods/log", "get"),
    *(("", "events", v) for v in ("get", "list", "watch")),
    *(("kueue.x-k8s.io", "workloads", v) for v in ("get", "list", "watch")),
    ("kueue.x-k8s.io", "localqueues", "get"),
    ("visibility.kueue.x-k8s.io", "localqueues/pendingworkloads", "get"),
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


def secret_data(name):
    """key -> value of a Secret of the manifests (data decoded, stringData as written)."""
    secret = named("Secret", name)
    decoded = {key: base64.b64decode(value).decode() for key, value in (secret.get("data") or {}).items()}
    return {**decoded, **(secret.get("stringData") or {})}


def resolved_env(container):
    """name -> value of every variable a container gets, read from its ConfigMaps and Secrets."""
    values = {}
    for source in container.get("envFrom", []):
        if "configMapRef" in source:
            values.update(named("ConfigMap", source["configMapRef"]["name"]).get("data", {}))
        else:
            values.update(secret_data(source["secretRef"]["name"]))
    for item in container.get("env", []):
        ref = item.get("valueFrom", {})
        if "secretKeyRef" in ref:
            values[item["name"]] = secret_data(ref["secretKeyRef"]["name"])[ref["secretKeyRef"]["key"]]
        elif "configMapKeyRef" in ref:
            ref = ref["configMapKeyRef"]
            values[item["name"]] = named("ConfigMap", ref["name"])["data"][ref["key"]]
        else:
            values[item["name"]] = item.get("value", "")
    return values


def expanded(words, env):
    """args or command as the kubelet runs them: each $(NAME) of the container's variables
    replaced by its value."""
    return [re.sub(r"\$\(([A-Za-z_][A-Za-z0-9_]*)\)", lambda m: env.get(m.group(1), m.group(0)), word)
            for word in words]


@functools.lru_cache(maxsize=None)
def _guide_heredoc(mtime):
    guide = (DEPLOY / "KUBERNETES.md").read_text()
    heredoc = re.search(r"kubectl apply -f - <<EOF\n(.*?)\nEOF\n", guide, re.S).group(1).replace("$NS", "team-x")
    return tuple(d for d in yaml.load_all(heredoc, Loader=Loader) if d)


def guide_heredoc():
    """The documents KUBERNETES.md applies in a namespace of its own (section 6), for `team-x`;
    a copy the caller may change."""
    return copy.deepcopy(list(_guide_heredoc((DEPLOY / "KUBERNETES.md").stat().st_mtime_ns)))


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
            "Deployment", "StatefulSet", "Ingress", "NetworkPolicy"} <= kinds
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
    assert MUST_HAVE_ENV | {"ALLOWED_HOSTS", "CSRF_TRUSTED_ORIGINS", "RINGMASTER_HTTPS", "DATABASE_CONN_MAX_AGE",
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


# --- passwords of the database and of Redis --------------------------------------------------

def server_container(name):
    (container,) = pod_spec(named({"postgres": "StatefulSet", "redis": "Deployment"}[name], name))["containers"]
    return container


def test_postgresql_and_redis_ask_for_the_passwords_the_portals_urls_carry():
    """Each server takes its password from a Secret, and the URL web, worker and beat use (from
    a Secret too, never the ConfigMap) carries that same password to that server's Service."""
    services = {s["metadata"]["name"]: s for s in of_kind("Service")}
    postgres = resolved_env(server_container("postgres"))
    redis_container = server_container("redis")
    redis_argv = expanded(redis_container["args"], resolved_env(redis_container))
    assert "--requirepass" in redis_argv, "Redis asks for no password"
    asked = {"DATABASE_URL": ("postgres", postgres["POSTGRES_PASSWORD"]),
             "REDIS_URL": ("redis", redis_argv[redis_argv.index("--requirepass") + 1])}
    for name in PORTAL_COMPONENTS:
        container = pod_spec(component(name))["containers"][0]
        env, sources = resolved_env(container), container_env(container)
        for variable, (server, password) in asked.items():
            assert password and "$(" not in password, f"{server} asks for no password"
            assert "secretRef" in sources[variable], f"{name} reads {variable} from a ConfigMap"
            url = urllib.parse.urlsplit(env[variable])
            assert urllib.parse.unquote(url.password or "") == password, f"{name}'s {variable}"
            service = services[url.hostname]["spec"]
            assert url.port == service["ports"][0]["port"]
            assert service["selector"]["app.kubernetes.io/component"] == server, f"{variable} names another server"
    for config in of_kind("ConfigMap"):
        assert not {"DATABASE_URL", "REDIS_URL"} & set(config.get("data", {})), config["metadata"]["name"]


@pytest.mark.skipif(shutil.which("redis-server") is None or shutil.which("redis-cli") is None,
                    reason="redis-server and redis-cli not installed")
def test_redis_run_as_its_manifest_says_refuses_a_client_without_the_password(tmp_path):
    """The container's argv (variables expanded as the kubelet does) on a real redis-server, on a
    Unix socket: no password, no PING; the portal's REDIS_URL and the readiness probe get in."""
    import redis
    from redis.backoff import NoBackoff
    from redis.retry import Retry

    container = server_container("redis")
    env = resolved_env(container)
    argv = expanded(container["args"], env)
    assert argv[0] == "redis-server"
    sock = tmp_path / "redis.sock"
    server = subprocess.Popen([shutil.which("redis-server"), *argv[1:], "--port", "0", "--unixsocket", str(sock),
                               "--dir", str(tmp_path)], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        for line in server.stdout:                        # ends when redis-server exits
            if "ready to accept connections" in line.lower():
                break
        else:
            pytest.fail(f"redis-server exited with {server.wait()}")
        once = Retry(NoBackoff(), 0)                      # the client retries a refused login otherwise
        with pytest.raises(redis.AuthenticationError):
            redis.Redis(unix_socket_path=str(sock), retry=once).ping()
        url = redis.connection.parse_url(resolved_env(pod_spec(component("worker"))["containers"][0])["REDIS_URL"])
        assert redis.Redis(unix_socket_path=str(sock), password=url["password"], db=url.get("db", 0), retry=once).ping()
        probe = container["readinessProbe"]["exec"]["command"]
        assert probe[0] == "redis-cli"
        probe_env = {"PATH": os.environ["PATH"], **{k: v for k, v in env.items() if k.startswith("REDISCLI_")}}
        answer = subprocess.run([probe[0], "-s", str(sock), *probe[1:]], env=probe_env, capture_output=True,
                                text=True, timeout=30)
        assert (answer.returncode, answer.stdout.strip()) == (0, "PONG"), answer
    finally:
        server.terminate()
        server.wait(timeout=30)


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


# --- network policies ------------------------------------------------------------------------
# networkpolicy.yaml (and the guide's policy for a namespace of its own), evaluated as the
# NetworkPolicy API defines them, connection by connection, between the pods the deploy runs
# (their template labels and named ports), the pods of the portal's MPIJobs (the labels
# runners/mpijob.py gives them plus those mpi-operator adds) and the cluster's own DNS and ingress
# controller. Network plugins differ on one point: whether an ipBlock matches pod addresses too
# (Calico: yes; Cilium: no). Every check holds under both readings.

OPERATOR_LABELS = ("training.kubeflow.org/operator-name", "training.kubeflow.org/job-name",
                   "training.kubeflow.org/job-role", "training.kubeflow.org/replica-index")
IPBLOCK_READINGS = pytest.mark.parametrize("ipblock_reaches_pods", [True, False],
                                           ids=["ipBlock-matches-pods", "ipBlock-outside-only"])
JOB_NAMESPACES = pytest.mark.parametrize("namespace", ["ringmaster", "team-x"])   # the deploy's, the guide's
SSH_PORT = 22
CALLBACK_PORT = 41235   # a port orted, Gloo or Horovod's elastic driver picks


@dataclasses.dataclass
class Endpoint:
    """A pod (its namespace, labels and named ports) or, without a namespace, an address outside
    the cluster."""
    name: str
    namespace: str | None
    labels: dict = dataclasses.field(default_factory=dict)
    ports: dict = dataclasses.field(default_factory=dict)     # name -> (port, protocol)
    ip: str = ""


# The cluster's DNS and ingress-nginx's controller, with the labels their standard installs give.
CLUSTER_DNS = Endpoint("coredns", "kube-system", {"k8s-app": "kube-dns"},
                       {"dns": (53, "UDP"), "dns-tcp": (53, "TCP")})
INGRESS_CONTROLLER = Endpoint("ingress-nginx-controller", "ingress-nginx",
                              {"app.kubernetes.io/name": "ingress-nginx", "app.kubernetes.io/component": "controller"})


def outside(ip):
    return Endpoint(ip, None, ip=ip)


def network_policies():
    """The deploy's NetworkPolicies (in the kustomization's namespace) and the guide's."""
    namespace = kustomization()["namespace"]
    deployed = [{**copy.deepcopy(p), "metadata": {**p["metadata"], "namespace": namespace}}
                for p in of_kind("NetworkPolicy")]
    return deployed + [d for d in guide_heredoc() if d["kind"] == "NetworkPolicy"]


def portal_pods():
    """Workload name -> its pods as an Endpoint."""
    namespace = kustomization()["namespace"]
    return {w["metadata"]["name"]: Endpoint(
        w["metadata"]["name"], namespace, w["spec"]["template"]["metadata"]["labels"],
        {p["name"]: (p["containerPort"], p.get("protocol", "TCP"))
         for c in pod_spec(w)["containers"] for p in c.get("ports", [])}) for w in workloads()}


def job_pods(namespace):
    """The launcher and the two workers of a 2-GPU MPIJob the portal builds for `namespace`, with
    the labels mpi-operator v0.8.2 adds to the templates' (defaultLabels, newWorker)."""
    spec = JobSpec(job_id=7, gpus=2, python="python", script_name="train.py", script_content="pass\n",
                   script_path=None, container_image="registry.example/horovod:0.28.1", installation="i1")
    job, _ = mpijob.build(spec, mpijob.ClusterSpec(namespace=namespace, gpus_per_node=1))
    name, replicas = job["metadata"]["name"], job["spec"]["mpiReplicaSpecs"]
    operator, job_name, role, index = OPERATOR_LABELS

    def pod(kind, number=None):
        labels = {**replicas[kind]["template"]["metadata"]["labels"], operator: "mpi-operator",
                  job_name: name, role: kind.lower()}
        if number is not None:
            labels[index] = str(number)
        return Endpoint(f"{name}-{kind.lower()}" + ("" if number is None else f"-{number}"), namespace, labels)

    workers = [pod("Worker", n) for n in range(replicas["Worker"]["replicas"])]
    assert len(workers) == 2
    return [pod("Launcher"), *workers]


def selector_matches(selector, labels):
    for key, value in (selector.get("matchLabels") or {}).items():
        if labels.get(key) != value:
            return False
    for expression in selector.get("matchExpressions") or []:
        key, operator, values = expression["key"], expression["operator"], expression.get("values") or []
        matched = {"In": key in labels and labels.get(key) in values,
                   "NotIn": labels.get(key) not in values or key not in labels,
                   "Exists": key in labels, "DoesNotExist": key not in labels}[operator]
        if not matched:
            return False
    return True


def peer_matches(peer, policy_namespace, endpoint, ipblock_reaches_pods):
    if "ipBlock" in peer:
        if endpoint.namespace is not None:
            return ipblock_reaches_pods
        address = ipaddress.ip_address(endpoint.ip)
        return (address in ipaddress.ip_network(peer["ipBlock"]["cidr"])
                and not any(address in ipaddress.ip_network(e) for e in peer["ipBlock"].get("except", [])))
    if endpoint.namespace is None:
        return False
    if "namespaceSelector" in peer:
        in_namespace = selector_matches(peer["namespaceSelector"], {"kubernetes.io/metadata.name": endpoint.namespace})
    else:
        in_namespace = endpoint.namespace == policy_namespace
    return in_namespace and selector_matches(peer.get("podSelector") or {}, endpoint.labels)


def port_matches(ports, destination, port, protocol):
    """Whether a rule's ports admit `port`; a named port is the destination pod's."""
    if not ports:
        return True
    for entry in ports:
        wanted = entry.get("port")
        if entry.get("protocol", "TCP") != protocol:
            continue
        if wanted is None:
            return True
        if isinstance(wanted, str):
            if destination.ports.get(wanted) == (port, protocol):
                return True
        elif wanted <= port <= entry.get("endPort", wanted):
            return True
    return False


def policy_types(spec):
    return spec.get("policyTypes") or ["Ingress", *(["Egress"] if "egress" in spec else [])]


def admits(direction, pod, peer, destination, port, protocol, policies, ipblock_reaches_pods):
    """Whether the policies that select `pod` for `direction` let this connection through: none
    selects it, or a rule of one admits both the peer and the port."""
    rules, peers = ("ingress", "from") if direction == "Ingress" else ("egress", "to")
    selecting = [p for p in policies if p["metadata"]["namespace"] == pod.namespace
                 and direction in policy_types(p["spec"]) and selector_matches(p["spec"]["podSelector"], pod.labels)]
    if pod.namespace is None or not selecting:
        return True
    for policy in selecting:
        namespace = policy["metadata"]["namespace"]
        for rule in policy["spec"].get(rules) or []:
            peer_admitted = not rule.get(peers) or any(
                peer_matches(each, namespace, peer, ipblock_reaches_pods) for each in rule[peers])
            if peer_admitted and port_matches(rule.get("ports"), destination, port, protocol):
                return True
    return False


def connects(source, destination, port, protocol="TCP", *, ipblock_reaches_pods, policies=None):
    """Whether `source` may open a connection to `port` (a number, or a named port of
    `destination`): egress from the source's policies, ingress to the destination's."""
    policies = network_policies() if policies is None else policies
    if isinstance(port, str):
        port, protocol = destination.ports[port]
    return all(admits(direction, pod, peer, destination, port, protocol, policies, ipblock_reaches_pods)
               for direction, pod, peer in (("Egress", source, destination), ("Ingress", destination, source)))


@IPBLOCK_READINGS
@JOB_NAMESPACES
def test_job_pods_reach_no_pod_of_the_portal_on_any_port(namespace, ipblock_reaches_pods):
    portal = portal_pods()
    assert {"ringmaster-web", "ringmaster-worker", "ringmaster-beat", "postgres", "redis"} <= set(portal)
    for job_pod in job_pods(namespace):
        for pod in portal.values():
            for port in [*pod.ports, SSH_PORT, 80, 443, 5432, 6379, 8000, CALLBACK_PORT]:
                assert not connects(job_pod, pod, port, ipblock_reaches_pods=ipblock_reaches_pods), \
                    f"{job_pod.name} in {namespace} reaches {pod.name} on {port}"


@IPBLOCK_READINGS
def test_the_portal_reaches_its_database_and_redis_and_users_its_web_server(ipblock_reaches_pods):
    portal = portal_pods()
    for client in ("ringmaster-web", "ringmaster-worker", "ringmaster-beat"):
        for server, port in (("postgres", "postgres"), ("redis", "redis")):
            assert connects(portal[client], portal[server], port, ipblock_reaches_pods=ipblock_reaches_pods), \
                f"{client} cannot reach {server}"
    assert connects(INGRESS_CONTROLLER, portal["ringmaster-web"], "http", ipblock_reaches_pods=ipblock_reaches_pods)
    assert not connects(INGRESS_CONTROLLER, portal["postgres"], "postgres", ipblock_reaches_pods=ipblock_reaches_pods)


@IPBLOCK_READINGS
@JOB_NAMESPACES
def test_a_jobs_launcher_and_workers_reach_each_other_and_the_clusters_dns(namespace, ipblock_reaches_pods):
    reading = {"ipblock_reaches_pods": ipblock_reaches_pods}
    launcher, *workers = job_pods(namespace)
    for worker in workers:
        assert connects(launcher, worker, SSH_PORT, **reading), "mpirun cannot log in to a worker's sshd"
        assert connects(worker, launcher, CALLBACK_PORT, **reading), "a worker cannot call the launcher back"
    assert connects(workers[0], workers[1], CALLBACK_PORT, **reading)
    assert connects(workers[1], workers[0], CALLBACK_PORT, **reading)
    for pod in (launcher, *workers):
        assert connects(pod, CLUSTER_DNS, "dns", **reading) and connects(pod, CLUSTER_DNS, "dns-tcp", **reading)
    for stranger in (INGRESS_CONTROLLER, portal_pods()["ringmaster-worker"]):
        assert not connects(stranger, workers[0], SSH_PORT, **reading), f"{stranger.name} reaches a worker's sshd"


@IPBLOCK_READINGS
@JOB_NAMESPACES
def test_job_pods_reach_the_outside_but_not_the_instance_metadata_service(namespace, ipblock_reaches_pods):
    reading = {"ipblock_reaches_pods": ipblock_reaches_pods}
    for pod in job_pods(namespace):
        assert connects(pod, outside("203.0.113.7"), 443, **reading)
        assert connects(pod, outside("2001:db8::7"), 443, **reading)
        assert not connects(pod, outside("169.254.169.254"), 80, **reading)
        assert not connects(pod, outside("fd00:ec2::254"), 80, **reading)


def test_the_policy_check_notices_a_missing_or_widened_policy():
    """The checks above are real: without the policies a job pod reaches the database, and so it
    does if the database's policy admits every pod of the namespace."""
    launcher = job_pods("ringmaster")[0]
    postgres = portal_pods()["postgres"]
    assert not connects(launcher, postgres, "postgres", ipblock_reaches_pods=True)
    assert connects(launcher, postgres, "postgres", ipblock_reaches_pods=True, policies=[])
    widened = network_policies()
    for policy in widened:
        if policy["metadata"]["name"] == "ringmaster-postgres":
            policy["spec"]["ingress"][0]["from"].append({"podSelector": {}})
    assert connects(launcher, postgres, "postgres", ipblock_reaches_pods=True, policies=widened)
    no_dns = network_policies()
    for policy in no_dns:
        if policy["metadata"]["name"] == "ringmaster-jobs":
            policy["spec"]["egress"] = [r for r in policy["spec"]["egress"] if "namespaceSelector" not in r["to"][0]]
    assert not connects(launcher, CLUSTER_DNS, "dns", ipblock_reaches_pods=False, policies=no_dns)


def test_the_guides_policy_for_a_namespace_of_its_own_is_the_deploys():
    (guide,) = [d for d in guide_heredoc() if d["kind"] == "NetworkPolicy"]
    assert guide["metadata"]["namespace"] == "team-x"
    assert guide["spec"] == named("NetworkPolicy", guide["metadata"]["name"])["spec"]


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
    docs = guide_heredoc()
    role = next(d for d in docs if d["kind"] == "Role")
    binding = next(d for d in docs if d["kind"] == "RoleBinding")
    (real_binding,) = of_kind("RoleBinding")
    assert rule_triples(role["rules"]) == EXPECTED_RULES
    assert binding["subjects"] == real_binding["subjects"] and binding["roleRef"] == real_binding["roleRef"]
    for doc in docs:
        kubernetes_validate.validate(doc, KUBERNETES_VERSION, strict=True)
