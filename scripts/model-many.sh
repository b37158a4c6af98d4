#!/bin/sh
# Runs the model-based coordinator test with many more sequences than CI.
# Usage: scripts/model-many.sh [N]   (default 50000; BERTH_MODEL_SEED fixes the seed)
set -e
cd "$(dirname "$0")/.."
npx tsc -p tsconfig.json
BERTH_MODEL_RUNS="${1:-50000}" exec node scripts/run-tests.mjs test/model/coordinator-model
