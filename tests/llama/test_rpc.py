"""The target over llama.cpp's RPC backend: real ggml-rpc-servers on loopback ports, the tiny models.

These tests need a llama-cpp-python built with -DGGML_RPC=on (scripts/setup.sh) and build the
matching ggml-rpc-server if it is missing (benchmarks/build_llama_cpp_tools.sh --rpc): without RPC
support they fail, they never skip.
"""

import ctypes
import json
import os
import re
import resource
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path

import pytest
import tiny_models as tm
from one_line import assert_one_line_error
from serving import serving

import specllm
from specllm.engine.calibration import model_key
from specllm.errors import SpecllmError
from specllm.llama import log as llama_log
from specllm.llama import rpc

ROOT = Path(__file__).resolve().parents[2]
SPECLLM = [sys.executable, "-m", "specllm"]
PROMPTS = ["def f(x): return", "the cat is in the house and the cat is in the", "Hello world"]


@pytest.fixture(scope="session")
def rpc_server_binary() -> Path:
    assert rpc.rpc_supported(), rpc.NO_RPC_HINT  # a failure, not a skip
    out = subprocess.run(
        ["bash", str(ROOT / "benchmarks/build_llama_cpp_tools.sh"), "--rpc"],
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHON": sys.executable},
    )
    assert out.returncode == 0, out.stderr[-3000:]
    binary = Path(out.stdout.strip().splitlines()[-1]) / "ggml-rpc-server"
    assert binary.is_file(), binary
    return binary


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_server(binary: Path, log: Path) -> tuple[subprocess.Popen, str]:
    port = free_port()
    proc = subprocess.Popen(
        [str(binary), "--host", "127.0.0.1", "--port", str(port), "--threads", "1"],
        stdout=log.open("w"),
        stderr=subprocess.STDOUT,
    )
    address = f"127.0.0.1:{port}"
    deadline = time.monotonic() + 30
    while True:
        try:
            rpc.probe_rpc_server(address, timeout=2)
            return proc, address
        except SpecllmError:
            assert proc.poll() is None and time.monotonic() < deadline, log.read_text()
            time.sleep(0.1)


@pytest.fixture(scope="module")
def servers(rpc_server_binary, tmp_path_factory):
    """Two ggml-rpc-servers on loopback ports."""
    logs = tmp_path_factory.mktemp("rpc-logs")
    started = [start_server(rpc_server_binary, logs / f"server{i}.log") for i in range(2)]
    yield [address for _, address in started]
    for proc, _ in started:
        proc.terminate()
        proc.wait(timeout=10)


def greedy_tokens(engine, prompt, drafter, gamma=4, max_tokens=32):
    return engine.generate(prompt, max_tokens=max_tokens, temperature=0, drafter=drafter, gamma=gamma).tokens


@pytest.fixture(scope="module")
def local_outputs(tiny_models):
    engine = specllm.load(str(tiny_models.target), n_ctx=512, n_threads=1)
    try:
        return [greedy_tokens(engine, p, "none") for p in PROMPTS]
    finally:
        engine.close()


def test_target_only_over_two_servers_equals_local(tiny_models, servers, local_outputs, capfd):
    llama_log.set_verbose(True)  # llama.cpp's own log says where the weights went
    try:
        engine = specllm.load(str(tiny_models.target), n_ctx=512, n_threads=1, rpc=servers)
    finally:
        llama_log.set_verbose(False)
    log = capfd.readouterr().err
    for address in servers:  # the layers are split over both servers
        size = re.search(rf"RPC\d+\[{re.escape(address)}\] model buffer size = +([\d.]+) MiB", log)
        assert size and float(size.group(1)) > 0, log[-3000:]
    try:
        assert [greedy_tokens(engine, p, "none") for p in PROMPTS] == local_outputs
    finally:
        engine.close()


