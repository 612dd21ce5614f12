"""`tempo9 check-device` and scripts/gpu/greedy-compare.py on the CPU, where every
run of a prompt (alone or batched) must be bit-identical: the parity report, its
chat prompts and its dump are what the GPU runs rely on."""

import json
import os
import subprocess

from conftest import MODELS, SMOL, binary

REPO = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))


def test_check_device_on_the_cpu_reports_identical_streams(tmp_path):
    dump = tmp_path / "dump.json"
    out = subprocess.run(
        [binary(), "check-device", "--gguf", os.path.join(MODELS, SMOL), "--device", "cpu",
         "--chat", "--prompts", "3", "--tokens", "8", "--dump", str(dump)],
        capture_output=True, text=True, timeout=300, check=True).stdout
    report = json.loads(out)
    assert report["prompt_kind"] == "chat"
    for pair in ("device_alone_vs_cpu_alone", "device_batched_vs_device_alone"):
        assert report[pair]["identical"] == 3, report[pair]
        assert report[pair]["max_top1_logprob_diff_common_prefix"] == 0.0

    d = json.loads(dump.read_text())
    # Three different questions through one chat template: same opening, different text.
    assert len(d["prompts"]) == 3 and len({tuple(p) for p in d["prompts"]}) == 3
    assert len({p[0] for p in d["prompts"]}) == 1
    for gen in d["tempo9_cpu_alone"]:
        assert len(gen["tokens"]) == 8 and len(gen["top"]) == 8
        for tok, top in zip(gen["tokens"], gen["top"]):
            assert top[0][0] == tok and top[0][1] >= top[1][1]

    rows = subprocess.run(
        ["python3", os.path.join(REPO, "scripts/gpu/greedy-compare.py"), "compare", str(dump)],
        capture_output=True, text=True, timeout=60, check=True).stdout.splitlines()
    rows = [json.loads(r) for r in rows]
    assert len(rows) == 3  # three Tempo9 runs, pairwise
    assert all(r["identical"] == 3 and r["first_diff_median"] is None for r in rows)
    prompts = subprocess.run(
        ["python3", os.path.join(REPO, "scripts/gpu/greedy-compare.py"), "prompts", str(dump)],
        capture_output=True, text=True, timeout=60, check=True).stdout.splitlines()
    assert [list(map(int, p.split())) for p in prompts] == d["prompts"]
