"""kiln serve through the official `openai` Python client, unchanged: models, chat and text completions (plain and
streamed), sampling reproducibility, stop strings, length limits, logprobs, the error classes the client raises for
kiln's error responses, and concurrent requests. One server on the default model for the whole file."""
import os
import urllib.request
from concurrent.futures import ThreadPoolExecutor

import pytest

from live_server import SOURCE_DIR, KilnServer, default_model

openai = pytest.importorskip("openai", reason="the openai client is not installed (scripts/deps.sh)")

HELLO = [{"role": "user", "content": "What is the capital of France?"}]


@pytest.fixture(scope="module")
def kiln_bin():
    b = os.environ.get("KILN_BIN")
    if not b or not os.path.exists(b):
        pytest.skip("KILN_BIN not set (run through ctest)")
    return b


@pytest.fixture(scope="module")
def server(kiln_bin):
    with KilnServer(kiln_bin, default_model(), ["--parallel", "4"]) as s:
        yield s


@pytest.fixture(scope="module")
def client(server):
    # The client insists on some key even when the server has none; max_retries=0 so errors surface at once.
    return openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0, timeout=120)


@pytest.fixture(scope="module")
def model(client):
    return client.models.list().data[0].id


def chat(client, model, **kw):
    kw.setdefault("messages", HELLO)
    kw.setdefault("max_tokens", 24)
    return client.chat.completions.create(model=model, **kw)


def complete(client, model, **kw):
    kw.setdefault("max_tokens", 16)
    return client.completions.create(model=model, **kw)


def test_models_list(client):
    models = client.models.list().data
    assert len(models) >= 1
    assert models[0].id and models[0].object == "model"


def test_chat_completion(client, model):
    r = chat(client, model, temperature=0)
    assert r.object == "chat.completion"
    assert r.id and r.created > 0 and r.model
    (choice,) = r.choices
    assert choice.index == 0
    assert choice.message.role == "assistant"
    assert isinstance(choice.message.content, str) and choice.message.content.strip()
    assert choice.finish_reason in ("stop", "length")
    u = r.usage
    assert u.prompt_tokens > 0 and 0 < u.completion_tokens <= 24
    assert u.total_tokens == u.prompt_tokens + u.completion_tokens


def test_chat_stream_shape(client, model):
    chunks = list(chat(client, model, temperature=0, stream=True, stream_options={"include_usage": True}))
    assert all(c.object == "chat.completion.chunk" for c in chunks)
    assert len({c.id for c in chunks}) == 1
    with_choices = [c for c in chunks if c.choices]
    assert with_choices[0].choices[0].delta.role == "assistant"
    assert all(c.choices[0].finish_reason is None for c in with_choices[:-1])
    assert with_choices[-1].choices[0].finish_reason in ("stop", "length")
    deltas = [c.choices[0].delta.content for c in with_choices if c.choices[0].delta.content]
    assert len(deltas) >= 2
    # include_usage: one last chunk with empty choices and the usage, counting what was streamed.
    last = chunks[-1]
    assert last.choices == [] and last.usage is not None
    assert 0 < last.usage.completion_tokens <= 24
    assert all(c.usage is None for c in chunks[:-1])


def test_chat_stream_matches_non_stream(client, model):
    whole = chat(client, model, temperature=0).choices[0].message.content
    streamed = "".join(c.choices[0].delta.content or "" for c in chat(client, model, temperature=0, stream=True)
                       if c.choices)
    assert streamed == whole


def test_multi_turn_and_system_message(client, model):
    messages = [{"role": "system", "content": "You are a terse assistant."}, *HELLO,
                {"role": "assistant", "content": "Paris."}, {"role": "user", "content": "And of Italy?"}]
    r = chat(client, model, messages=messages, temperature=0)
    assert r.choices[0].message.content.strip()
    assert r.usage.prompt_tokens > chat(client, model, temperature=0, max_tokens=1).usage.prompt_tokens


def test_completion_string_prompt(client, model):
    r = complete(client, model, prompt="The capital of France is", temperature=0)
    assert r.object == "text_completion"
    (choice,) = r.choices
    assert isinstance(choice.text, str) and choice.text
    assert choice.finish_reason in ("stop", "length")
    assert 0 < r.usage.completion_tokens <= 16


def test_completion_list_prompt(client, model):
    prompts = ["Once upon a time", "The sky is"]
    r = complete(client, model, prompt=prompts, temperature=0)
    assert sorted(c.index for c in r.choices) == [0, 1]
    by_index = {c.index: c.text for c in r.choices}
    # Each prompt's text is what it gets alone.
    for i, p in enumerate(prompts):
        assert by_index[i] == complete(client, model, prompt=p, temperature=0).choices[0].text


def test_completion_stream(client, model):
    chunks = list(complete(client, model, prompt="One, two, three,", temperature=0, stream=True))
    text = "".join(c.choices[0].text for c in chunks if c.choices)
    assert text == complete(client, model, prompt="One, two, three,", temperature=0).choices[0].text
    assert [c for c in chunks if c.choices][-1].choices[0].finish_reason in ("stop", "length")


