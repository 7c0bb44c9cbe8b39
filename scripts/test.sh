#!/usr/bin/env bash
# The test suite: the fast tests by default; extra arguments go to pytest (e.g. `-m slow` for the learning tests).
JADERL_EXTRAS=dev source "$(dirname "$0")/venv.sh"
ruff check jaderl tests benchmarks
python -m pytest -q -p no:cacheprovider "$@"
