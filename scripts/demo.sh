#!/usr/bin/env bash
# The main job on a bundled sample model: inspect the export, cast it to 16-bit, convert it, inspect the
# asset, quantize its weights to int8 and palettize them to 4-bit LUTs, and compare each with it on the
# Core AI runtime.
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

echo "== coreopt quantize $out/transformer.aimodel --dtype int8"
coreopt quantize "$out/transformer.aimodel" --dtype int8 -o "$out/transformer.int8.aimodel" --force

echo "== coreopt compare $out/transformer.aimodel $out/transformer.int8.aimodel --min-cosine 0.999"
coreopt compare "$out/transformer.aimodel" "$out/transformer.int8.aimodel" --min-cosine 0.999

echo "== coreopt palettize $out/transformer.aimodel --nbits 4 --granularity channel"
coreopt palettize "$out/transformer.aimodel" --nbits 4 --granularity channel -o "$out/transformer.lut4.aimodel" --force

echo "== coreopt compare $out/transformer.aimodel $out/transformer.lut4.aimodel --min-cosine 0.99"
coreopt compare "$out/transformer.aimodel" "$out/transformer.lut4.aimodel" --min-cosine 0.99
