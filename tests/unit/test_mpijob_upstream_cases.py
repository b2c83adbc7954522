"""mpi-operator's own validation cases, as a check that does not share our assumptions.

Read from kubeflow/mpi-operator, pkg/apis/kubeflow/validation/validation_test.go
(TestValidateMPIJob, at commit 1b8e1452, newer than v0.8.2) and written here as our own table:
each case is an MPIJob fragment and the fields the operator refuses in it. Cases about fields
that v0.8.2's CRD does not have (runLauncherAsWorker, runPolicy.managedBy) are left out. Each
case runs through the product's validator (runners.mpijob.validate: the CRD's schema, strict,
and the operator's rules) and through the fake API server's checks (tests/fakekube: the
API server's schema errors and the operator's reconcile-time rules), and each must refuse what
the operator refuses, or nothing.

The operator defaults an MPIJob before it validates it (its own test
TestValidateMPIJob_AllowsDefaultedZeroWorkersForLauncherAsWorker calls SetDefaults_MPIJob
first): a launcher's replicas become 1 and a worker's 0, restart policies OnFailure and Never.
So the case with empty replica specs is refused here for what stays wrong after defaulting (no
containers, zero workers), and the operator's own example files, which leave those fields
out, pass (tests/unit/test_mpijob.py).
"""
import copy

import pytest

from runners import mpijob


def replica(replicas, restart="Never"):
    return {"replicas": replicas, "restartPolicy": restart, "template": {"spec": {"containers": [{"name": "c"}]}}}


def job(name="foo", launcher=None, worker=None, **spec):
    specs = {"Launcher": launcher if launcher is not None else replica(1)}
    if worker is not None:
        specs["Worker"] = worker
    body = {"slotsPerWorker": 2, "runPolicy": {"cleanPodPolicy": "Running"}, "sshAuthMountPath": "/root/.ssh",
            "mpiImplementation": "OpenMPI", "mpiReplicaSpecs": specs}
    body.update(spec)
    return {"apiVersion": "kubeflow.org/v2beta1", "kind": "MPIJob", "metadata": {"name": name}, "spec": body}


def refused(document):
    """The fields (dot paths) the product's validator names, whatever its wording."""
    try:
        mpijob.validate(copy.deepcopy(document))
    except mpijob.InvalidMPIJob as exc:
        return exc.problems
    return []


def names(problems, field):
    return any(field in problem for problem in problems)


@pytest.fixture(scope="module")
def fake():
    from tests.fakekube import FakeKube

    return FakeKube()                    # its checks only: no server is started


def fake_refuses(fake, document):
    """What the fake API server (422 causes) and its operator (a ValidationError event) say."""
    document = copy.deepcopy(document)
    causes = [f"{c['field']}: {c['message']}" for c in fake.crd.errors(document)]
    return causes + ([fake.validate_for_controller(document)] if fake.validate_for_controller(document) else [])


@pytest.mark.parametrize("document", [
    job(mpiImplementation="Intel", sshAuthMountPath="/home/mpiuser/.ssh"),                      # valid (intel)
    job(launcher=replica(1, "OnFailure"), worker=replica(3), mpiImplementation="Intel"),          # with worker
    job(mpiImplementation="MPICH"),                                                               # valid (mpich)
    job(launcher=replica(1, "OnFailure"), worker=replica(3), mpiImplementation="MPICH"),
    job(launcher=replica(1, "OnFailure"), worker=replica(1000)),                                  # many workers
], ids=["intel", "intel-with-workers", "mpich", "mpich-with-workers", "a-thousand-workers"])
def test_what_the_operator_accepts_we_accept(document, fake):
    assert refused(document) == []
    assert fake_refuses(fake, document) == []


INVALID_FIELDS = job(
    name="this-name-is-waaaaaaaay-too-long-for-a-worker-hostname", worker=replica(1000),
    runPolicy={"cleanPodPolicy": "unknown", "ttlSecondsAfterFinished": -1, "activeDeadlineSeconds": -1,
               "backoffLimit": -1},
    mpiImplementation="Unknown")


@pytest.mark.parametrize(("document", "fields"), [
    (INVALID_FIELDS, ["metadata.name", "cleanPodPolicy", "ttlSecondsAfterFinished", "activeDeadlineSeconds",
                      "backoffLimit", "mpiImplementation"]),
    (job(mpiReplicaSpecs={}), ["Launcher"]),
    (job(launcher={}, worker={}), ["Launcher: the pod template needs a container", "Worker.replicas",
                                   "Worker: the pod template needs a container"]),
    (job(launcher=replica(2, "Always"), worker=replica(0, "Invalid")),
     ["Launcher.restartPolicy", "Launcher.replicas", "Worker.restartPolicy", "Worker.replicas"]),
    (job(launcher=replica(1, "OnFailure"), worker=replica(0)), ["Worker.replicas"]),
    (job(name="1-foo", mpiImplementation="Intel"), ["metadata.name"]),
], ids=["invalid-fields", "empty-replica-specs", "missing-replica-fields", "invalid-replica-fields",
        "zero-workers", "name-starts-with-a-digit"])
def test_what_the_operator_refuses_we_refuse_naming_the_field(document, fields, fake):
    problems = refused(document)
    missing = [field for field in fields if not names(problems, field)]
    assert not missing, (missing, problems)
    assert fake_refuses(fake, document), "the fake API server and operator let it through"
