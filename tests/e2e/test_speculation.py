"""Speculative decoding through the official `openai` client: a predicted output
(OpenAI's `prediction`) drafts the answer, which stays what decoding without it
gives, and the drafts are reported in `usage`."""

import openai
import pytest

from conftest import QWEN, Server

CODE = """def area(w, h):
    return w * h


def perimeter(w, h):
    return 2 * (w + h)
"""
MSG = [{"role": "user", "content": "Repeat this code exactly, in a code block:\n\n" + CODE}]


@pytest.fixture(scope="module")
def spec():
    """Qwen2.5-Coder-0.5B with n-gram speculation (k = 4), batch-invariant, at a fixed
    depth: the planned depth follows the measured cost of a step's rows, so on a loaded
    machine it may rightly decline to draft (seen with other jobs beside the tests);
    these tests check the prediction's drafts and output, the planner has its own."""
    s = Server(QWEN, ["--speculation-k", "4", "--speculation-fixed-depth", "--deterministic"])
    yield s
    s.stop()


def ask(srv, **kw):
    c = openai.OpenAI(base_url=srv.base + "/v1", api_key="x", max_retries=0, timeout=120)
    return c.chat.completions.create(model=srv.name, messages=MSG, max_tokens=64, temperature=0, **kw)


def test_a_prediction_drafts_but_changes_nothing(spec):
    plain = ask(spec, extra_body={"speculation": False})
    text = plain.choices[0].message.content
    assert "perimeter" in text
    details = plain.usage.completion_tokens_details
    assert details.accepted_prediction_tokens == 0 and details.rejected_prediction_tokens == 0
    # The right answer with one word changed: drafts hold up to the change and after it.
    edited = text.replace("perimeter", "circumference")
    for prediction in [text, edited, [{"type": "text", "text": edited}]]:
        r = ask(spec, prediction={"type": "content", "content": prediction})
        assert r.choices[0].message.content == text
        d = r.usage.completion_tokens_details
        assert d.accepted_prediction_tokens >= r.usage.completion_tokens // 2, d
    r = ask(spec, prediction={"type": "content", "content": edited})
    assert r.usage.completion_tokens_details.rejected_prediction_tokens > 0


def test_a_malformed_prediction_is_a_400(spec):
    with pytest.raises(openai.BadRequestError) as e:
        ask(spec, prediction={"type": "image", "content": "x"})
    assert "prediction" in str(e.value)
