"""Prompt logprobs (/v1/completions echo + logprobs) scored by the model itself (port.h
row_scores, batch_seq.score: the engine's way — every backend scores the rows where its
logits are, a whole prompt chunk a forward) against the scheduler's other path (each row's
logits to the host, SCHED_PROMPT_LP_ROWS rows a forward, scored there). The mock model does
either (ORCHID_MOCK_ROW_SCORES=1 or not), with the same numbers (both sampler_row_logprobs
over the same logits), so every answer must be identical: prompts
shorter and longer than 16 tokens and than the prompt chunk, top logprobs 0..5, max_tokens 0
and > 0 (the prompt's last row then gives the first generated token), a batch of prompts,
beside plain requests in the same steps.
"""

from serverproc import MODEL, Server, run_together

CASES = {
    "short": dict(prompt="hello there", logprobs=0, max_tokens=0),
    "long": dict(prompt="the quick brown fox jumps over the lazy dog " * 3, logprobs=3, max_tokens=0),
    "gen": dict(prompt="tell me something about row scores and chunks", logprobs=5, max_tokens=6),
    "batch": dict(prompt=["first prompt of two", "and a second, longer prompt of the batch"], logprobs=2,
                  max_tokens=2),
    "past_chunk": dict(prompt="x" * 90, logprobs=1, max_tokens=1),
}


def answer(client, fields):
    r = client.completions.create(model=MODEL, echo=True, temperature=0, **fields)
    return [(c.text, c.logprobs.tokens, c.logprobs.token_logprobs, c.logprobs.top_logprobs, c.logprobs.text_offset)
            for c in r.choices]


def plain(client):
    return client.completions.create(model=MODEL, prompt="plain request", max_tokens=12, temperature=0).choices[0].text


def run(env):
    with Server(mock=True, args=["--parallel", "4", "--prefill-chunk", "32", "--quiet"], env=env) as srv:
        client = srv.client(timeout=60)
        alone = {n: answer(client, f) for n, f in CASES.items()}
        jobs = {n: (lambda f=f: answer(srv.client(timeout=60), f)) for n, f in CASES.items()}
        jobs["plain"] = lambda: plain(srv.client(timeout=60))
        together = run_together(jobs)
    return alone, together


def test_row_scores_match_the_logits_path():
    scored_alone, scored_together = run({"ORCHID_MOCK_ROW_SCORES": "1"})
    host_alone, host_together = run({})
    for n in CASES:
        assert scored_alone[n] == host_alone[n], n
        assert scored_together[n] == scored_alone[n], n
        assert host_together[n] == host_alone[n], n
    # the entries are there: every prompt token after the first has a logprob
    text, tokens, lps, tops, offsets = scored_alone["long"][0]
    assert lps[0] is None and all(isinstance(v, float) for v in lps[1:len(tokens)])
    assert all(len(t) == 3 for t in tops[1:])
    assert scored_together["plain"] == host_together["plain"]