def test_greedy_is_deterministic(client, model):
    texts = {chat(client, model, temperature=0).choices[0].message.content for _ in range(3)}
    assert len(texts) == 1


def test_seed_reproduces_sampling(client, model):
    def sample(seed):
        return complete(client, model, prompt="My favourite animal is", temperature=1.0, seed=seed,
                        max_tokens=24).choices[0].text

    assert sample(42) == sample(42)
    assert len({sample(s) for s in (1, 2, 3, 4)}) > 1, "four seeds at temperature 1 gave one text"


def test_stop_string(client, model):
    prompt = "Count: 1, 2, 3, 4, 5, 6, 7, 8,"
    free = complete(client, model, prompt=prompt, temperature=0, max_tokens=24).choices[0].text
    stop = free[len(free) // 2:len(free) // 2 + 2]
    assert stop.strip(), f"greedy text too short to pick a stop string from: {free!r}"
    cut = free[:free.index(stop)]
    r = complete(client, model, prompt=prompt, temperature=0, max_tokens=24, stop=[stop])
    assert r.choices[0].text == cut
    assert r.choices[0].finish_reason == "stop"


def test_max_tokens_gives_length(client, model):
    r = chat(client, model, messages=[{"role": "user", "content": "Write a long poem about the sea."}],
             max_tokens=5, temperature=0)
    assert r.choices[0].finish_reason == "length"
    assert r.usage.completion_tokens == 5


def test_chat_logprobs(client, model):
    r = chat(client, model, temperature=0, max_tokens=8, logprobs=True, top_logprobs=3)
    content = r.choices[0].logprobs.content
    assert len(content) == r.usage.completion_tokens
    assert "".join(t.token for t in content) == r.choices[0].message.content
    for t in content:
        assert t.logprob <= 0
        assert len(t.top_logprobs) == 3
        tops = [a.logprob for a in t.top_logprobs]
        assert tops == sorted(tops, reverse=True)
        # Greedy picks the most likely token.
        assert t.token == t.top_logprobs[0].token
        assert t.logprob == pytest.approx(tops[0], abs=1e-5)


def test_completion_logprobs(client, model):
    r = complete(client, model, prompt="The capital of France is", temperature=0, max_tokens=6, logprobs=2)
    lp = r.choices[0].logprobs
    assert len(lp.tokens) == len(lp.token_logprobs) == len(lp.top_logprobs) == r.usage.completion_tokens
    assert "".join(lp.tokens) == r.choices[0].text
    assert all(x <= 0 for x in lp.token_logprobs)
    assert all(len(alts) == 2 for alts in lp.top_logprobs)


def test_missing_messages_is_bad_request(client, model):
    with pytest.raises(openai.BadRequestError) as e:
        client.post("/chat/completions", body={"model": model}, cast_to=object)
    assert e.value.status_code == 400
    assert e.value.body["param"] == "messages"
    assert e.value.body["message"]


@pytest.mark.parametrize("field,value", [("messages", "hello"), ("temperature", "hot"), ("max_tokens", -1),
                                         ("stream", "yes"), ("top_p", 7)])
def test_bad_field_is_bad_request(client, model, field, value):
    body = {"model": model, "messages": HELLO, field: value}
    with pytest.raises(openai.BadRequestError) as e:
        client.post("/chat/completions", body=body, cast_to=object)
    assert e.value.body["param"] == field
    assert e.value.body["type"] == "invalid_request_error"


def test_prompt_too_long_is_bad_request(client, model):
    with pytest.raises(openai.BadRequestError) as e:
        complete(client, model, prompt="hello world " * 20000)
    assert e.value.status_code == 400 and e.value.body["message"]


def test_unknown_route_is_not_found(client):
    with pytest.raises(openai.NotFoundError):
        client.get("/no/such/route", cast_to=object)


def test_wrong_api_key_is_authentication_error(kiln_bin):
    with KilnServer(kiln_bin, default_model(), ["--api-key", "right-key"]) as keyed:
        wrong = openai.OpenAI(base_url=keyed.url + "/v1", api_key="wrong-key", max_retries=0)
        with pytest.raises(openai.AuthenticationError):
            wrong.models.list()
        right = openai.OpenAI(base_url=keyed.url + "/v1", api_key="right-key", max_retries=0)
        model = right.models.list().data[0].id
        assert chat(right, model, max_tokens=4).choices[0].message.content is not None


def test_web_page_is_index_html(server):
    # Not the openai client's business, but this is where a live server is: GET / serves the embedded page as is.
    with urllib.request.urlopen(server.url + "/", timeout=10) as r:
        assert r.status == 200
        assert r.headers["Content-Type"].startswith("text/html")
        page = r.read()
    with open(os.path.join(SOURCE_DIR, "src", "server", "web", "index.html"), "rb") as f:
        assert page == f.read()


def test_concurrent_requests_all_succeed(client, model):
    prompts = [f"Name {n} fruits." for n in range(2, 10)]

    def one(p):
        r = chat(client, model, messages=[{"role": "user", "content": p}], temperature=0, max_tokens=16)
        return r.choices[0].message.content

    with ThreadPoolExecutor(max_workers=6) as pool:
        results = list(pool.map(one, prompts))
    assert all(results)
