"""Waits (jobs.backends.waits): the kind of a wait comes from its code, whatever its numbers or
its words; a code without words is refused where it is made."""
import pytest

from jobs.backends.waits import Wait


def test_waits_of_one_kind_differ_in_words_not_in_kind():
    capacity = [Wait("capacity", in_use=3, capacity=4, gpus=2), Wait("capacity_behind", backend="local"),
                Wait("machine_gpus", error="nvidia-smi failed"), Wait("cluster_behind"),
                Wait("no_instance", gpus=2, model="", down=[("a", "cannot reach the host")])]
    quota = [Wait("quota", broken=[{"scope": "user alice", "limit": "jobs", "use": 2, "most": 2}]),
             Wait("quota_behind", scope="group vision")]
    assert {wait.kind for wait in capacity} == {"capacity"} and {wait.kind for wait in quota} == {"quota"}
    assert capacity[4].words == ("waiting for instances: needs 2 GPUs, no healthy enabled instance; "
                                 "not healthy: a (cannot reach the host)")
    assert quota[0].stored() == {"reason": "waiting for quota: user alice: 2 of 2 jobs running", "waits_for": "quota"}


def test_a_code_without_words_is_refused():
    with pytest.raises(ValueError, match="no words for a wait 'busy'"):
        Wait("busy", gpus=2)
