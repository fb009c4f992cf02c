"""Offline stand-ins for tests: a byte-level BPE tokenizer trained on a few KB of WikiText-2 and a
tiny causal model (running mean of embeddings -> linear head)."""

from __future__ import annotations

from pathlib import Path

import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import PreTrainedTokenizerFast

EOS = "<|endoftext|>"


def train_tokenizer(data_dir: Path, vocab_size: int = 400, chars: int = 20_000) -> PreTrainedTokenizerFast:
    """Byte-level BPE (reversible on any text) trained on the first `chars` characters of the test split."""
    text = (data_dir / "wikitext-2-raw" / "wiki.test.raw").read_text(encoding="utf-8")[:chars]
    bpe = Tokenizer(models.BPE())
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    bpe.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size, special_tokens=[EOS], initial_alphabet=pre_tokenizers.ByteLevel.alphabet()
    )
    bpe.train_from_iterator(text.splitlines(keepends=True), trainer=trainer)
    return PreTrainedTokenizerFast(tokenizer_object=bpe, eos_token=EOS, bos_token=EOS)


class TinyCausalLM(torch.nn.Module):
    """logits[t] = head(mean(embed(ids[:t+1]))): causal, depends on the whole prefix, cheap."""

    def __init__(self, vocab_size: int, hidden: int = 16, seed: int = 0):
        super().__init__()
        torch.manual_seed(seed)
        self.embed = torch.nn.Embedding(vocab_size, hidden)
        self.head = torch.nn.Linear(hidden, vocab_size)

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        h = self.embed(input_ids)  # [B, T, H]
        positions = torch.arange(1, input_ids.shape[1] + 1, device=h.device)  # [T]
        h = h.cumsum(dim=1) / positions[None, :, None]  # [B, T, H]
        return 4.0 * self.head(h)  # [B, T, V], sharpened so greedy/argmax answers are not near-ties
