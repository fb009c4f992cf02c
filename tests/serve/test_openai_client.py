"""The official openai client against `qoq serve`: completions and chat, whole and streamed, equal the
engine's greedy output for the same prompt; usage and finish_reason; /v1/models."""

import pytest

from serve_support import API_KEY, MODEL
from qoq.engine import SamplingParams
from qoq.serve.serving import chat_prompt_ids

openai = pytest.importorskip("openai")

PROMPT = "The game"
MESSAGES = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Tell me about the game"}]


@pytest.fixture(scope="module")
def client(server):
    with openai.OpenAI(base_url=server.url + "/v1", api_key=API_KEY, max_retries=0, timeout=60) as c:
        yield c


def engine_greedy(engine, ids, max_tokens):
    return engine.generate([ids], SamplingParams(max_tokens=max_tokens))[0]


@pytest.mark.parametrize("stream", [False, True])
def test_completion_equals_engine_greedy(client, reference_engine, stream):
    want = engine_greedy(reference_engine, reference_engine.encode(PROMPT), 12)
    if not stream:
        res = client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=12, temperature=0)
        assert res.choices[0].text == want.text
        assert res.choices[0].finish_reason == want.finish_reason
        assert res.usage.prompt_tokens == len(want.prompt_ids)
        assert res.usage.completion_tokens == len(want.token_ids)
        assert res.model == MODEL and res.id.startswith("cmpl-")
        return
    chunks = list(client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=12, temperature=0, stream=True,
                                            stream_options={"include_usage": True}))
    assert "".join(c.choices[0].text for c in chunks if c.choices) == want.text
    reasons = [c.choices[0].finish_reason for c in chunks if c.choices]
    assert reasons[-1] == want.finish_reason and not any(reasons[:-1])
    assert chunks[-1].usage.completion_tokens == len(want.token_ids)


@pytest.mark.parametrize("stream", [False, True])
def test_chat_equals_engine_greedy(client, reference_engine, stream):
    want = engine_greedy(reference_engine, chat_prompt_ids(reference_engine.tokenizer, MESSAGES), 10)
    if not stream:
        res = client.chat.completions.create(model=MODEL, messages=MESSAGES, max_tokens=10, temperature=0)
        msg = res.choices[0].message
        assert msg.role == "assistant" and msg.content == want.text
        assert res.choices[0].finish_reason == want.finish_reason
        assert (res.usage.prompt_tokens, res.usage.completion_tokens) == (len(want.prompt_ids), len(want.token_ids))
        return
    chunks = list(client.chat.completions.create(model=MODEL, messages=MESSAGES, max_tokens=10, temperature=0,
                                                 stream=True))
    assert chunks[0].choices[0].delta.role == "assistant"
    assert "".join(c.choices[0].delta.content or "" for c in chunks) == want.text
    assert chunks[-1].choices[0].finish_reason == want.finish_reason


def test_sampling_seed_stop_and_token_prompt(client, reference_engine):
    """A seed gives the engine's seeded tokens; stop strings cut; token-id prompts work."""
    ids = reference_engine.encode(PROMPT)
    params = SamplingParams(max_tokens=8, temperature=0.8, top_p=0.9, top_k=20, seed=7)
    want = reference_engine.generate([ids], params)[0]
    res = client.completions.create(model=MODEL, prompt=ids, max_tokens=8, temperature=0.8, top_p=0.9, seed=7,
                                    extra_body={"top_k": 20})
    assert res.choices[0].text == want.text
    greedy = engine_greedy(reference_engine, ids, 12).text
    stop = greedy[3:6]
    res = client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=12, temperature=0, stop=[stop])
    assert res.choices[0].finish_reason == "stop" and res.choices[0].text == greedy[:greedy.index(stop)]


def test_models_and_health(client, server):
    models = client.models.list()
    assert [m.id for m in models.data] == [MODEL]
    import urllib.request

    with urllib.request.urlopen(server.url + "/health", timeout=5) as r:  # no key needed
        assert r.status == 200
