#!/usr/bin/env bash
# The whole test suite, as CI runs it (README's test command), in two processes at once:
#
#   1. python -m pytest [ARGS...]
#        everything as installed (MKL): the package tests, every notebook (nbval), the mutation
#        test of every exercise check, the book build, the GPU path on the CuPy stand-in
#   2. XTRAIN_BLAS=numpy XTRAIN_THREADS=1 python -m pytest tests -m "not standin" --ignore=tests/test_book.py
#        the package tests again as another CPU would run them: NumPy's own BLAS, one thread, so
#        that a result depending on the BLAS's last bits fails here and not on the next machine
#        (not the book: building and browsing it runs no engine code)
#
# The second run is one thread; the first leaves a core idle much of its time (notebook kernels,
# subprocesses), so on 2 cores the two together take little longer than the first alone. Compiled
# kernels are shared through the cache, written atomically. The second run's output is printed
# after the first's; the exit status is 1 when either failed.
#
#   bash scripts/run_tests.sh              # all of it
#   bash scripts/run_tests.sh -x -q        # arguments go to the first run
set -uo pipefail
cd "$(dirname "$0")/.."
log=$(mktemp)
XTRAIN_BLAS=numpy XTRAIN_THREADS=1 python -m pytest tests -m "not standin" --ignore=tests/test_book.py > "$log" 2>&1 &
second=$!
python -m pytest "$@"
first_status=$?
wait "$second"
second_status=$?
echo
echo "==== the package tests on NumPy's BLAS, one thread (XTRAIN_BLAS=numpy XTRAIN_THREADS=1) ===="
cat "$log"
rm -f "$log"
[ "$first_status" -eq 0 ] && [ "$second_status" -eq 0 ]
