#!/usr/bin/env bash
# The test suite: the fast tests by default, in parallel; extra arguments go to pytest (e.g. `-m slow` for the
# learning tests, `-n 0` for one process).
JADERL_EXTRAS=dev source "$(dirname "$0")/venv.sh"
ruff check jaderl tests benchmarks
# one test per CPU at a time (pytest-xdist) unless the arguments choose: each test is seeded and single-threaded
case " $* " in *" -n "*|*" -n="*|*" -p no:xdist "*) ;; *) set -- -n auto "$@" ;; esac
python -m pytest -q -p no:cacheprovider --durations=15 "$@"
