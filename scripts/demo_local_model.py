"""Runs agents on a real small model on this CPU, behind llama.cpp's server, through the OpenAI-compatible and
the Anthropic adapters, and reports what happened: runs that succeeded with the right answer, turns, turns told
back for repair, latency per turn. Started by ``make demo-local-model`` (scripts/demo-local-model.sh).

* ``--model-size capable`` (the default): Qwen2.5-Coder-1.5B-Instruct, Q4_K_M, with the GGUF's own chat template
  (tools in the system turn, calls as ``<tool_call>``, which ``llama-server --jinja`` parses). Demos:
  ``word_stats`` (two tools, then the answer) and ``support`` (triage → domain event → resolver → two
  delegated kb_search runs → the reply).
* ``--model-size tiny``: SmolLM2-135M-Instruct with scripts/smollm2-tools.jinja; word_stats only.
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from agentfleet.config.settings import Settings
from agentfleet.models import AnthropicModel, OpenAIModel
from agentfleet.models.base import Model
from agentfleet.ops.progress import wait_for_end
from agentfleet.testing.local_model import MODELS, LlamaServer, ensure_model, server_binary
from agentfleet.workers.embedded import EmbeddedFleet

TEXTS = [
    "A fleet of agents, one step at a time.",
    "The quick brown fox jumps over the lazy dog",
    "Durable execution without a silent repeat of a side effect",
    "Small models make mistakes and correct them when told",
    "Planners executors and observers share nothing but events",
    "Every step is checkpointed before its side effects",
    "Health checks decide which tools may be dispatched",
    "A goal arrives as a message and leaves as a validated result",
    "Workers scale out across machines without any code change",
    "Tiny models need worked examples before they call tools",
]
TICKETS = [
    ("T-1", "I was charged twice for my invoice"),
    ("T-2", "I forgot my password and cannot log in"),
]
CONTEXT = 8192  # tokens per server slot: the demos' prompts are 1-2k; a larger window only costs memory
OUTPUT_CAP = 384  # tokens a turn may write: stops a runaway turn (a capped turn is told back as cut off)
TIMEOUT_S = 180.0  # per model call: a capped turn with a cold prompt took 52 s here (11 tokens/s out, 35 in)


# What made Qwen2.5-Coder-1.5B's turns usable on this llama-server build (measured, README "A real model"): the
# model writes its calls as bare JSON lines, which the server's own parser drops or leaves as text, so the adapter
# reads the calls from the text (text_tool_calls; "parse_tool_calls": false, sent before, is set back to true by the
# server whenever tools are offered, server-common.cpp); tool_choice "required" keeps it to calls; five newlines in
# a row end the turn (it separates calls with three, then would write newlines up to the output cap: 16 s of a turn
# at ~23 tokens/s); after its calls it may run on with a fenced copy of its answer or a <tool_response> of its own
# (measured through /v1/messages): those end the turn too (calls read up to there stand; text_tool_calls).
# /v1/messages reads Anthropic's names only (stop_sequences, tool_choice {"type": "any"}) and drops every other
# field of the body (server_chat_convert_anthropic_to_oai), so each adapter says them its own way.
STOP = ["\n\n\n\n\n", "\n\n\n```", "<tool_response>"]
SERVER_OPTIONS: dict[str, Any] = {"stop": STOP}
ANTHROPIC_SERVER_OPTIONS: dict[str, Any] = {"stop_sequences": STOP}


def models(port_base: str, name: str) -> list[tuple[str, Model]]:
    return [
        ("openai-compatible", OpenAIModel(name, base_url=f"{port_base}/v1", api_key_env=None, temperature=0,
                                          timeout_s=TIMEOUT_S,
                                          max_output_tokens=OUTPUT_CAP, context_window=CONTEXT,
                                          tool_choice="required", llama_server_tokenizer=True,
                                          text_tool_calls=True, extra_body=SERVER_OPTIONS)),
        ("anthropic-compatible", AnthropicModel(name, base_url=port_base, api_key_env=None, temperature=0,
                                                timeout_s=TIMEOUT_S,
                                                max_output_tokens=OUTPUT_CAP, context_window=CONTEXT,
                                                tool_choice="required", exact_counts=True, text_tool_calls=True,
                                                extra_body=ANTHROPIC_SERVER_OPTIONS, user_text_apart=True)),
    ]


def _plans(store: Any, run_id: str) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    steps = store.steps(run_id)
    return [s for s in steps if s["kind"] == "plan" and s["status"] == "succeeded"], steps


def word_stats(model: Model, runs: int, workdir: Path) -> dict[str, Any]:
    settings = Settings(profile="embedded", agents="agentfleet.examples.word_stats", workspace=workdir,
                        embedded_database_url=f"sqlite:///{workdir}/fleet.db", model_retry_attempts=2)
    outcomes: list[dict[str, Any]] = []
    with EmbeddedFleet(settings) as fleet:
        fleet.use_model("word_stats", model)
        for i in range(runs):
            text = TEXTS[i % len(TEXTS)]
            started = time.monotonic()
            run_id = fleet.submit({"agent": "word_stats", "input": {"text": text}})
            run = wait_for_end(fleet.store, run_id, timeout_s=600)
            plans, steps = _plans(fleet.store, run_id)
            result = (run.result if run else None) or {}
            right = result.get("output") == {"words": len(text.split()),
                                             "longest": max((w.strip(".,") for w in text.split()), key=len)}
            got = {"status": result.get("status"), "right": right, "turns": len(plans),
                   "repairs": sum(1 for s in plans if (s["output"] or {}).get("repair")),
                   "calls_run": sum(1 for s in steps if s["kind"] == "tool"),
                   "turn_ms": [s["duration_ms"] for s in plans], "run_s": round(time.monotonic() - started, 1),
                   "prompt_tokens": [_counted(s) for s in plans]}
            outcomes.append(got)
            print(f"  run {i + 1}: {result.get('status')} {result.get('error_code') or ''} right={right} "
                  f"turns={got['turns']} told back={got['repairs']} tools run={got['calls_run']} "
                  f"{got['run_s']} s output={json.dumps(result.get('output'))}", flush=True)
    return _summary(outcomes)


def support(model: Model, workdir: Path) -> dict[str, Any]:
    """Each ticket: triage's run, the resolver its event started, and the resolver's kb_search children."""
    settings = Settings(profile="embedded", agents="agentfleet.examples.support", workspace=workdir,
                        embedded_database_url=f"sqlite:///{workdir}/fleet.db", model_retry_attempts=2)
    outcomes: list[dict[str, Any]] = []
    with EmbeddedFleet(settings) as fleet:
        for agent in ("triage", "resolver", "kb_search"):
            fleet.use_model(agent, model)
        for ticket_id, text in TICKETS:
            started = time.monotonic()
            triage_id = fleet.submit({"agent": "triage", "input": {"ticket_id": ticket_id, "text": text}})
            triaged = wait_for_end(fleet.store, triage_id, timeout_s=600)
            resolver = _resolver_of(fleet, triage_id, timeout_s=600)
            tree = [triaged, resolver, *(fleet.store.children(resolver.run_id) if resolver else [])]
            ended = [r for r in tree if r is not None]
            turns = [p for r in ended for p in _plans(fleet.store, r.run_id)[0]]
            ok = len(ended) == 4 and all((r.result or {}).get("status") == "succeeded" for r in ended)
            reply = ((resolver.result or {}).get("output") or {}) if resolver else {}
            outcomes.append({"status": "succeeded" if ok else "failed", "right": ok and bool(reply.get("reply")),
                             "turns": len(turns), "repairs": sum(1 for s in turns if (s["output"] or {}).get("repair")),
                             "calls_run": 0, "turn_ms": [s["duration_ms"] for s in turns],
                             "run_s": round(time.monotonic() - started, 1),
                             "prompt_tokens": [_counted(s) for s in turns]})
            print(f"  {ticket_id}: tree of {len(ended)} run(s): "
                  + ", ".join(f"{r.agent} {(r.result or {}).get('status')} {(r.result or {}).get('error_code') or ''}"
                              for r in ended)
                  + f"; {outcomes[-1]['run_s']} s; reply={json.dumps(reply)[:300]}", flush=True)
    return _summary(outcomes)


def _resolver_of(fleet: EmbeddedFleet, triage_id: str, timeout_s: float) -> Any:
    """The resolver run the triage run's event started (found by the trace they share), once it has ended."""
    deadline = time.monotonic() + timeout_s
    trace = fleet.store.get_run(triage_id).trace_id  # type: ignore[union-attr]
    while time.monotonic() < deadline:
        found = [r for r in fleet.store.runs_in_trace(trace) if r.agent == "resolver"]
        if found:
            return wait_for_end(fleet.store, found[0].run_id, timeout_s=max(1.0, deadline - time.monotonic()))
        time.sleep(0.5)
    return None


