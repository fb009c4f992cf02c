"""The CPU engine on SmolLM2's fp16 artifact: greedy tokens equal HF transformers' fp32 greedy generate."""

import pytest
import torch

pytestmark = pytest.mark.slow

PROMPTS = [
    "The capital of France is", "def fibonacci(n):", "Once upon a time,", "1, 2, 3, 4,",
    "The theory of relativity states that", "Ingredients for a simple pancake recipe:",
    "In Python, a list comprehension", "The quick brown fox",
]


def test_greedy_equals_hf_generate(smollm2_fp16, make_engine):
    from transformers import AutoModelForCausalLM

    from qoq.engine import SamplingParams

    engine = make_engine(smollm2_fp16, kv_budget=64 << 20)
    outs = engine.generate(PROMPTS, SamplingParams(max_tokens=32))
    hf = AutoModelForCausalLM.from_pretrained(smollm2_fp16, dtype=torch.float32).eval()
    with torch.inference_mode():
        for out in outs:
            ids = torch.tensor([out.prompt_ids])
            want = hf.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=32, do_sample=False)
            assert out.token_ids == want[0, ids.shape[1]:].tolist()
            assert len(out.token_ids) == 32 or out.finish_reason == "stop"
