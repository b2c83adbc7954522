"""Report training metrics to Ringmaster from a training script: no network, no setup.

    import ringmaster_metrics
    ringmaster_metrics.log(step=10, loss=0.31, img_per_sec=812)

prints the line `RINGMASTER_METRIC {"step": 10, "loss": 0.31, "img_per_sec": 812}` on stdout,
which the portal turns into points of the job's charts (one series per name and rank). Any rank
may log. Jobs of the local runner find this module on PYTHONPATH; elsewhere, copy this one file
next to the script or install the ringmaster package.

Values must be real numbers (int, float, numpy scalars, one-element tensors); NaN and infinity
are written as null, so a diverging loss never stops the training, and are left off the chart.
"""
import json
import math
import numbers
import sys

__all__ = ["MARKER", "MAX_NAME_LENGTH", "log"]

MARKER = "RINGMASTER_METRIC "     # runners.output.METRIC_PREFIX
MAX_NAME_LENGTH = 100             # runners.output.MAX_METRIC_NAME_LENGTH


def _number(name, value):
    if hasattr(value, "item") and not isinstance(value, numbers.Number):
        try:
            value = value.item()   # a numpy array or torch tensor with one element
        except (TypeError, ValueError, RuntimeError) as exc:
            raise TypeError(f"metric {name!r}: expected a number, got {type(value).__name__} ({exc})") from None
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise TypeError(f"metric {name!r}: expected a number, got {type(value).__name__}")
    if isinstance(value, numbers.Integral):
        return int(value)
    value = float(value)
    return value if math.isfinite(value) else None


def _step(step):
    if step is None:
        return None
    if hasattr(step, "item") and not isinstance(step, numbers.Number):
        step = step.item()
    if isinstance(step, bool) or not isinstance(step, numbers.Integral):
        raise TypeError(f"step must be a whole number, got {type(step).__name__}")
    if step < 0:
        raise ValueError(f"step must not be negative, got {step}")
    return int(step)


def log(step=None, **values):
    """Print one metric line: `step` (a whole number >= 0, optional) and named numbers."""
    if not values:
        raise ValueError("log() needs at least one metric, e.g. log(step=1, loss=0.5)")
    record = {}
    step = _step(step)
    if step is not None:
        record["step"] = step
    for name, value in values.items():
        if not name or len(name) > MAX_NAME_LENGTH:
            raise ValueError(f"metric names have 1 to {MAX_NAME_LENGTH} characters, got {name!r}")
        record[name] = _number(name, value)
    print(MARKER + json.dumps(record, allow_nan=False), file=sys.stdout, flush=True)
