"""Images through the three APIs with their official clients, on the synthetic
Qwen3-VL model (qwen3vl-tiny) served with the tiny projector (`--mmproj`; both
written by scripts/synth-models.py): OpenAI `image_url` data URLs (chat) and
`input_image` parts (Responses), Anthropic
`image` blocks, Ollama `images` (chat and generate); an agent re-sending the same
image for three turns has it encoded once and its tokens reported as cached on
turns 2 and 3; bad images, remote URLs and images for a model without a
projector get a 400 naming the problem, and the server serves on."""

import base64
import os
import re
import struct
import sys
import zlib

import anthropic
import httpx
import ollama
import openai
import pytest

from conftest import MODELS, Server

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "scripts", "fixtures"))
from vision_fixtures import pixels, png  # noqa: E402  (the fixtures' test images)

MODEL = "qwen3vl-tiny.gguf"
MMPROJ = os.path.join(MODELS, "mmproj-qwen3vl-tiny.gguf")


@pytest.fixture(scope="module")
def vl():
    """qwen3vl-tiny with its projector."""
    if not os.path.exists(MMPROJ):
        pytest.fail("%s missing (run scripts/synth-models.py)" % MMPROJ)
    s = Server(MODEL, ["--mmproj", MMPROJ, "--vision-device", "cpu"])
    yield s
    s.stop()


@pytest.fixture(scope="module")
def text_only():
    """The same language model without a projector."""
    s = Server(MODEL, [])
    yield s
    s.stop()


def image_png(w=64, h=48, salt=0):
    """A test picture as PNG bytes (64x48: 8 x 6 = 48 image tokens)."""
    rgb = bytearray(pixels(w, h))
    rgb[0] = (rgb[0] + salt) % 256
    return png(w, h, bytes(rgb))


def data_url(data, media="image/png"):
    return "data:%s;base64,%s" % (media, base64.b64encode(data).decode())


def encoded(srv):
    """The server's count of images its vision encoder computed."""
    text = httpx.get(srv.base + "/metrics").text
    return int(re.search(r"^tempo9_engine_images_encoded_total (\d+)", text, re.M).group(1))


def oai(srv):
    return openai.OpenAI(base_url=srv.base + "/v1", api_key="x", max_retries=0, timeout=120)


def user_with_image(text, data):
    return {"role": "user", "content": [{"type": "image_url", "image_url": {"url": data_url(data)}},
                                         {"type": "text", "text": text}]}


def test_openai_image_url(vl):
    c = oai(vl)
    before = encoded(vl)
    plain = c.chat.completions.create(model=vl.name, max_tokens=4, temperature=0,
                                      messages=[{"role": "user", "content": "Describe it."}])
    r = c.chat.completions.create(model=vl.name, max_tokens=4, temperature=0,
                                  messages=[user_with_image("Describe it.", image_png())])
    assert r.choices[0].message.content is not None
    # 48 image tokens between <|vision_start|> and <|vision_end|> (and the
    # newline that joins the parts).
    assert r.usage.prompt_tokens - plain.usage.prompt_tokens >= 48 + 2
    assert encoded(vl) == before + 1


def test_openai_responses_input_image(vl):
    """Responses `input_image` parts (data URLs) take the chat path's image route:
    the same greedy answer and prompt size as chat with the same image, which
    the encoder then has cached; an image by file_id is a 400."""
    c = oai(vl)
    data = image_png(salt=7)
    chat = c.chat.completions.create(model=vl.name, max_tokens=8, temperature=0, messages=[
        {"role": "user", "content": [{"type": "text", "text": "Describe it."},
                                     {"type": "image_url", "image_url": {"url": data_url(data)}}]}])
    before = encoded(vl)
    r = c.responses.create(model=vl.name, max_output_tokens=8, temperature=0, input=[
        {"role": "user", "content": [{"type": "input_text", "text": "Describe it."},
                                     {"type": "input_image", "image_url": data_url(data), "detail": "auto"}]}])
    assert r.output_text == chat.choices[0].message.content
    assert r.usage.input_tokens == chat.usage.prompt_tokens
    assert encoded(vl) == before
    with pytest.raises(openai.BadRequestError) as e:
        c.responses.create(model=vl.name, max_output_tokens=4, input=[
            {"role": "user", "content": [{"type": "input_image", "file_id": "file-abc"}]}])
    assert "file_id" in str(e.value)


