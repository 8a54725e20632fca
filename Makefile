# Every target runs inside the virtual environment .venv.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
DEMO_STAMP := $(VENV)/.installed-demo

.PHONY: demo test test-fast lint typecheck contracts bench clean validate validate-config tools-validate lock audit

# `make demo` needs only the [demo] extra (moto); everything else needs the [dev] tools too.
$(DEMO_STAMP): pyproject.toml
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e '.[demo]'
	touch $(DEMO_STAMP)

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e '.[dev,demo]'
	touch $(STAMP) $(DEMO_STAMP)

demo: $(DEMO_STAMP)
	$(BIN)/rightsizer demo

lint: $(STAMP)
	$(BIN)/ruff check functions tests benchmarks
	$(BIN)/ruff format --check functions tests benchmarks

typecheck: $(STAMP)
	$(BIN)/mypy

contracts: $(STAMP)
	$(BIN)/lint-imports

# `make test`: one progress line per test file (pytest's default), the skip and failure summary at the end.
test: lint typecheck contracts
	$(BIN)/pytest

# `make test-fast`: the unit tests only (no servers, no binaries), for the edit-test loop.
test-fast: $(STAMP)
	$(BIN)/pytest -q tests/unit -m "not slow"

bench: $(STAMP)
	$(BIN)/python benchmarks/plan_scale.py
	$(BIN)/python benchmarks/drain_scale.py
	$(BIN)/python benchmarks/handlers.py
	$(BIN)/python benchmarks/backtest_trace.py

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache .aws-sam

# ------------------------------------------------------------------------------------- Lambda artifact lock
# functions/requirements.txt is the hashed lock of functions/requirements.in for the Lambda runtime
# (python3.12, manylinux x86_64); `sam build` installs exactly it (functions/Makefile, --require-hashes).
# Regenerate after changing requirements.in or to take new releases: `make lock`, then `make test`
# (tests/unit/test_lock.py checks it covers every runtime dependency of pyproject.toml).
LOCK_VENV := .venv-lock
UV := $(LOCK_VENV)/bin/uv

$(UV):
	test -x $(LOCK_VENV)/bin/python || $(PY) -m venv $(LOCK_VENV)
	$(LOCK_VENV)/bin/pip install --quiet uv==0.13.8

lock: $(UV)
	$(UV) pip compile functions/requirements.in --upgrade --python-version 3.12 \
		--python-platform x86_64-manylinux_2_17 --generate-hashes --custom-compile-command "make lock" \
		-o functions/requirements.txt

# ---------------------------------------------------------------------------------------------- validate
# The deployment checks (docs/architecture.md §6). SAM CLI pins old boto3/pydantic, so it lives in its own venv and never
# beside the app; asl-validator comes from npm into a local prefix. `sam build` runs without Docker and needs
# python3.12 on PATH (pyenv: PYENV_VERSION=3.12.1).
SAM_VENV := .venv-sam
SAM := $(SAM_VENV)/bin/sam
CFN_LINT := $(SAM_VENV)/bin/cfn-lint
NODE_PREFIX := .tools/node
ASL_VALIDATOR := $(NODE_PREFIX)/node_modules/.bin/asl-validator
# checkov pins its own dependency tree, so it gets its own virtual environment too; so does pip-audit.
CHECKOV_VENV := .venv-checkov
CHECKOV := $(CHECKOV_VENV)/bin/checkov
AUDIT_VENV := .venv-audit
PIP_AUDIT := $(AUDIT_VENV)/bin/pip-audit
SAM_ENV := SAM_CLI_TELEMETRY=0 PYENV_VERSION=$${PYENV_VERSION:-3.12.1}

$(SAM) $(CFN_LINT):
	test -x $(SAM_VENV)/bin/python || $(PY) -m venv $(SAM_VENV)
	$(SAM_VENV)/bin/pip install --quiet --upgrade pip
	$(SAM_VENV)/bin/pip install --quiet aws-sam-cli cfn-lint

$(ASL_VALIDATOR):
	mkdir -p $(NODE_PREFIX)
	npm install --silent --no-audit --no-fund --prefix $(NODE_PREFIX) asl-validator@4

$(CHECKOV):
	test -x $(CHECKOV_VENV)/bin/python || $(PY) -m venv $(CHECKOV_VENV)
	$(CHECKOV_VENV)/bin/pip install --quiet --upgrade pip
	$(CHECKOV_VENV)/bin/pip install --quiet checkov

$(PIP_AUDIT):
	test -x $(AUDIT_VENV)/bin/python || $(PY) -m venv $(AUDIT_VENV)
	$(AUDIT_VENV)/bin/pip install --quiet --upgrade pip
	$(AUDIT_VENV)/bin/pip install --quiet pip-audit==2.10.1

tools-validate: $(SAM) $(CFN_LINT) $(ASL_VALIDATOR) $(CHECKOV) $(PIP_AUDIT)

# Known vulnerabilities of the locked Lambda artifact (PyPI's advisory database via pip-audit, else OSV's,
# else PyPI's project pages for pins at their newest release): listed and failing when found; what could
# not be checked is said plainly and does not fail.
audit: $(PIP_AUDIT)
	$(PY) tests/support/pip_audit_gate.py $(PIP_AUDIT) functions/requirements.txt

# The deploy parameters (samconfig.toml over the template's defaults), and CONFIG=file / POLICY=file when
# given, checked by the functions' own code before anything is deployed (rightsizer validate).
validate-config: $(STAMP)
	$(BIN)/rightsizer validate --samconfig samconfig.toml --template template.yaml \
		$(if $(CONFIG),--config $(CONFIG)) $(if $(POLICY),--policy $(POLICY))

validate: validate-config tools-validate audit
	$(SAM_ENV) $(SAM) validate --lint --region us-east-1 --template-file template.yaml
	$(CFN_LINT) template.yaml infra/spoke/spoke.yaml
	$(SAM_ENV) $(SAM) build --region us-east-1 --template-file template.yaml
	$(ASL_VALIDATOR) --json-path infra/statemachine/drain.asl.json
	$(ASL_VALIDATOR) --json-path infra/statemachine/fleet.asl.json
	$(ASL_VALIDATOR) --json-path infra/statemachine/shard.asl.json
	# Every checkov finding is fixed or triaged with a reason in infra/checkov/triage.yaml (issue 14).
	$(CHECKOV) -f template.yaml --framework cloudformation --skip-download --quiet -o json \
		| $(CHECKOV_VENV)/bin/python tests/support/checkov_gate.py infra/checkov/triage.yaml
