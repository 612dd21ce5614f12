"""A short soak (bench/soak/soak.py): 16 clients for 45 s against its own SmolLM2
server, every API, streaming and not, tools, schemas, disconnects, cancellations and
malformed requests; then every greedy answer run again alone must be identical, and
the server must be back at its idle baseline with its SSD accounting matching the
files on disk. TEMPO9_SOAK_CLIENTS / TEMPO9_SOAK_SECONDS change the size."""

import os
import sys

from conftest import MODELS, SMOL, binary

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "bench", "soak"))
import soak  # noqa: E402


def test_short_soak():
    clients = int(os.environ.get("TEMPO9_SOAK_CLIENTS", "16"))
    seconds = float(os.environ.get("TEMPO9_SOAK_SECONDS", "45"))
    # A KV budget of 32 pages: long prompts from 16 clients do not all fit, so pages are
    # evicted, offloaded to the SSD tier and read back, and requests may be preempted.
    # The replay is capped at 90 s (a request alone takes seconds on a loaded 2-core
    # machine); the answers replayed within it must all be identical.
    r = soak.run(binary(), os.path.join(MODELS, SMOL), clients, seconds, seed=7, max_tokens=12,
                 kv_budget="48M", replay_limit_s=90, progress=lambda s: None)
    print(soak.summary(r))
    assert not r["failures"], soak.summary(r)
    kinds = r["by_kind"]
    greedy = sum(d.get("200", 0) for k, d in kinds.items()
                 if k.split("_")[0] in ("openai", "anthropic", "ollama"))
    assert greedy >= 8, kinds
    assert r["replayed"] == r["identical"] >= 4 and r["replayed"] + r["replay_skipped"] == greedy
    assert {"openai", "anthropic", "ollama"} <= {k.split("_")[0] for k in kinds}, kinds
    assert r["peak_pages_used"] > 0 and r["end_state"]["ram"]["used"] == 0
