"""jobs.domain.telemetry: when the follower's sampler looks at a running job's hosts."""


def test_a_job_of_a_few_seconds_is_sampled_twice_in_its_first_two_seconds():
    """A CPU rate needs two readings; a 4-second job still shows something on its System charts."""
    from itertools import islice

    from jobs.domain.telemetry import Sampler

    assert list(islice(Sampler(1, None, interval=5)._delays(), 4)) == [1.0, 1.0, 5, 5]
    assert list(islice(Sampler(1, None, interval=0.5)._delays(), 3)) == [0.5, 0.5, 0.5]