def test_anthropic_image_block(vl):
    c = anthropic.Anthropic(base_url=vl.base, api_key="x", max_retries=0, timeout=120)
    block = {"type": "image", "source": {"type": "base64", "media_type": "image/png",
                                         "data": base64.b64encode(image_png(salt=1)).decode()}}
    m = c.messages.create(model=vl.name, max_tokens=4,
                          messages=[{"role": "user", "content": [block, {"type": "text", "text": "What is this?"}]}])
    assert m.content and m.usage.input_tokens > 48 + 2
    with pytest.raises(anthropic.BadRequestError) as e:
        c.messages.create(model=vl.name, max_tokens=4, messages=[{"role": "user", "content": [
            {"type": "image", "source": {"type": "url", "url": "https://example.com/cat.png"}}]}])
    assert "remote image URLs are not fetched" in str(e.value)


def test_ollama_images(vl):
    c = ollama.Client(host=vl.base, timeout=120)
    opts = {"temperature": 0, "num_predict": 4}
    r = c.chat(model=vl.name, options=opts,
               messages=[{"role": "user", "content": "What is this?", "images": [image_png(salt=2)]}])
    assert r.done and r.prompt_eval_count > 48 + 2
    g = c.generate(model=vl.name, prompt="What is this?", images=[image_png(salt=3)], options=opts)
    assert g.done and g.prompt_eval_count > 48 + 2
    with pytest.raises(ollama.ResponseError) as e:
        c.generate(model=vl.name, prompt="x", raw=True, images=[image_png()], options=opts)
    assert e.value.status_code == 400 and "raw prompt" in str(e.value)


def test_an_agent_resending_an_image_has_it_encoded_once_and_cached(vl):
    c = oai(vl)
    picture = image_png(w=72, h=40, salt=4)
    messages = [user_with_image("What is in this picture?", picture)]
    before = encoded(vl)
    cached = []
    for turn in range(3):
        r = c.chat.completions.create(model=vl.name, max_tokens=6, temperature=0, messages=messages)
        cached.append(r.usage.prompt_tokens_details.cached_tokens)
        messages += [{"role": "assistant", "content": r.choices[0].message.content},
                     {"role": "user", "content": "And now, turn %d?" % (turn + 2)}]
    assert encoded(vl) == before + 1, "the image was encoded more than once"
    # The first page (64 tokens) holds the turn's start and the whole image
    # (3 + 1 + 9 x 5 = 45 image tokens + 1): cached on turns 2 and 3.
    assert cached[0] == 0 and cached[1] >= 64 and cached[2] >= 64, cached


def bad_request(c, content):
    with pytest.raises(openai.BadRequestError) as e:
        c.chat.completions.create(model="m", max_tokens=2, messages=[{"role": "user", "content": content}])
    return str(e.value)


def png_header(w, h):
    """A PNG whose header claims `w x h` pixels (its data is never read)."""
    def chunk(tag, data):
        return struct.pack(">I", len(data)) + tag + data + struct.pack(">I", zlib.crc32(tag + data))
    return (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", w, h, 8, 2, 0, 0, 0))
            + chunk(b"IDAT", zlib.compress(b"\x00" * 16)) + chunk(b"IEND", b""))


def test_bad_images_are_400s_naming_the_problem(vl, text_only):
    c = oai(vl)
    part = lambda url: [{"type": "text", "text": "x"}, {"type": "image_url", "image_url": {"url": url}}]  # noqa: E731
    assert "remote image URLs are not fetched" in bad_request(c, part("http://example.com/a.png"))
    assert "cannot be decoded" in bad_request(c, part(data_url(b"\x89PNG\r\n\x1a\nnot really")))
    assert "not supported" in bad_request(c, part(data_url(b"BM" + b"\x00" * 60, "image/bmp")))
    assert "larger than the limit" in bad_request(c, part(data_url(png_header(9000, 9000))))
    assert "invalid base64" in bad_request(c, part("data:image/png;base64,%%%"))
    assert "takes no images" in bad_request(oai(text_only), part(data_url(image_png())))
    # The server serves on.
    r = c.chat.completions.create(model=vl.name, max_tokens=2, messages=[user_with_image("ok?", image_png())])
    assert r.choices[0].finish_reason in ("length", "stop")


def test_vision_capability_is_reported(vl, text_only):
    for srv, vision in ((vl, True), (text_only, False)):
        models = httpx.get(srv.base + "/v1/models").json()["data"]
        assert ("vision" in models[0]["capabilities"]) == vision
        show = ollama.Client(host=srv.base).show(srv.name)
        assert ("vision" in show.capabilities) == vision
