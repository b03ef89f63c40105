#!/usr/bin/env bash
# The main job on a bundled sample model: inspect the export, convert it, inspect the asset.
set -euo pipefail
cd "$(dirname "$0")/.."
out="${DEMO_OUT:-build/demo}"
mkdir -p "$out"
model=sample_models/transformer

echo "== coreopt inspect $model.pt2"
coreopt inspect "$model.pt2"

echo "== coreopt convert $model.pt2"
coreopt convert "$model.pt2" -o "$out/transformer.aimodel" --force

echo "== coreopt inspect $out/transformer.aimodel"
coreopt inspect "$out/transformer.aimodel"
