"""A protocol-level fake Kubernetes API server for tests: the real `kubernetes` client talks HTTP to it.
It stores MPIJobs (kubeflow.org/v2beta1), pods, configmaps and events, streams watches and pod logs,
and plays the MPI operator and the kubelet from a Scenario. See server.py and sim.py."""
from .server import Faults, FakeKube
from .sim import Scenario, default_output
from .store import ApiError

__all__ = ["ApiError", "FakeKube", "Faults", "Scenario", "default_output"]
