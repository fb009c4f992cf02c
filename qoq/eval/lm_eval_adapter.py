"""lm-eval tasks over any callable model `input_ids [1, T] -> logits [1, T, V]` and an HF tokenizer.

`lm-eval` is imported only inside functions (the GPU machine lacks it). Requests run one at a time,
unpadded, with a full forward per step (no KV cache): exact and simple, slow for long generations.
Encoding follows lm-eval's HF model: the tokenizer's defaults, context/continuation split by
`TemplateLM._encode_pair`, rolling windows by `lm_eval.utils.get_rolling_token_windows`.
"""

from __future__ import annotations

import functools
import json
from typing import Callable

import torch

from qoq.eval import model_device


def _lm_eval():
    try:
        import lm_eval
        import lm_eval.api.model
        import lm_eval.utils
    except ImportError as e:
        raise ImportError("lm-eval tasks need the `lm-eval` package: pip install 'qoq[eval]'") from e
    return lm_eval


class QoqLMScoring:
    """The scoring half of the adapter; `lm_eval_model` mixes it into lm-eval's `TemplateLM`."""

    def __init__(self, model: Callable, tokenizer, max_length: int = 2048, max_gen_toks: int = 256):
        super().__init__()
        if tokenizer.eos_token_id is None:
            raise ValueError("the tokenizer has no eos token: lm-eval needs one as prefix and stop token")
        self.model, self.tokenizer = model, tokenizer
        self.max_length, self.max_gen_toks = max_length, max_gen_toks
        self.input_device = model_device(model)

    @property
    def eot_token_id(self) -> int:
        return self.tokenizer.eos_token_id

    @property
    def prefix_token_id(self) -> int:
        # what an empty context is conditioned on: BOS when the tokenizer has one, else EOS
        bos = self.tokenizer.bos_token_id
        return bos if bos is not None else self.tokenizer.eos_token_id

    @property
    def tokenizer_name(self) -> str:
        return self.tokenizer.name_or_path.replace("/", "__")

    def tok_encode(self, string: str, add_special_tokens: bool | None = None, **kwargs) -> list[int]:
        special = {} if add_special_tokens is None else {"add_special_tokens": add_special_tokens}
        bos = self.tokenizer.bos_token
        if add_special_tokens is None and bos and string.startswith(bos):
            special = {"add_special_tokens": False}  # a prompt already holding BOS gets no second one
        return self.tokenizer.encode(string, **special)

    def token_logprobs(self, tokens: list[int], last: int) -> torch.Tensor:
        """fp32 log-softmax of the model's logits at the `last` positions of one sequence: [last, V]."""
        ids = torch.tensor([tokens], dtype=torch.long, device=self.input_device)  # [1, T]
        with torch.inference_mode():
            return torch.log_softmax(self.model(ids)[0, -last:].float(), dim=-1)

    def _loglikelihood_tokens(self, requests, disable_tqdm: bool = False) -> list[tuple[float, bool]]:
        results = []
        for _, context_enc, continuation_enc in requests:
            if not continuation_enc:
                results.append((0.0, True))  # nothing to score: log 1, trivially greedy
                continue
            if len(continuation_enc) > self.max_length:
                n = len(continuation_enc)
                raise ValueError(f"a {n}-token continuation exceeds max_length={self.max_length}")
            # left-truncate to the model length; the last token is a target only, never an input
            inputs = (context_enc + continuation_enc)[-(self.max_length + 1) :][:-1]
            logprobs = self.token_logprobs(inputs, last=len(continuation_enc))  # [C, V]
            target = torch.tensor(continuation_enc, device=logprobs.device)  # [C]
            logprob = logprobs.gather(-1, target[:, None]).sum().item()
            is_greedy = bool((logprobs.argmax(dim=-1) == target).all())
            results.append((logprob, is_greedy))
        return results

    def loglikelihood_rolling(self, requests, disable_tqdm: bool = False) -> list[float]:
        utils = _lm_eval().utils
        results = []
        for (string,) in (request.args for request in requests):
            windows = utils.get_rolling_token_windows(
                token_list=self.tok_encode(string),
                prefix_token=self.prefix_token_id,
                max_seq_len=self.max_length,
                context_len=1,
            )
            pairs = [(None, *utils.make_disjoint_window(window)) for window in windows]
            results.append(sum(logprob for logprob, _ in self._loglikelihood_tokens(pairs)))
        return results

    def generate_until(self, requests, disable_tqdm: bool = False) -> list[str]:
        return [self.greedy_generate(*request.args) for request in requests]

    def greedy_generate(self, context: str, gen_kwargs: dict) -> str:
        """Greedy decoding until EOS, a stop string, or `max_gen_toks`; the text is cut before the stop."""
        if gen_kwargs.get("do_sample"):
            raise ValueError("the qoq lm-eval adapter decodes greedily only; the task asked do_sample=True")
        until = gen_kwargs.get("until") or []
        until = [until] if isinstance(until, str) else list(until)
        until.append(self.tokenizer.decode([self.eot_token_id]))
        max_gen_toks = gen_kwargs.get("max_gen_toks", self.max_gen_toks)
        tokens = self.tok_encode(context)[-max(1, self.max_length - max_gen_toks) :]
        generated: list[int] = []
        text = ""
        for _ in range(max_gen_toks):
            next_token = int(self.token_logprobs(tokens + generated, last=1)[0].argmax())
            if next_token == self.eot_token_id:
                break
            generated.append(next_token)
            text = self.tokenizer.decode(generated, skip_special_tokens=True)
            if any(stop and stop in text for stop in until):
                break
        for stop in until:
            if stop:
                text = text.split(stop)[0]
        return text


@functools.cache
def _adapter_class() -> type:
    return type("QoqLM", (QoqLMScoring, _lm_eval().api.model.TemplateLM), {})


def lm_eval_model(model: Callable, tokenizer, max_length: int = 2048, max_gen_toks: int = 256):
    """An `lm_eval.api.model.LM` over `model` and `tokenizer`."""
    return _adapter_class()(model, tokenizer, max_length=max_length, max_gen_toks=max_gen_toks)


def run_lm_eval(
    model: Callable,
    tokenizer,
    tasks: list[str],
    limit: int | float | None = None,
    include_path: str | list[str] | None = None,
    num_fewshot: int | None = None,
    max_length: int = 2048,
    log_samples: bool = False,
    include_defaults: bool = True,
) -> dict:
    """JSON-safe results of `lm_eval.simple_evaluate` on `tasks`: lm-eval's own (indexing them takes
    seconds; skip with include_defaults=False) plus task YAMLs found under `include_path`."""
    lm_eval = _lm_eval()
    from lm_eval.tasks import TaskManager

    task_manager = TaskManager(include_path=include_path, include_defaults=include_defaults)
    results = lm_eval.simple_evaluate(
        model=lm_eval_model(model, tokenizer, max_length=max_length),
        tasks=tasks,
        num_fewshot=num_fewshot,
        limit=limit,
        task_manager=task_manager,
        log_samples=log_samples,
    )
    # numpy scalars and tuples -> plain JSON values, the way lm-eval writes its own result files
    return json.loads(json.dumps(results, default=lm_eval.utils.handle_non_serializable))
