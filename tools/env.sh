# Sourced by tools/test.sh and tools/book.sh: makes .venv (once) with the locked toolchain and an
# editable install of dpm, then activates it. Set DPM_VENV to use another location.
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
venv=${DPM_VENV:-$root/.venv}
stamp=$venv/.dpm-lock-$(sha1sum "$root/tools/requirements.lock" "$root/settings.ini" | sha1sum | cut -c1-12)
if [ ! -f "$stamp" ]; then
  echo "== setting up $venv (python: $(python3 --version))"
  python3 -m venv "$venv"
  "$venv/bin/python" -m pip install -q --upgrade 'pip>=23.2' 2>&1 | grep -v '^WARNING: Location' || true
  # torch==2.13.0 in the lock is the CPU wheel; installing the lock first keeps pip from pulling CUDA.
  "$venv/bin/python" -m pip install -q -r "$root/tools/requirements.lock" 2>&1 | grep -v '^WARNING: Location' || true
  "$venv/bin/python" -m pip install -q --no-deps --no-build-isolation -e "$root" 2>&1 | grep -v '^WARNING: Location' || true
  "$venv/bin/python" -c 'import dpm, torch, nbdev' || { echo "environment set-up failed" >&2; exit 1; }
  "$venv/bin/python" -m ipykernel install --sys-prefix --name python3 >/dev/null
  rm -f "$venv"/.dpm-lock-*; touch "$stamp"
fi
# shellcheck disable=SC1091
source "$venv/bin/activate"
cd "$root"
# Book and notebooks read MathJax from the package django-static-mathjax, never from a CDN.
mkdir -p _static/mathjax
cp -u "$(python -c 'import mathjax, os; print(os.path.dirname(mathjax.__file__))')/static/mathjax/es5/tex-svg-full.js" _static/mathjax/
