"""A long-running process's start-up objects, kept out of the garbage collector's full passes.

Modules, settings, Django's app registry and URL resolvers live as long as the process. Python's
full collection (generation 2) scans every object the collector tracks, all threads stopped (it
holds the GIL); it runs whenever enough new objects have survived, as a 64-rank job's lines do
while they wait to be stored (BENCHMARKS.md, ingest): the job's follower then stands still for as
long as the scan takes. gc.freeze() moves what exists at start-up into a permanent generation
that collections skip, as the gc module's documentation describes for long-lived processes;
what is made later is collected as usual.
"""
import gc


def freeze_startup_heap():
    """Collect once, then leave every object alive now out of later collections."""
    gc.collect()
    gc.freeze()
