#!/bin/sh
# Mutation check of the model-based test (see scripts/mutants.mjs): builds,
# then runs the model test against each deliberately broken copy of dist/.
# Usage: scripts/mutants.sh [mutant-name ...]
set -e
cd "$(dirname "$0")/.."
npx tsc -p tsconfig.json
exec node scripts/mutants.mjs "$@"
