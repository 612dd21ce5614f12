"""Images through the three APIs with their official clients on the synthetic
Gemma 4 model (gemma4-tiny) served with the tiny gemma4v projector
(`--mmproj`; both written by scripts/synth-models.py): OpenAI `image_url`,
Anthropic `image` blocks, Ollama `images` (chat and generate) each reach the
model as mtmd frames them for Gemma 4 (`<|image>`, one placeholder per image
token, `<image|>`); an image re-sent in later turns is encoded once; the
recorded prompt as a chat message takes the prompt tokens llama-server
evaluated."""

import base64
import json
import os

import anthropic
import ollama
import openai
import pytest

from conftest import MODELS, Server
from test_vision import encoded, image_png, user_with_image  # the same helpers

ROOT = os.path.join(os.path.dirname(__file__), "..", "..")

MODEL = "gemma4-tiny.gguf"
MMPROJ = os.path.join(MODELS, "mmproj-gemma4-tiny.gguf")
# A 64x48 picture is under Gemma 4's minimum of 70 tokens: scaled up to
# 120x96 pixels, 10 x 8 = 80 tokens of 12x12 pixels.
IMAGE_TOKENS = 80


@pytest.fixture(scope="module")
def g4():
    if not os.path.exists(MMPROJ):
        pytest.fail("%s missing (run scripts/synth-models.py)" % MMPROJ)
    s = Server(MODEL, ["--mmproj", MMPROJ, "--vision-device", "cpu"])
    yield s
    s.stop()


def oai(srv):
    # Gemma 4's tiny model answers slower than Qwen3-VL's: a longer timeout.
    return openai.OpenAI(base_url=srv.base + "/v1", api_key="x", max_retries=0, timeout=300)


def test_openai_image_url(g4):
    c = oai(g4)
    before = encoded(g4)
    plain = c.chat.completions.create(model=g4.name, max_tokens=4, temperature=0,
                                      messages=[{"role": "user", "content": "Describe it."}])
    r = c.chat.completions.create(model=g4.name, max_tokens=4, temperature=0,
                                  messages=[user_with_image("Describe it.", image_png())])
    assert r.choices[0].message.content is not None
    # The image's tokens between <|image> and <image|>.
    assert r.usage.prompt_tokens - plain.usage.prompt_tokens >= IMAGE_TOKENS + 2
    assert encoded(g4) == before + 1


def test_anthropic_image_block(g4):
    c = anthropic.Anthropic(base_url=g4.base, api_key="x", max_retries=0, timeout=300)
    block = {"type": "image", "source": {"type": "base64", "media_type": "image/png",
                                         "data": base64.b64encode(image_png(salt=1)).decode()}}
    m = c.messages.create(model=g4.name, max_tokens=4,
                          messages=[{"role": "user", "content": [block, {"type": "text", "text": "What is this?"}]}])
    assert m.content and m.usage.input_tokens > IMAGE_TOKENS + 2


def test_ollama_images(g4):
    c = ollama.Client(host=g4.base, timeout=300)
    opts = {"temperature": 0, "num_predict": 4}
    r = c.chat(model=g4.name, options=opts,
               messages=[{"role": "user", "content": "What is this?", "images": [image_png(salt=2)]}])
    assert r.done and r.prompt_eval_count > IMAGE_TOKENS + 2
    g = c.generate(model=g4.name, prompt="What is this?", images=[image_png(salt=3)], options=opts)
    assert g.done and g.prompt_eval_count > IMAGE_TOKENS + 2


def test_a_resent_image_is_encoded_once(g4):
    c = oai(g4)
    messages = [user_with_image("What is in this picture?", image_png(w=72, h=40, salt=4))]
    before = encoded(g4)
    for turn in range(2):
        r = c.chat.completions.create(model=g4.name, max_tokens=4, temperature=0, messages=messages)
        messages += [{"role": "assistant", "content": r.choices[0].message.content},
                     {"role": "user", "content": "And now, turn %d?" % (turn + 2)}]
    assert encoded(g4) == before + 1, "the image was encoded more than once"


def test_the_recorded_prompt_as_a_chat_message_takes_llama_servers_tokens(g4):
    """The fixtures' prompt (scripts/fixtures/vision_fixtures_gemma4.py: the
    user turn `<image>Describe this picture.` as llama-server's own template
    rendering gives it) sent as a chat message takes as many prompt tokens as
    llama-server evaluated for it: rendering, BOS, the framing tokens and the
    image's token count agree, on pictures of 221 and 125 tokens."""
    fx_dir = os.path.join(ROOT, "tests", "fixtures", "gemma4-tiny", "vision", "greedy")
    fx = json.load(open(os.path.join(fx_dir, sorted(os.listdir(fx_dir))[0])))
    c = oai(g4)
    for name, w, h in [("b", 200, 150), ("d", 300, 60)]:
        r = c.chat.completions.create(model=g4.name, max_tokens=1, temperature=0,
                                      messages=[user_with_image(fx["user_text"], image_png(w, h))])
        im = next(i for i in fx["images"] if i["name"] == name)
        assert r.usage.prompt_tokens == im["tokens_evaluated"], name
