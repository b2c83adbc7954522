"""A protocol-level fake Kubernetes API server for tests: the real `kubernetes` client talks HTTP to it.
It stores MPIJobs (kubeflow.org/v2beta1), pods, configmaps and events, streams watches and pod logs,
and plays the MPI operator and the kubelet from a Scenario (sim.py). Usage:

    with FakeKube() as fake:
        fake.write_kubeconfig(tmp_path / "kubeconfig", namespace="team-a")
        fake.scenario = Scenario(attempts=[([b"[1,0]<stdout>:hi\\n"], 1), ([b"ok\\n"], 0)], hold=event)
        fake.faults.create_errors = [500]
        ... run the portal's code with kubernetes.config.new_client_from_config(...) ...
        fake.wait_for(lambda: fake.mpijob("team-a", "rm-job-7"), 5)
        assert {r[0] for r in fake.requests} <= allowed_verbs

Parts: store.py (objects, resourceVersion, watch history, selectors, Status errors), schema.py (CRD
validation, defaulting, pruning), server.py (FakeKube, HTTP routing, watch and log streaming, Faults),
sim.py (Scenario, the per-MPIJob operator/kubelet thread), kueue.py (Kueue, once
fake.enable_kueue(gpus=16, queues=[("team-a", "team-queue")]) installed it: its API group, webhook,
Workloads, quota, preemption and visibility API)."""
from .server import Faults, FakeKube
from .sim import Scenario, default_output
from .store import ApiError

__all__ = ["ApiError", "FakeKube", "Faults", "Scenario", "default_output"]
