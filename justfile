# Development tasks. `./setup.sh --dev` first; then `.venv/bin/just <task>`.
set shell := ["bash", "-euo", "pipefail", "-c"]

bin := justfile_directory() / ".venv/bin"

# list the tasks
default:
    @{{bin}}/just --list

# install (or refresh) the venv with the test tools
setup:
    ./setup.sh --dev

# lint, then every test, slow end-to-end ones included (what CI runs); the 30 slowest listed
test: lint
    {{bin}}/pytest -q -p no:cacheprovider --durations=30

# the quick loop: skip tests marked slow
test-quick:
    {{bin}}/pytest -q -m "not slow"

# ruff lint and format check, and the import contracts (layering) of pyproject.toml
lint:
    {{bin}}/ruff check libs services tests
    {{bin}}/ruff format --check libs services tests
    {{bin}}/lint-imports

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
