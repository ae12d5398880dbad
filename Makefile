# Train Faster: two commands do everything.
#   make book   build the site, every chapter executed, into _build/html
#   make test   run the tests (listings, parity with torch, chapters executed, workflows)
# Both create the project environment (.venv) on first use and reuse it after.

PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed

.PHONY: book test lint measure clean

$(STAMP): requirements.txt pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -r requirements.txt
	$(BIN)/python -m pip install --quiet --no-deps -e .
	$(BIN)/python -m ipykernel install --sys-prefix --name python3 >/dev/null
	touch $(STAMP)

book: $(STAMP)
	$(BIN)/jupyter-book build . -W -n --keep-going

test: $(STAMP)
	$(BIN)/python -m pytest $(PYTEST_ARGS)

lint: $(STAMP)
	$(BIN)/ruff check .

# Write measurement records for this machine into book/records (run on the GPU runner too).
measure: $(STAMP)
	$(BIN)/python -m trainfast.measure --out book/records

clean:
	rm -rf _build
