# Kelvin's two commands: `make up` runs Kelvin end to end; `make test` runs every test.
VENV ?= .venv
BIN := $(VENV)/bin

.PHONY: up test image-test lint typecheck bench install clean

install:
	@scripts/bootstrap.sh

up: install
	$(BIN)/kelvin up --demo $(ARGS)

test:
	@scripts/bootstrap.sh test,plugins
	@scripts/install-peers.sh
	$(BIN)/ruff check services tests benchmarks
	$(BIN)/ruff format --check services tests benchmarks
	$(BIN)/mypy
	$(BIN)/python -m pytest -q -ra

# Installs podman, builds every Dockerfile target from a local Debian base and runs the
# services from the image (about a minute; a few more the first time). `test` runs the
# same test wherever podman is already installed.
image-test:
	@scripts/bootstrap.sh test,plugins
	@scripts/install-peers.sh image
	KELVIN_IMAGE_TEST=1 $(BIN)/python -m pytest -q -ra -m image tests/packaging/test_image.py

lint:
	$(BIN)/ruff check services tests benchmarks
	$(BIN)/mypy

bench:
	@scripts/bootstrap.sh test,plugins
	@scripts/install-peers.sh
	$(BIN)/python -m benchmarks

clean:
	rm -rf $(VENV) .pytest_cache .ruff_cache .mypy_cache test-artifacts
