#!/usr/bin/env bash
# Jobs on the portal's own machine run in a bubblewrap sandbox (runners/sandbox.py), in a network
# namespace that pasta (Debian's passt) connects to the outside. Install them where this user can
# (root with apt-get); otherwise say what a job could read without them.
set -euo pipefail
command -v bwrap >/dev/null && command -v pasta >/dev/null && exit 0
if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
    echo "installing bubblewrap and passt (the sandbox of jobs on this machine, and its network)"
    export DEBIAN_FRONTEND=noninteractive
    apt-get install -y -qq bubblewrap passt >/dev/null 2>&1 || { apt-get update -qq && apt-get install -y -qq bubblewrap passt >/dev/null; }
    exit 0
fi
command -v bwrap >/dev/null && exit 0   # without pasta, a job with outbound network says at launch what is missing
echo "WARNING: bubblewrap is not installed, so jobs on this machine run without a sandbox and can read" >&2
echo "         the portal's secrets. Install it (sudo apt-get install bubblewrap) and start again." >&2
