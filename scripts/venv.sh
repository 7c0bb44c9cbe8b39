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
if [ ! -f "$stamp" ] || [ "$root/pyproject.toml" -nt "$stamp" ]; then
  "$venv/bin/python" -m pip install $quiet --upgrade pip
  if ! "$venv/bin/python" -c "import torch" 2>/dev/null; then
    echo "jaderl: installing ${JADERL_TORCH:-torch==2.13.0} (the first time takes a few minutes)" >&2
    "$venv/bin/python" -m pip install $quiet "${JADERL_TORCH:-torch==2.13.0}"
  fi
  echo "jaderl: installing jaderl${JADERL_EXTRAS:+[$JADERL_EXTRAS]} and its dependencies" >&2
  "$venv/bin/python" -m pip install $quiet -e "$root${JADERL_EXTRAS:+[$JADERL_EXTRAS]}"
  touch "$stamp"
  echo "jaderl: $venv is ready" >&2
fi
export PATH="$venv/bin:$PATH"
cd "$root"
