# Sourced by the other scripts: create or reuse .venv and install jaderl with the extras in JADERL_EXTRAS.
# torch is installed first and pinned (JADERL_TORCH, default torch==2.13.0) so that no later requirement
# pulls a different build; set JADERL_TORCH to e.g. "torch" to take your platform's default build instead.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
venv="$root/.venv"
python="${PYTHON:-python3}"
if [ ! -x "$venv/bin/python" ]; then
  "$python" -m venv "$venv"
fi
stamp="$venv/.jaderl-installed-${JADERL_EXTRAS:-none}"
if [ ! -f "$stamp" ] || [ "$root/pyproject.toml" -nt "$stamp" ]; then
  "$venv/bin/python" -m pip install --quiet --upgrade pip
  "$venv/bin/python" -c "import torch" 2>/dev/null || "$venv/bin/python" -m pip install --quiet "${JADERL_TORCH:-torch==2.13.0}"
  "$venv/bin/python" -m pip install --quiet -e "$root${JADERL_EXTRAS:+[$JADERL_EXTRAS]}"
  touch "$stamp"
fi
export PATH="$venv/bin:$PATH"
cd "$root"