@pytest.mark.parametrize("drafter", ["model", "ngram", "auto"])
def test_speculative_with_the_target_over_rpc_equals_local_target_only(tiny_models, servers, local_outputs, drafter):
    engine = specllm.load(str(tiny_models.target), str(tiny_models.draft), n_ctx=512, n_threads=1, rpc=servers)
    try:
        outputs = [greedy_tokens(engine, p, drafter) for p in PROMPTS]
        stats = engine.generate(PROMPTS[0], max_tokens=32, temperature=0, drafter=drafter, gamma=4).stats
    finally:
        engine.close()
    assert outputs == local_outputs
    if drafter == "model":
        assert stats.n_drafted > 0 and stats.n_accepted > 0  # it did speculate


@pytest.mark.parametrize("drafter", ["model", "mtp", "auto"])
def test_a_hybrid_target_with_mtp_layers_over_rpc_equals_local_target_only(servers, tmp_path_factory, drafter):
    """A Qwen3.5 target (recurrent state and snapshots on the servers) with its MTP layers, and a
    hybrid draft on the servers too."""
    folder = tmp_path_factory.mktemp("hybrid-rpc")
    target = tm.write_model(folder / "q35.gguf", arch="qwen35", n_nextn=1, mtp_mimic=True)
    draft = tm.write_model(folder / "q35-draft.gguf", arch="qwen35", n_nextn=1, mtp_mimic=True, noise=0.02)
    local = specllm.load(str(target), n_ctx=512, n_threads=1)
    try:
        expected = [greedy_tokens(local, p, "none") for p in PROMPTS]
    finally:
        local.close()
    engine = specllm.load(str(target), str(draft), n_ctx=512, n_threads=1, rpc=servers[:1], draft_rpc=servers[1:])
    try:
        assert [greedy_tokens(engine, p, drafter) for p in PROMPTS] == expected
        stats = engine.generate(PROMPTS[0], max_tokens=32, temperature=0, drafter=drafter, gamma=4).stats
    finally:
        engine.close()
    if drafter != "auto":
        assert stats.n_drafted > 0 and stats.n_accepted > 0


@pytest.mark.parametrize("draft_server", [1, 0])  # another server, or the target's (one connection serves both)
def test_the_draft_can_go_over_rpc_too(tiny_models, servers, local_outputs, draft_server):
    engine = specllm.load(
        str(tiny_models.target),
        str(tiny_models.draft),
        n_ctx=512,
        n_threads=1,
        rpc=servers[:1],
        draft_rpc=servers[draft_server : draft_server + 1],
    )
    try:
        assert [greedy_tokens(engine, p, "model") for p in PROMPTS] == local_outputs
    finally:
        engine.close()


