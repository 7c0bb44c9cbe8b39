# Sourced by the other scripts: create or reuse .venv and install jaderl with the extras in JADERL_EXTRAS.
# torch is installed first and pinned (JADERL_TORCH, default torch==2.13.0) so that no later requirement
# pulls a different build; set JADERL_TORCH to e.g. "torch" to take your platform's default build instead.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
venv="$root/.venv"
python="${PYTHON:-python3}"
# pip's own progress on a terminal; CI logs get the step lines only
quiet=$([ -t 1 ] && [ -z "${CI:-}" ] && echo "" || echo "--quiet")
if [ ! -x "$venv/bin/python" ]; then
  echo "jaderl: creating $venv" >&2
  "$python" -m venv "$venv"
fi
stamp="$venv/.jaderl-installed-${JADERL_EXTRAS:-none}"
# pip installs without byte-compiling (about 25,000 files with the dev extras: minutes of one core), then compileall
# compiles them on every core. They must be compiled ahead: where PYTHONDONTWRITEBYTECODE is set, Python keeps nothing
# it compiles at import, and every process would compile what it imports again.
if [ ! -f "$stamp" ] || [ "$root/pyproject.toml" -nt "$stamp" ]; then
  "$venv/bin/python" -m pip install $quiet --upgrade pip
  if ! "$venv/bin/python" -c "import torch" 2>/dev/null; then
    echo "jaderl: installing ${JADERL_TORCH:-torch==2.13.0} (the first time takes a few minutes)" >&2
    "$venv/bin/python" -m pip install $quiet --no-compile "${JADERL_TORCH:-torch==2.13.0}"
  fi
  echo "jaderl: installing jaderl${JADERL_EXTRAS:+[$JADERL_EXTRAS]} and its dependencies" >&2
  "$venv/bin/python" -m pip install $quiet --no-compile -e "$root${JADERL_EXTRAS:+[$JADERL_EXTRAS]}"
  echo "jaderl: byte-compiling the installed packages" >&2
  # a file that does not compile (some packages ship Python 2 examples) is skipped, as pip skips it
  "$venv/bin/python" -m compileall -q -j 0 "$("$venv/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')" \
    >/dev/null || true
  touch "$stamp"
  echo "jaderl: $venv is ready" >&2
fi
export PATH="$venv/bin:$PATH"
cd "$root"
