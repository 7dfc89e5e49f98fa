# The two README commands: `make serve` (install + run on the embedded tiny.en, CPU, offline)
# and `make test` (install everything the tests need, Chromium and Node included, + run them).
# Both use the active python.
PY ?= python3

# torch first: the CPU wheel (a range or a plain `torch` would pull a multi-GB CUDA build).
torch:
	$(PY) -m pip install -q torch==2.13.0

install: torch
	$(PY) -m pip install -q -e .

serve: install
	streamer serve

# Chromium + ChromeDriver for the browser tests (Debian packages; skipped when already there).
browser:
	@command -v chromium >/dev/null && command -v chromedriver >/dev/null || \
	  { apt-get update -q && apt-get install -y -q chromium chromium-driver; } || \
	  { sudo apt-get update -q && sudo apt-get install -y -q chromium chromium-driver; }

# Node (Debian's packages) and the official `openai` npm package for the Node SDK test
# (tests/test_sdk_tls.py; it is skipped where they are missing).
node:
	@command -v node >/dev/null && command -v npm >/dev/null || \
	  { apt-get update -q && apt-get install -y -q nodejs npm; } || \
	  { sudo apt-get update -q && sudo apt-get install -y -q nodejs npm; }
	npm ci --prefix tests/node --no-audit --no-fund --silent

test: torch browser node
	$(PY) -m pip install -q -e ".[test]"
	$(PY) -m pytest -q

.PHONY: torch install serve browser node test
