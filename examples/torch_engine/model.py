"""A Llama-architecture decoder over a paged KV cache, in plain PyTorch on the CPU.

RMSNorm, rotary position embeddings, grouped-query attention and a SwiGLU MLP, with
seeded random weights: the answers are nonsense, but every number is computed the way
a real Llama computes it, so KV restored from kvtier has to be exactly right for the
model to give the same answer.

The KV cache is ONE tensor holding every layer, `[num_layers, 2, num_blocks,
block_size, num_kv_heads, head_dim]`; `cache.layer(i)` is layer i's view in vLLM's
flash-attention shape `[2, num_blocks, block_size, num_kv_heads, head_dim]`. A sequence
owns a block table (engine block ids in token order); `forward` writes the K/V of the
tokens it is given into their slots and attends over everything before them, so a
prefill after a restored prefix computes only the tokens after it.

Everything is fp32, cache included, so the model runs on any x86 CPU and repeated runs
give bit-identical logits (same shapes ⇒ same kernels ⇒ same bits).
Thread-safety: none; a model and a cache belong to one engine thread.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Callable, Sequence

import torch

# Queries per attention step: bounds the score matrix of a long prefill to
# chunk × context floats per head instead of context².
ATTENTION_QUERY_CHUNK = 256


@dataclasses.dataclass(frozen=True)
class ModelConfig:
    num_layers: int = 4
    d_model: int = 256
    num_heads: int = 8
    num_kv_heads: int = 2
    head_dim: int = 32
    ffn_dim: int = 704
    vocab_size: int = 512
    rope_theta: float = 10000.0
    norm_eps: float = 1e-5
    max_positions: int = 32768
    seed: int = 0  # the weights; a different seed is a different model

    @property
    def model_id(self) -> str:
        """Names the weights: engines share KV only when this is equal."""
        return (f"torch-llama-l{self.num_layers}-d{self.d_model}-h{self.num_heads}"
                f"kv{self.num_kv_heads}-f{self.ffn_dim}-v{self.vocab_size}-seed{self.seed}")

    @property
    def kv_bytes_per_token(self) -> int:
        return 2 * self.num_layers * self.num_kv_heads * self.head_dim * 4


CONFIGS = {
    # Fast on two cores: 2 KiB of KV per token, ~3 M parameters.
    "small": ModelConfig(),
    # Closer to a real model's proportions: 16 KiB of KV per token, ~30 M parameters.
    "large": ModelConfig(num_layers=8, d_model=512, num_heads=8, num_kv_heads=4, head_dim=64,
                         ffn_dim=1408, vocab_size=4096),
}


def config_named(name: str, seed: int = 0) -> ModelConfig:
    if name not in CONFIGS:
        raise ValueError(f"unknown model config {name!r}; known: {', '.join(CONFIGS)}")
    return dataclasses.replace(CONFIGS[name], seed=seed)


class PagedKVCache:
    """Paged KV storage for all layers in one tensor, plus its free-block list.

    `allocate_tensor(shape, dtype)` makes the storage: a plain tensor on `device` by
    default, `kvtier.torch.memfd_tensor` when a CPU cache is shared with kvtierd.
    """

    def __init__(self, config: ModelConfig, num_blocks: int, block_size: int = 16,
                 allocate_tensor: Callable[..., torch.Tensor] | None = None,
                 device: str | torch.device = "cpu"):
        self.config = config
        self.num_blocks = num_blocks
        self.block_size = block_size
        shape = (config.num_layers, 2, num_blocks, block_size, config.num_kv_heads,
                 config.head_dim)
        if allocate_tensor is None:
            self.tensor = torch.zeros(shape, dtype=torch.float32, device=device)
        else:
            self.tensor = allocate_tensor(shape, torch.float32)
        self._free = list(range(num_blocks - 1, -1, -1))  # pop() hands out 0, 1, 2, ...

    def layer(self, index: int) -> torch.Tensor:
        """Layer `index`'s `[2, num_blocks, block_size, kv_heads, head_dim]` view."""
        return self.tensor[index]

    def layers(self) -> list[torch.Tensor]:
        return [self.layer(i) for i in range(self.config.num_layers)]

    @property
    def free_blocks(self) -> int:
        return len(self._free)

    def allocate(self, count: int) -> list[int]:
        if count > len(self._free):
            raise MemoryError(f"KV cache full: {count} blocks wanted, {len(self._free)} free")
        return [self._free.pop() for _ in range(count)]

    def free(self, block_ids: Sequence[int], wipe: bool = False) -> None:
        """Returns blocks to the pool; `wipe` fills them with NaN first, so a later read
        of a block nobody rewrote poisons every logit instead of passing silently."""
        if wipe and block_ids:
            self.tensor[:, :, list(block_ids)] = float("nan")
        self._free.extend(reversed(list(block_ids)))

    def blocks_for(self, tokens: int) -> int:
        return -(-tokens // self.block_size)


def _normal(generator: torch.Generator, *shape: int, std: float) -> torch.Tensor:
    return torch.randn(*shape, generator=generator, dtype=torch.float32) * std


class _Layer:
    def __init__(self, config: ModelConfig, generator: torch.Generator):
        d, q_out, kv_out = config.d_model, config.num_heads * config.head_dim, \
            config.num_kv_heads * config.head_dim
        # Weights stored [out, in] like nn.Linear, applied as x @ w.T.
        self.attention_norm = torch.ones(d)
        self.wq = _normal(generator, q_out, d, std=d ** -0.5)
        self.wk = _normal(generator, kv_out, d, std=d ** -0.5)
        self.wv = _normal(generator, kv_out, d, std=d ** -0.5)
        self.wo = _normal(generator, d, q_out, std=q_out ** -0.5)
        self.mlp_norm = torch.ones(d)
        self.w_gate = _normal(generator, config.ffn_dim, d, std=d ** -0.5)
        self.w_up = _normal(generator, config.ffn_dim, d, std=d ** -0.5)
        self.w_down = _normal(generator, d, config.ffn_dim, std=config.ffn_dim ** -0.5)


class LlamaModel:
    """The decoder. `forward` is the only entry point: prefill and decode alike."""

    def __init__(self, config: ModelConfig, device: str | torch.device = "cpu"):
        self.config = config
        self.device = torch.device(device)
        generator = torch.Generator().manual_seed(config.seed)
        self.embedding = _normal(generator, config.vocab_size, config.d_model, std=1.0)
        self.layers = [_Layer(config, generator) for _ in range(config.num_layers)]
        self.final_norm = torch.ones(config.d_model)
        self.lm_head = _normal(generator, config.vocab_size, config.d_model,
                               std=config.d_model ** -0.5)
        # Rotary tables computed once for every position: indexing them gives each
        # position the same bits whatever the chunk it arrives in (computing sin/cos
        # per call would go through vectorised or scalar paths depending on alignment).
        half = config.head_dim // 2
        inv_freq = 1.0 / (config.rope_theta ** (torch.arange(half, dtype=torch.float64) / half))
        angles = torch.outer(torch.arange(config.max_positions, dtype=torch.float64), inv_freq)
        self.rope_cos = torch.cos(angles).to(torch.float32)
        self.rope_sin = torch.sin(angles).to(torch.float32)
        if self.device.type != "cpu":
            # Generated on the CPU (the same seed gives the same weights on any device).
            for owner in (self, *self.layers):
                for name, value in list(vars(owner).items()):
                    if isinstance(value, torch.Tensor):
                        setattr(owner, name, value.to(self.device))

    def _rms_norm(self, x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.config.norm_eps) * weight

    def _rotate(self, x: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        # x: [T, heads, head_dim]; rotate-half convention (as in Hugging Face Llama).
        cos = self.rope_cos[positions].unsqueeze(1)
        sin = self.rope_sin[positions].unsqueeze(1)
        half = x.shape[-1] // 2
        x1, x2 = x[..., :half], x[..., half:]
        return torch.cat((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1)

    @torch.no_grad()
    def forward(self, token_ids: torch.Tensor, start_position: int, block_table: Sequence[int],
                cache: PagedKVCache, all_logits: bool = False) -> torch.Tensor:
        """Runs tokens at positions [start_position, start_position + T).

        REQUIRES: the cache holds valid K/V for positions [0, start_position) in the
        blocks of `block_table`, which has a block for every position up to
        start_position + T. Writes these tokens' K/V into their slots.
        Returns the logits of the last token `[vocab]` (or of every token `[T, vocab]`).
        """
        config = self.config
        tokens = token_ids.numel()
        end = start_position + tokens
        if end > config.max_positions:
            raise ValueError(f"position {end} beyond max_positions {config.max_positions}")
        block_size = cache.block_size
        device = self.device
        table = torch.as_tensor(list(block_table[:cache.blocks_for(end)]), dtype=torch.long,
                                device=device)
        positions = torch.arange(start_position, end, device=device)
        slots = table[positions // block_size] * block_size + positions % block_size
        context_slots = (table.unsqueeze(1) * block_size
                         + torch.arange(block_size, device=device)).reshape(-1)[:end]

        hidden = self.embedding[token_ids.to(device)]
        workspace = _AttentionWorkspace(config.num_heads, tokens, end, device)
        for index, layer in enumerate(self.layers):
            kv = cache.layer(index).view(2, cache.num_blocks * block_size,
                                         config.num_kv_heads, config.head_dim)
            x = self._rms_norm(hidden, layer.attention_norm)
            q = (x @ layer.wq.T).view(tokens, config.num_heads, config.head_dim)
            k = (x @ layer.wk.T).view(tokens, config.num_kv_heads, config.head_dim)
            v = (x @ layer.wv.T).view(tokens, config.num_kv_heads, config.head_dim)
            kv[0, slots] = self._rotate(k, positions)
            kv[1, slots] = v
            q = self._rotate(q, positions)
            attended = _paged_attention(q, kv[0, context_slots], kv[1, context_slots],
                                        start_position, workspace)
            hidden = hidden + attended @ layer.wo.T
            x = self._rms_norm(hidden, layer.mlp_norm)
            gated = torch.nn.functional.silu(x @ layer.w_gate.T) * (x @ layer.w_up.T)
            hidden = hidden + gated @ layer.w_down.T
        if not all_logits:
            hidden = hidden[-1:]
        logits = self._rms_norm(hidden, self.final_norm) @ self.lm_head.T
        return logits if all_logits else logits[0]


class _AttentionWorkspace:
    """Score and probability buffers reused by every chunk of every layer of one forward.

    A long prefill's chunks each need 100+ MiB of scores; allocated per chunk, every one
    would be a fresh mmap and page-faulted anew (glibc maps large blocks and unmaps them
    on free): more system time than arithmetic.
    """

    def __init__(self, num_heads: int, tokens: int, context: int, device: torch.device):
        size = num_heads * min(tokens, ATTENTION_QUERY_CHUNK) * context
        self.device = device
        self.scores = torch.empty(size, device=device)
        self.probabilities = torch.empty(size, device=device)
        self.future_masks: dict[int, torch.Tensor] = {}

    def future_mask(self, chunk: int) -> torch.Tensor:
        """[chunk, chunk], True where a key lies after its query."""
        if chunk not in self.future_masks:
            self.future_masks[chunk] = torch.ones(chunk, chunk, dtype=torch.bool,
                                                  device=self.device).triu(1)
        return self.future_masks[chunk]


def _paged_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, start_position: int,
                     workspace: _AttentionWorkspace) -> torch.Tensor:
    """Causal grouped-query attention of queries at [start_position, start_position + T)
    over keys/values at [0, start_position + T).

    q: [T, heads, head_dim]; k, v: [context, kv_heads, head_dim]. Returns [T, heads × head_dim].
    """
    tokens, num_heads, head_dim = q.shape
    num_kv_heads = k.shape[1]
    group = num_heads // num_kv_heads
    # Each KV head with its group of query heads as one batch entry: [kv_heads, group, T, dim].
    queries = (q * head_dim ** -0.5).view(tokens, num_kv_heads, group, head_dim).permute(1, 2, 0, 3)
    # [kv_heads, context, dim] views: BLAS reads the strided rows, no copy needed.
    keys, values = k.transpose(0, 1), v.transpose(0, 1)
    out = torch.empty(num_kv_heads, group, tokens, head_dim, device=q.device)
    for first in range(0, tokens, ATTENTION_QUERY_CHUNK):
        last = min(tokens, first + ATTENTION_QUERY_CHUNK)
        chunk = last - first
        visible = start_position + last  # keys this chunk may see
        shape = (num_kv_heads, group * chunk, visible)
        scores = workspace.scores[:num_heads * chunk * visible].view(shape)
        probabilities = workspace.probabilities[:num_heads * chunk * visible].view(shape)
        chunk_queries = queries[:, :, first:last].reshape(num_kv_heads, group * chunk, head_dim)
        torch.bmm(chunk_queries, keys[:, :visible].transpose(1, 2), out=scores)
        # Only the chunk's own keys can lie in a query's future.
        scores.view(num_kv_heads, group, chunk, visible)[..., visible - chunk:].masked_fill_(
            workspace.future_mask(chunk), float("-inf"))
        # torch.softmax's own kernel, writing into the workspace (it has no out= form).
        torch.ops.aten._softmax.out(scores, -1, False, out=probabilities)
        out[:, :, first:last] = torch.bmm(probabilities, values[:, :visible]).view(
            num_kv_heads, group, chunk, head_dim)
    return out.permute(2, 0, 1, 3).reshape(tokens, num_heads * head_dim)
