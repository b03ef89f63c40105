#!/usr/bin/env bash
# The main job on a bundled sample model: inspect the export, cast it to 16-bit, convert it, inspect the asset.
set -euo pipefail
cd "$(dirname "$0")/.."
out="${DEMO_OUT:-build/demo}"
mkdir -p "$out"
model=sample_models/transformer

echo "== coreopt inspect $model.pt2"
coreopt inspect "$model.pt2"

echo "== coreopt cast $model.pt2 --to 16bit"
coreopt cast "$model.pt2" --to 16bit -o "$out/transformer.16bit.pt2" --force

echo "== coreopt convert $out/transformer.16bit.pt2"
coreopt convert "$out/transformer.16bit.pt2" -o "$out/transformer.aimodel" --force

echo "== coreopt inspect $out/transformer.aimodel"
coreopt inspect "$out/transformer.aimodel"
