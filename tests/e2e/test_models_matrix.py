"""The model matrix page (bench/models/): docs/models.md is exactly what the renderer
makes of the committed results, every file has a row of pass / fail / not run cells,
and the greedy comparison that fills those cells tells a match from a parting."""

import copy
import json
import os
import re
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "bench", "models"))

import checks  # noqa: E402
import render  # noqa: E402
from files import FILES  # noqa: E402


def table_rows(text):
    head = text.index("| file | arch | kind |")
    rows = []
    for line in text[head:].splitlines()[2:]:
        if not line.startswith("|"):
            break
        rows.append([c.strip() for c in line.strip("|").split(" | ")])
    return rows


def test_committed_page_is_the_rendered_results():
    with open(os.path.join(ROOT, "docs", "models.md"), encoding="utf-8") as f:
        committed = f.read()
    assert render.page_text() == committed, (
        "docs/models.md differs from its rendering: python3 bench/models/matrix.py --render-only")


def test_every_file_has_a_row_of_known_cells():
    rows = table_rows(render.page_text())
    assert [r[0] for r in rows] == ["[`%s`](#%s)" % (f.name, render.anchor(f.name)) for f in FILES]
    for r in rows:
        assert r[2] in ("real", "synthetic")
        for cell in r[3:]:
            assert cell in ("pass", "**fail**", "not run"), r


def test_results_keep_a_reason_for_every_failure_and_skip():
    for run in render.load_results():
        for name, f in run["files"].items():
            for key, c in f["cells"].items():
                assert c["status"] in (checks.PASS, checks.FAIL, checks.NOT_RUN)
                if c["status"] != checks.PASS:
                    assert c["reason"], (name, key)


def fixture_case():
    path = os.path.join(ROOT, "tests", "fixtures", "qwen3-tiny", "greedy", "x86_64-avx512.json")
    return json.load(open(path, encoding="utf-8"))["cases"][0]


def generation_of(case, pieces):
    return {"text": "".join(pieces), "finish": "length", "pieces": pieces, "n": len(pieces),
            "logprobs": [t[0][1] for t in case["top"][:len(pieces)]]}


def test_greedy_comparison_tells_a_match_from_a_parting():
    case = fixture_case()
    # Split llama.cpp's text into as many pieces as it has tokens (the split does not
    # matter to the comparison, only the text and the count do).
    text, n = case["text"], len(case["tokens"])
    step = max(1, len(text) // n)
    pieces = [text[i * step:(i + 1) * step] for i in range(n - 1)] + [text[(n - 1) * step:]]
    same, detail = checks.compare_case(case, generation_of(case, pieces))
    assert same and detail is None
    assert checks.max_logprob_diff(case, generation_of(case, pieces)) == 0.0
    parted = copy.deepcopy(pieces)
    parted[5] = "\u2603" + parted[5]
    same, detail = checks.compare_case(case, generation_of(case, parted))
    assert not same and detail["step"] == 5 and detail["case"] == case["name"]
    # One token fewer, ending on a stop that the fixture did not mask, is a parting too.
    short = generation_of(case, pieces[:-1])
    short["finish"] = "stop"
    assert not checks.compare_case(case, short)[0]


def test_cuda_cells_cite_committed_results():
    cuda = render.cuda_cells()
    keys = {f.cuda_key for f in FILES if f.cuda_key}
    assert keys <= set(cuda), keys - set(cuda)
    for cells in cuda.values():
        for c in cells.values():
            assert os.path.exists(os.path.join(ROOT, c["source"]))
            assert c["status"] in ("pass", "fail")


def test_a_stop_where_llama_cpp_masked_the_end_token_counts_as_identical():
    path = os.path.join(ROOT, "tests", "fixtures", "smollm2", "greedy", "x86_64-avx512.json")
    case = next(c for c in json.load(open(path, encoding="utf-8"))["cases"] if c["name"] == "chat_capital")
    assert case["argmax_mismatch_steps"][0] == 7
    pieces = ["The", " capital", " of", " Japan", " is", " Tokyo", ".", "<|im_end|>"]
    got = {"text": "The capital of Japan is Tokyo.", "finish": "stop", "pieces": pieces, "n": 8}
    assert checks.compare_case(case, got) == (True, None)
    # Stopping one step early is not llama.cpp's generation.
    early = dict(got, pieces=pieces[:6] + ["<|im_end|>"], n=7, text="The capital of Japan is Tokyo")
    assert not checks.compare_case(case, early)[0]


def test_near_tie_margins_are_the_parity_tests():
    attn = open(os.path.join(ROOT, "crates", "models", "src", "attn.rs")).read()
    assert re.search(r"pub const MATMUL_DECODE_ABOVE: usize = %d;" % checks.MATMUL_DECODE_ABOVE, attn)
    parity = open(os.path.join(ROOT, "crates", "engine", "tests", "parity.rs")).read()
    assert re.search(r"const LOGPROB_TOL_MATMUL: f32 = %s;" % checks.TIE_MATMUL, parity)
    assert re.search(r"const LOGPROB_TOL_MATMUL_HYBRID: f32 = %s;" % checks.TIE_MATMUL_HYBRID, parity)
    long_case = {"prompt_ids": [0] * 300}
    assert checks.tie_at(long_case, 0, checks.TIE_REAL, "qwen2") == checks.TIE_REAL  # the prompt pass
    assert checks.tie_at(long_case, 5, checks.TIE_REAL, "qwen2") == checks.TIE_MATMUL
    assert checks.tie_at({"prompt_ids": [0] * 10}, 5, checks.TIE_REAL, "qwen2") == checks.TIE_REAL
    assert checks.tie_at(long_case, 5, checks.TIE_SYNTH, "qwen35moe") == checks.TIE_MATMUL_HYBRID
    # Served with --flash-decode (the Gemma 4 files), as the parity test's flash_decode.
    assert checks.tie_at(long_case, 5, checks.TIE_SYNTH, "gemma4", flash_decode=True) == checks.TIE_SYNTH
    assert re.search(r'fn flash_decode\(dir: &str\) -> bool \{\s*dir.starts_with\("gemma4"\)', parity)
    for mf in FILES:
        assert ("--flash-decode" in mf.serve_flags) == (mf.greedy_dir or "").startswith("gemma4"), mf.name
