"""Text from a stateful decoder (`coreopt export --kv-cache`): `StatefulDecoder` runs the program
with its key/value cache as state in PyTorch, `AssetDecoder` the converted one on the Core AI
runtime, `generate` makes tokens from a prompt (greedy or sampled, as
`GenerateConfig` says), timing the prefill and the decode steps."""

from ._asset import AssetDecoder
from ._config import GenerateConfig
from ._decoder import Decoder, NotADecoder, StatefulDecoder
from ._files import OpenDecoder, TextStream, check_decoder_path, open_decoder
from ._generate import Generation, generate

__all__ = [
    "AssetDecoder",
    "Decoder",
    "GenerateConfig",
    "Generation",
    "NotADecoder",
    "OpenDecoder",
    "StatefulDecoder",
    "TextStream",
    "check_decoder_path",
    "generate",
    "open_decoder",
]
