#!/usr/bin/env bash
# The whole test suite, as CI runs it (the README's test command): shards of pytest, as many at a
# time as there are cores, the longest first. See scripts/run_tests.py (--list, --only, --help).
#
#   bash scripts/run_tests.sh              # all of it
#   bash scripts/run_tests.sh -x -q        # arguments go to every shard's pytest
set -uo pipefail
cd "$(dirname "$0")/.."
exec python scripts/run_tests.py "$@"
