"""Writes a small Llama-architecture model with seeded random weights and a word-level
tokenizer ("t0" .. "t511"), no hub: what the vLLM tests and benchmark serve.

    python tiny_llama.py OUT_DIR [--seed N] [--gqa] [--layers L] [--hidden H] ...

(--gqa: the GQA shape's defaults for the other flags.)

``write_tiny_llama`` writes the 4-layer model of hidden size 128 (4 query heads over 2
KV heads); ``write_gqa_llama`` one of another shape: hidden size 256, 8 query heads
over 2 KV heads (4 per KV head), head size 32, 4 layers. Both fp32.
"""

from __future__ import annotations

import argparse
from pathlib import Path

TINY = dict(vocab_size=512, hidden_size=128, intermediate_size=256, num_hidden_layers=4,
            num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=4096)

GQA = dict(TINY, hidden_size=256, intermediate_size=512, num_attention_heads=8, num_key_value_heads=2)


def write_tiny_llama(directory: Path, seed: int = 0, **overrides) -> Path:
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    config = LlamaConfig(**{**TINY, **overrides}, torch_dtype="float32")
    torch.manual_seed(seed)
    LlamaForCausalLM(config).save_pretrained(directory, safe_serialization=True)
    write_tokenizer(directory, config.vocab_size)
    return directory


def write_gqa_llama(directory: Path, seed: int = 0, **overrides) -> Path:
    """The grouped-query-attention shape (GQA above), otherwise as write_tiny_llama."""
    return write_tiny_llama(directory, seed, **{**GQA, **overrides})


def kv_block_bytes(directory: Path, tokens_per_block: int, dtype_bytes: int = 4) -> int:
    """Bytes of one KV cache block of the model in directory (keys and values of every
    layer): what vLLM's cache and kvtierd store per block."""
    import json

    config = json.loads((Path(directory) / "config.json").read_text())
    head_dim = config.get("head_dim") or config["hidden_size"] // config["num_attention_heads"]
    return (config["num_hidden_layers"] * 2 * config["num_key_value_heads"] * tokens_per_block * head_dim
            * dtype_bytes)


def write_tokenizer(directory: Path, vocab_size: int) -> None:
    """A word-level tokenizer whose words are "t0" .. "t{vocab_size-1}" (token i is "ti"),
    with a plain chat template: enough for vLLM's OpenAI server to take text."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    words = Tokenizer(models.WordLevel(vocab={f"t{i}": i for i in range(vocab_size)}, unk_token="t0"))
    words.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=words, unk_token="t0", bos_token="t1",
                                        eos_token="t2", pad_token="t0")
    tokenizer.chat_template = "{% for m in messages %}t3 {{ m['content'] }} {% endfor %}t4"
    tokenizer.save_pretrained(directory)


if __name__ == "__main__":
    shape = argparse.ArgumentParser(add_help=False)
    shape.add_argument("--gqa", action="store_true")
    base = GQA if shape.parse_known_args()[0].gqa else TINY  # the other flags' defaults
    parser = argparse.ArgumentParser(parents=[shape])
    parser.add_argument("out")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--layers", type=int, default=base["num_hidden_layers"])
    parser.add_argument("--hidden", type=int, default=base["hidden_size"])
    parser.add_argument("--heads", type=int, default=base["num_attention_heads"])
    parser.add_argument("--kv-heads", type=int, default=base["num_key_value_heads"])
    parser.add_argument("--max-len", type=int, default=base["max_position_embeddings"])
    a = parser.parse_args()
    write_tiny_llama(Path(a.out), a.seed, num_hidden_layers=a.layers, hidden_size=a.hidden,
                     intermediate_size=2 * a.hidden, num_attention_heads=a.heads,
                     num_key_value_heads=a.kv_heads, max_position_embeddings=a.max_len)
