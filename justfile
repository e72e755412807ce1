# Development tasks. `./setup.sh --dev` first; then `.venv/bin/just <task>`.
set shell := ["bash", "-euo", "pipefail", "-c"]

bin := justfile_directory() / ".venv/bin"

# list the tasks
default:
    @{{bin}}/just --list

# install (or refresh) the venv with the test tools
setup:
    ./setup.sh --dev

# Skipped tests are listed with their reason (the GPU kit, tests/gpu, where there is no GPU).
# lint, then every test, slow end-to-end ones included (what CI runs); the 30 slowest listed.
# Two workers, a file each at a time (a file's module fixtures are built once): most
# whole-stack tests wait on processes, so two overlap on two cores. Files go out in the order
# tests/conftest.py sorts them (the longest run first), not xdist's most-tests-first.
test: lint
    {{bin}}/pytest -q -rs -p no:cacheprovider --durations=30 -n 2 --dist loadfile --no-loadscope-reorder

# With GOODPUT_GPU_KIT_OUT=DIR the JSON reports of the CUDA checkpoint benchmark and of `bench gpu`'s
# phase E (tests/gpu/test_gpu_bench_kit.py) are written to DIR.
# the GPU kit (tests/gpu) on this machine's GPU; refused without one; minutes on an H100
test-gpu:
    {{bin}}/python -c 'import sys, torch; sys.exit(0 if torch.cuda.is_available() else "just test-gpu: torch " + torch.__version__ + " sees no CUDA device here")'
    {{bin}}/pytest -q -rs -p no:cacheprovider --durations=10 tests/gpu tests/shim/test_collectives.py

# The one prepared script for a lent GPU: the kit, then its benchmark (phases A-G, at most 470 s
# on an H200; `goodput bench gpu --help`) even where a kit test failed, every report written to
# GOODPUT_GPU_KIT_OUT=DIR (bench-gpu.json, bench-ckpt-cuda.json, bench-gpu-E.json).
# the GPU kit, then `goodput bench gpu`; fails where either failed (refused without a GPU)
gpu-kit:
    @: "${GOODPUT_GPU_KIT_OUT:?set GOODPUT_GPU_KIT_OUT=DIR, where the kit writes its reports}"
    kit=0; {{just_executable()}} test-gpu || kit=$?; {{bin}}/goodput bench gpu --json --out "$GOODPUT_GPU_KIT_OUT"; exit "$kit"

# Root; installs podman once; not part of `test` (README "Container images": needs, times).
# build both images with podman on a Debian base made here; run the services and a rank from them
test-images:
    {{bin}}/python -m tests.deploy.images

# the quick loop: skip tests marked slow
test-quick:
    {{bin}}/pytest -q -m "not slow"

# ruff lint and format check, the import contracts (layering) and the type check (mypy) of pyproject.toml
lint:
    {{bin}}/ruff check libs services tests
    {{bin}}/ruff format --check libs services tests
    {{bin}}/lint-imports
    {{bin}}/mypy

# reformat and autofix
fmt:
    {{bin}}/ruff format libs services tests
    {{bin}}/ruff check --fix libs services tests

# the main job on embedded defaults
demo *ARGS:
    {{bin}}/goodput demo {{ARGS}}

# every benchmark, JSON to stdout (several minutes; figures go to docs/BENCHMARKS.md)
bench:
    {{bin}}/goodput bench bus --json
    {{bin}}/goodput bench ckpt --size-gb 2 --json
    {{bin}}/goodput bench restore --size-gb 2 --json
    {{bin}}/goodput bench recovery --json
    {{bin}}/goodput bench detect --json
    {{bin}}/goodput bench control-plane --json
