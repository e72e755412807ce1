#!/usr/bin/env bash
# Creates .venv with goodput installed (with --dev: the test tools, the framework
# integrations' extras and the s3 store's, which the tests run against the real libraries).
#
# torch is not pinned by the project; where the venv has no torch yet, this installs
# $GOODPUT_TORCH_SPEC (default: torch==2.13.0, the CPU build the project is tested with).
# Set GOODPUT_TORCH_SPEC to the build your accelerator needs, e.g. "torch" for the newest.
set -euo pipefail
cd "$(dirname "$0")"
python=${PYTHON:-python3}
extras=""
if [ "${1:-}" = "--dev" ]; then extras="[dev,lightning,hf,torchdata,s3]"; fi

if [ ! -x .venv/bin/python ]; then
  echo "setup: creating .venv with $($python --version)" >&2
  "$python" -m venv .venv
fi
pip=(.venv/bin/python -m pip --disable-pip-version-check -q)
if ! .venv/bin/python -c "import torch" 2>/dev/null; then
  spec=${GOODPUT_TORCH_SPEC:-torch==2.13.0}
  echo "setup: installing $spec" >&2
  "${pip[@]}" install "$spec"
fi
echo "setup: installing goodput$extras" >&2
"${pip[@]}" install -e ".$extras"
echo "setup: done; commands are in .venv/bin (goodput, just)" >&2
