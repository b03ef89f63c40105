#!/usr/bin/env bash
# The main job on a bundled sample model: inspect the export, cast it to 16-bit, convert it, inspect the
# asset, quantize its weights to int8 and palettize them to 4-bit LUTs, and compare each with it on the
# Core AI runtime; then the .pt2 route: palettize the export, compare in PyTorch, cast, convert.
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

echo "== coreopt compare $out/transformer.aimodel int8 lut4   (a sweep: the reference runs once, one row each)"
coreopt compare "$out/transformer.aimodel" "$out/transformer.int8.aimodel" "$out/transformer.lut4.aimodel"

# The .pt2 route: compress the export itself (coreai-torch's ops), check it in PyTorch in seconds,
# then cast it to 16-bit and convert it - no full-precision .aimodel needed.
echo "== coreopt palettize $model.pt2 --nbits 4 --granularity channel"
coreopt palettize "$model.pt2" --nbits 4 --granularity channel -o "$out/transformer.lut4.pt2" --force

echo "== coreopt compare $model.pt2 $out/transformer.lut4.pt2 --min-cosine 0.99   (both in PyTorch)"
coreopt compare "$model.pt2" "$out/transformer.lut4.pt2" --min-cosine 0.99

echo "== coreopt cast $out/transformer.lut4.pt2 --to 16bit, then convert"
coreopt cast "$out/transformer.lut4.pt2" --to 16bit -o "$out/transformer.lut4.16bit.pt2" --force
coreopt convert "$out/transformer.lut4.16bit.pt2" -o "$out/transformer.lut4.16bit.aimodel" --force

echo "== coreopt compare $out/transformer.aimodel $out/transformer.lut4.16bit.aimodel --min-cosine 0.99"
coreopt compare "$out/transformer.aimodel" "$out/transformer.lut4.16bit.aimodel" --min-cosine 0.99