def test_one_server_under_two_names_is_one_server(tiny_models, servers, local_outputs):
    """127.0.0.1:PORT and localhost:PORT: llama.cpp would open a second connection, which the
    server (one client at a time) never answers: the load waited forever."""
    alias = servers[0].replace("127.0.0.1", "localhost")
    proc = subprocess.run(  # in a process of its own: a hang inside llama.cpp cannot be interrupted
        SPECLLM
        + ["run", PROMPTS[0], "--raw", "--target", str(tiny_models.target), "--draft", "none"]
        + ["--rpc", f"{servers[0]},{alias}", "--threads", "1", "--ctx-size", "512", "--temperature", "0"]
        + ["-n", "32", "--json"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["tokens"] == local_outputs[0]
    engine = specllm.load(  # the draft on the target's server under another name (it timed out)
        str(tiny_models.target), str(tiny_models.draft), n_ctx=512, n_threads=1, rpc=servers[:1], draft_rpc=[alias]
    )
    try:
        assert greedy_tokens(engine, PROMPTS[0], "model") == local_outputs[0]
    finally:
        engine.close()


def test_the_cli_runs_the_target_over_rpc(tiny_models, servers, local_outputs):
    proc = subprocess.run(
        SPECLLM
        + [
            "run",
            PROMPTS[0],
            "--raw",
            "--target",
            str(tiny_models.target),
            "--draft",
            str(tiny_models.draft),
            "--rpc",
            ",".join(servers),
            "--threads",
            "1",
            "--ctx-size",
            "512",
            "--temperature",
            "0",
            "-n",
            "32",
            "--drafter",
            "model",
            "--json",
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["tokens"] == local_outputs[0]


def test_serve_runs_the_target_over_rpc(tiny_models, servers, local_outputs):
    """`serve --rpc`: the server's greedy completion equals the local target's."""
    args = [
        "serve",
        "--target",
        tiny_models.target,
        "--draft",
        "none",
        "--rpc",
        ",".join(servers),
        "--threads",
        1,
        "--ctx-size",
        512,
        "--port",
        0,
    ]
    with serving(args) as (_, _, url):
        body = json.dumps({"prompt": PROMPTS[0], "max_tokens": 32, "temperature": 0}).encode()
        request = urllib.request.Request(url + "/v1/completions", body, {"Content-Type": "application/json"})
        with urllib.request.urlopen(request, timeout=120) as response:
            reply = json.loads(response.read())
        engine = specllm.load(str(tiny_models.target), n_ctx=512, n_threads=1)
        try:
            local = engine.generate(PROMPTS[0], max_tokens=32, temperature=0.0, drafter="none")
        finally:
            engine.close()
        assert local.tokens == local_outputs[0][:32]  # the same greedy run as the other tests' reference
        assert reply["choices"][0]["text"] == local.text and reply["usage"]["completion_tokens"] == 32


def test_doctor_says_rpc_is_supported_and_what_each_server_offers(servers):
    proc = subprocess.run(SPECLLM + ["doctor", "--rpc", ",".join(servers)], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert "rpc: supported" in proc.stdout
    for address in servers:
        assert re.search(
            rf"rpc server {re.escape(address)}: answers · RPC\d+ \d+ MiB free of [1-9]\d* MiB", proc.stdout
        ), proc.stdout


def test_doctor_json_lists_each_servers_memory(servers):
    proc = subprocess.run(
        SPECLLM + ["doctor", "--json", "--rpc", ",".join(servers)], capture_output=True, text=True, timeout=60
    )
    assert proc.returncode == 0, proc.stderr
    info = json.loads(proc.stdout)
    assert info["rpc"] == "supported" and sorted(info["rpc_servers"]) == sorted(servers)
    for devices in info["rpc_servers"].values():
        assert devices and all(d["total"] > 0 and 0 <= d["free"] <= d["total"] for d in devices)


def test_the_calibration_cache_tells_remote_costs_apart():
    local = specllm.ModelOptions(n_threads=1)
    remote = specllm.ModelOptions(n_threads=1, rpc=("10.0.0.1:50052",))
    other = specllm.ModelOptions(n_threads=1, rpc="10.0.0.2:50052")
    keys = {model_key(__file__, o) for o in (local, remote, other)}
    assert len(keys) == 3
    assert "rpc=10.0.0.1:50052" in model_key(__file__, remote)


# --- errors: one line each, never a hang ---------------------------------------------------------


def run_with_rpc(target, rpc, *more):
    return subprocess.run(
        SPECLLM + ["run", "hi", "--target", str(target), "--rpc", rpc, "-n", "4", "--no-live", *more],
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_a_dead_server_is_one_line(tiny_models, rpc_server_binary):
    dead = f"127.0.0.1:{free_port()}"  # nothing listens there
    assert_one_line_error(run_with_rpc(tiny_models.target, dead), f"RPC server {dead} does not answer", exit_code=1)
    with pytest.raises(SpecllmError, match="does not answer"):
        specllm.load(str(tiny_models.target), rpc=[dead])


def test_a_server_that_accepts_but_never_answers_is_an_error_in_bounded_time():
    with socket.socket() as silent:  # a listening socket nobody serves: an rpc-server busy with another client
        silent.bind(("127.0.0.1", 0))
        silent.listen()
        address = f"127.0.0.1:{silent.getsockname()[1]}"
        start = time.monotonic()
        with pytest.raises(SpecllmError, match="did not answer within 0.5 s .*serves one client at a time"):
            rpc.probe_rpc_server(address, timeout=0.5)
        assert time.monotonic() - start < 30  # bounded (not a timing measurement: a hang would never end)


def test_something_else_than_an_rpc_server_is_refused_before_llama_cpp_sees_it():
    with socket.socket() as other:  # a server of another protocol: it answers, but not the greeting
        other.bind(("127.0.0.1", 0))
        other.listen()
        address = f"127.0.0.1:{other.getsockname()[1]}"

        def answer_and_close():
            client, _ = other.accept()
            client.recv(64)
            client.sendall(b"HTTP/1.0 400 Bad Request\r\n\r\n")
            client.close()

        thread = threading.Thread(target=answer_and_close)
        thread.start()
        with pytest.raises(SpecllmError, match="does not answer as a llama.cpp ggml-rpc-server of protocol 7"):
            rpc.probe_rpc_server(address, timeout=5)
        thread.join()


def test_a_busy_server_is_one_line_not_a_hang(tiny_models, servers):
    engine = specllm.load(str(tiny_models.target), n_ctx=256, n_threads=1, rpc=servers[:1])  # holds the server
    try:
        proc = run_with_rpc(tiny_models.target, servers[0])
    finally:
        engine.close()
    assert_one_line_error(proc, f"RPC server {servers[0]} did not answer within 5 s", exit_code=1)


def test_a_busy_server_lives_on_after_a_greeting_it_could_not_answer(tiny_models, rpc_server_binary, tmp_path):
    """The greeting that timed out is still in the busy server's queue: once free, it must not die
    answering it on a connection that is gone."""
    proc, address = start_server(rpc_server_binary, tmp_path / "server.log")
    try:
        engine = specllm.load(str(tiny_models.target), n_ctx=256, n_threads=1, rpc=[address])  # holds the server
        try:
            with pytest.raises(SpecllmError, match="did not answer within 0.5 s"):
                rpc.probe_rpc_server(address, timeout=0.5)
        finally:
            engine.close()
        assert rpc.probe_rpc_server(address, timeout=5)[0] == rpc.RPC_PROTO_MAJOR, (tmp_path / "server.log").read_text()
        assert proc.poll() is None
    finally:
        proc.terminate()
        proc.wait(timeout=10)


def test_a_server_gone_in_the_middle_of_a_generation_is_llama_cpps_abort_line(tiny_models, rpc_server_binary, tmp_path):
    """llama.cpp's RPC client has no recovery: the process ends with its abort message (as
    docs/rpc.md says), not followed by the gdb backtrace of every thread (unless -v)."""
    server, address = start_server(rpc_server_binary, tmp_path / "server.log")
    try:
        args = ["run", PROMPTS[1], "--raw", "--target", str(tiny_models.target), "--draft", "none", "--rpc", address]
        args += ["--threads", "1", "--ctx-size", "4096", "-n", "4000", "--no-live", "--temperature", "0"]
        proc = subprocess.Popen(SPECLLM + args, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        assert proc.stdout is not None and proc.stdout.read(1)  # it is generating
        server.kill()
        _, stderr = proc.communicate(timeout=120)
    finally:
        server.kill()
        server.wait(timeout=10)
    assert proc.returncode != 0
    lines = stderr.decode(errors="replace").strip().splitlines()
    assert "Remote RPC server crashed" in lines[0] and len(lines) == 1, lines[:20]


def test_a_chat_whose_server_is_gone_saves_the_conversation_before_llama_cpp_ends_it(
    tiny_models, rpc_server_binary, tmp_path
):
    """llama.cpp aborts the process at the next call on a server that died: the chat cannot go
    on, but what was said is written where --resume takes it up (it was lost)."""
    server, address = start_server(rpc_server_binary, tmp_path / "server.log")
    args = ["chat", "--target", str(tiny_models.target), "--draft", "none", "--rpc", address]
    args += ["--threads", "1", "-n", "8", "--temperature", "0"]
    env = {**os.environ, "XDG_STATE_HOME": str(tmp_path / "state")}
    chat = subprocess.Popen(
        SPECLLM + args, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env
    )
    assert chat.stdin is not None and chat.stderr is not None
    try:
        chat.stdin.write(b"hello\n")
        chat.stdin.flush()
        assert b"tok/s" in chat.stderr.readline()  # the reply's summary: the turn is over
        server.kill()
        server.wait(timeout=10)
        _, stderr = chat.communicate(b"again\n", timeout=120)
    finally:
        server.kill()
        chat.kill()
    lines = stderr.decode(errors="replace").strip().splitlines()
    assert chat.returncode != 0 and "Remote RPC server crashed" in lines[0], lines
    saved = list((tmp_path / "state" / "specllm").glob("chat-*.json"))
    assert len(saved) == 1 and lines[1:] == [f"specllm: the conversation is saved: specllm chat --resume {saved[0]}"]
    transcript = json.loads(saved[0].read_text())
    # the message the server died under too, cut short before its reply began
    assert [t["user"] for t in transcript["turns"]] == ["hello", "again"]
    assert (transcript["turns"][1]["stop_reason"], transcript["turns"][1]["reply"]) == ("interrupted", "")


@pytest.mark.parametrize(
    "address",
    ["127.0.0.1", "127.0.0.1:", ":50052", "host:0", "host:65536", "host:port", "a:b:1", "fe80::1:50052", "h st:1"],
)
def test_a_malformed_address_is_one_line_before_anything_is_loaded(tmp_path, address):
    proc = run_with_rpc(tmp_path / "missing.gguf", address)  # the address is refused before the file is looked at
    assert_one_line_error(proc, "malformed RPC server address", "expected HOST:PORT", exit_code=1)
    with pytest.raises(SpecllmError, match="malformed RPC server address"):
        specllm.ModelOptions(rpc=[address])


@pytest.mark.parametrize("address", ["[::1]:50052", "fe80::1:50052", "[::1]", "2001:db8::1"])
def test_an_ipv6_address_is_refused_saying_why(tmp_path, address):
    """llama.cpp splits HOST:PORT at the first colon and resolves hosts to IPv4: an IPv6 address is
    not malformed to the user, it is one llama.cpp cannot reach."""
    proc = run_with_rpc(tmp_path / "missing.gguf", f"127.0.0.1:50052,{address}")
    assert_one_line_error(proc, f"malformed RPC server address '{address}'", "does not connect over IPv6", exit_code=1)
    assert "IPv6" not in str(pytest.raises(SpecllmError, specllm.ModelOptions, rpc=["a:b:1"]).value)


@pytest.mark.parametrize("servers", [50052, b"127.0.0.1:50052", 1.5])
def test_servers_of_a_wrong_type_are_one_line(servers):
    with pytest.raises(SpecllmError, match="RPC servers are given as 'HOST:PORT,...' or a list of them"):
        specllm.ModelOptions(rpc=servers)


def test_a_build_without_rpc_says_how_to_get_one():
    # llama_cpp's ggml-base library: a real ggml library without the backend registry that the RPC
    # backend is found through (as in a build without it: the registry has no "RPC" entry).
    from llama_cpp import _ggml

    base = next(Path(_ggml.libggml_base_path).glob("libggml-base.*"))
    with pytest.raises(SpecllmError) as error:
        rpc.rpc_add_server_function(ctypes.CDLL(str(base)))
    message = str(error.value)
    assert "no RPC backend" in message and 'CMAKE_ARGS="-DGGML_RPC=on"' in message and "--no-cache-dir" in message
    assert "\n" not in message
    assert rpc.rpc_add_server_function()  # the installed build has one


def test_a_server_out_of_memory_is_one_line(tiny_models, rpc_server_binary, tmp_path):
    proc, address = start_server(rpc_server_binary, tmp_path / "server.log")
    try:
        vm_kib = int(re.search(r"VmSize:\s+(\d+) kB", Path(f"/proc/{proc.pid}/status").read_text()).group(1))
        limit = (vm_kib + 64) * 1024  # no room for the tiny model's weights (~0.6 MB)
        resource.prlimit(proc.pid, resource.RLIMIT_AS, (limit, limit))
        result = run_with_rpc(tiny_models.target, address)
        assert_one_line_error(result, f"cannot load {tiny_models.target} over RPC ({address})", exit_code=1)
        assert proc.poll() is None  # the server itself lives on
    finally:
        proc.terminate()
        proc.wait(timeout=10)