def _counted(step: dict[str, Any]) -> tuple[int | None, int | None]:
    """(the heuristic's count, llama-server's exact count) of the prompt a plan step sent."""
    context = (step["output"] or {}).get("context") or {}
    return context.get("total"), context.get("exact")


def _summary(outcomes: list[dict[str, Any]]) -> dict[str, Any]:
    latencies = [ms for o in outcomes for ms in o["turn_ms"]]
    pairs = [(h, x) for o in outcomes for h, x in o["prompt_tokens"] if h and x]
    counted = [x for _, x in pairs]
    over = sorted(h / x for h, x in pairs)  # the heuristic's count over the exact one: >= 1 is the safe side
    return {"runs": len(outcomes), "succeeded": sum(o["status"] == "succeeded" for o in outcomes),
            "right_answers": sum(o["right"] for o in outcomes), "turns": sum(o["turns"] for o in outcomes),
            "turns_told_back_for_repair": sum(o["repairs"] for o in outcomes),
            "median_turn_ms": round(statistics.median(latencies), 1) if latencies else None,
            "p90_turn_ms": round(statistics.quantiles(latencies, n=10)[-1], 1) if len(latencies) > 1 else None,
            "median_run_s": statistics.median(o["run_s"] for o in outcomes) if outcomes else None,
            "median_prompt_tokens": statistics.median(counted) if counted else None,
            "heuristic_over_exact": {"min": round(over[0], 3), "median": round(statistics.median(over), 3),
                                     "max": round(over[-1], 3), "prompts": len(over)} if over else None}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--demo-python", default=None, help="the venv that built llama-server")
    parser.add_argument("--model-size", choices=sorted(MODELS), default="capable")
    parser.add_argument("--runs", type=int, default=10, help="word_stats runs per adapter")
    parser.add_argument("--demos", default=None, help="comma-separated: word_stats,support")
    parser.add_argument("--adapters", default="openai-compatible,anthropic-compatible")
    parser.add_argument("--report", type=Path, default=None, help="also write the figures here as JSON")
    args = parser.parse_args()
    spec = MODELS[args.model_size]
    demos = (args.demos or ("word_stats,support" if spec.key == "capable" else "word_stats")).split(",")
    gguf = ensure_model(spec)
    print(spec.licence)
    with tempfile.TemporaryDirectory(prefix="agentfleet-demo-") as tmp:
        work = Path(tmp)
        with LlamaServer(server_binary(args.demo_python), spec, gguf, context=CONTEXT,
                         log_path=work / "llama-server.log") as server:
            print(f"llama-server ready in {server.ready_s:.1f} s on {server.base} ({gguf.name})", flush=True)
            report: dict[str, Any] = {}
            for label, model in models(server.base, spec.filename.removesuffix(".gguf")):
                if label not in args.adapters.split(","):
                    continue
                for demo in demos:
                    (work / label / demo).mkdir(parents=True)
                    print(f"{label}: {demo}", flush=True)
                    if demo == "word_stats":
                        report[f"{label}/{demo}"] = word_stats(model, args.runs, work / label / demo)
                    elif demo == "support":
                        report[f"{label}/{demo}"] = support(model, work / label / demo)
                    else:
                        raise SystemExit(f"unknown demo {demo!r}")
            print(json.dumps(report, indent=2))
            if args.report:
                args.report.write_text(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
