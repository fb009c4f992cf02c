"""A request as the engine tracks it (Sequence), and what a step reports about it (RequestOutput)."""

from __future__ import annotations

import enum
from dataclasses import dataclass, field

from qoq.engine.params import SamplingParams


class Status(enum.Enum):
    WAITING = "waiting"
    RUNNING = "running"
    FINISHED = "finished"


class Sequence:
    """Prompt ids, generated ids and progress. `num_computed` counts the tokens whose K/V are in the
    cache; the tokens still to feed are all_ids[num_computed:]. A preempted sequence keeps its output
    ids and restarts from num_computed = 0 (recomputation re-prefills prompt + output)."""

    def __init__(self, seq_id: int, prompt_ids: list[int], params: SamplingParams, arrival: int):
        if not prompt_ids:
            raise ValueError("a request needs at least one prompt token")
        self.seq_id = seq_id
        self.prompt_ids = list(prompt_ids)
        self.output_ids: list[int] = []
        self.params = params
        self.arrival = arrival  # admission order (FCFS)
        self.status = Status.WAITING
        self.num_computed = 0
        self.num_preemptions = 0
        self.finish_reason: str | None = None
        self.seed: int | None = None  # what the sampler draws with (params.seed, or drawn at the first draw)
        self.detok = None  # the engine's incremental detokenizer for this request
        self.text = ""  # text emitted so far

    @property
    def all_ids(self) -> list[int]:
        return self.prompt_ids + self.output_ids

    def token(self, i: int) -> int:
        """all_ids[i] without building all_ids."""
        prompt = self.prompt_ids
        return prompt[i] if i < len(prompt) else self.output_ids[i - len(prompt)]

    def tokens(self, start: int, end: int) -> list[int]:
        """all_ids[start:end] without building all_ids."""
        prompt = self.prompt_ids
        n = len(prompt)
        if start >= n:
            return self.output_ids[start - n : end - n]
        if end <= n:
            return prompt[start:end]
        return prompt[start:] + self.output_ids[: end - n]

    def __len__(self) -> int:
        return len(self.prompt_ids) + len(self.output_ids)

    @property
    def num_uncomputed(self) -> int:
        return len(self) - self.num_computed

    @property
    def is_finished(self) -> bool:
        return self.status == Status.FINISHED


@dataclass(slots=True)
class RequestOutput:
    """What one step produced for one request."""

    request_id: int
    new_token_ids: list[int]
    text_delta: str
    finished: bool
    finish_reason: str | None = None  # "stop" | "length" | "abort"


@dataclass
class Completion:
    """A whole request's result (LLMEngine.generate)."""

    request_id: int
    prompt_ids: list[int]
    token_ids: list[int] = field(default_factory=list)
    text: str = ""
    finish_reason: str | None = None
