"""torchrun_agents' argv for an elastic job, read by torchrun's own parser and rendezvous: the
settings that decide how soon a resized world starts."""
from datetime import timedelta

import pytest

from runners.launchers import torchrun_agents
from tests.conftest import free_port

pytest.importorskip("torch")


def rendezvous_of(argv):
    """The c10d rendezvous handler that torchrun makes of `argv` (its own options)."""
    from torch.distributed.elastic.rendezvous import RendezvousParameters
    from torch.distributed.elastic.rendezvous.registry import get_rendezvous_handler
    from torch.distributed.run import config_from_args, parse_args

    config, _, _ = config_from_args(parse_args(argv))
    return get_rendezvous_handler(RendezvousParameters(
        backend=config.rdzv_backend, endpoint=config.rdzv_endpoint, run_id=config.run_id,
        min_nodes=config.min_nodes, max_nodes=config.max_nodes, local_addr=config.local_addr,
        **config.rdzv_configs))


def test_a_stopped_agent_is_left_behind_within_seconds_and_a_round_waits_3_s_for_more():
    plan = {"wrapper": "env", "python": "python", "id": "rm-test-1", "module": "ringmaster_rank",
            "max_restarts": 20, "hosts": [{"name": "gpu-a", "address": "127.0.0.1", "slots": 2}],
            "elastic": {"min": 2, "max": 4, "hosts_file": "hosts"}}
    agent = torchrun_agents.Agent(plan["hosts"][0], 0, 1, True, True)
    argv = agent.argv(plan, f"127.0.0.1:{free_port()}")
    assert argv[:4] == ["env", "python", "-m", "torch.distributed.run"]
    handler = rendezvous_of(argv[4:])
    try:
        settings = handler.settings
        # An agent stopped for a shrink never leaves its rendezvous; the others go on without it
        # once its heartbeats are missed (torchrun's defaults: 15 s).
        assert settings.keep_alive_interval * settings.keep_alive_max_attempt <= timedelta(seconds=5)
        assert settings.timeout.last_call == timedelta(seconds=torchrun_agents.LAST_CALL_SECONDS)
        assert (settings.min_nodes, settings.max_nodes) == (2, 4)
    finally:
        handler.shutdown()
