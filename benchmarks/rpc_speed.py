"""Target-only against speculative decoding with the target over llama.cpp's RPC backend.

    python benchmarks/rpc_speed.py [--delay-ms 2] [-n 128] [--prompts 6] [--rounds 1] [--json FILE]

The default pair (cached, or pulled), its target on one ggml-rpc-server on this machine (built by
benchmarks/build_llama_cpp_tools.sh --rpc from the installed llama-cpp-python's llama.cpp), the
draft local. Two network conditions:

- loopback: the server on 127.0.0.1, nothing in between;
- +D ms: every round trip to the server D ms longer. First choice: the server in a network
  namespace behind a veth pair with `tc qdisc add dev VETH root netem delay D ms` (needs root and
  the kernel's netem qdisc). When the kernel refuses, the exact error is printed and a delaying TCP
  relay stands in: a Python process between specllm and the loopback server that holds every chunk
  of bytes D/2 ms in each direction (pure latency, no bandwidth limit). The relay costs time of its
  own (a Python process handing every chunk over, on the same cores), so it is measured with no
  delay too ("relay +0 ms"): compare the delayed condition with that one.

In each condition, per prompt, target-only (`--drafter none`) and each speculative configuration
run one after the other (greedy, same tokens), so machine noise hits them alike. Reported: decode
tokens/s, each configuration's speed as a ratio of target-only (the median of per-prompt ratios),
and the target calls per generated token. Both processes run with OMP_WAIT_POLICY=passive (unless
set otherwise): they share this machine's cores.
"""

import argparse
import heapq
import itertools
import json
import os
import selectors
import socket
import subprocess
import sys
import time
from contextlib import ExitStack, contextmanager
from pathlib import Path
from statistics import median

# specllm and the server share this machine's cores: OpenMP threads that spin while waiting (its
# default) starve the other process, and a target call took ~3 s instead of ~70 ms here. Set before
# llama.cpp is loaded; the server inherits it.
os.environ.setdefault("OMP_WAIT_POLICY", "passive")

import specllm  # noqa: E402
from specllm.bench import runner as bench
from specllm.models import hub  # noqa: E402

HERE = Path(__file__).resolve().parent
NETNS, VETH_HOST, VETH_NS = "specllm-rpc", "spr-h", "spr-n"
HOST_IP, NS_IP = "10.231.7.1", "10.231.7.2"


def server_binary() -> Path:
    out = subprocess.run(
        ["bash", str(HERE / "build_llama_cpp_tools.sh"), "--rpc"],
        check=True,
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHON": sys.executable},
    )
    return Path(out.stdout.strip().splitlines()[-1]) / "ggml-rpc-server"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_until_it_answers(proc: subprocess.Popen, address: str, failure: str) -> None:
    """Until the RPC server (or relay) `proc` started answers llama.cpp's greeting at `address`;
    SystemExit(failure) if it exits or 30 s pass first."""
    deadline = time.monotonic() + 30
    while True:
        try:
            specllm.llama.rpc.probe_rpc_server(address, timeout=2)
            return
        except specllm.SpecllmError:
            if proc.poll() is not None or time.monotonic() > deadline:
                raise SystemExit(failure) from None
            time.sleep(0.1)


@contextmanager
def rpc_server(binary: Path, host: str, port: int, threads: int, netns: str | None = None):
    prefix = ["ip", "netns", "exec", netns] if netns else []
    proc = subprocess.Popen(
        [*prefix, str(binary), "-H", host, "-p", str(port), "-t", str(threads)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    address = f"{host}:{port}"
    try:
        wait_until_it_answers(proc, address, f"ggml-rpc-server did not start at {address}")
        yield address
    finally:
        proc.terminate()
        proc.wait(timeout=10)


def sh(*args: str) -> None:
    out = subprocess.run(args, capture_output=True, text=True)
    if out.returncode:
        raise RuntimeError(f"`{' '.join(args)}` failed: {out.stderr.strip()}")


@contextmanager
def netns_with_delay(delay_ms: float):
    """A network namespace joined to this one by a veth pair whose host side delays every packet
    by delay_ms (netem): the round trip to NS_IP is delay_ms longer."""
    subprocess.run(["ip", "netns", "del", NETNS], capture_output=True)  # left over by a killed run
    subprocess.run(["ip", "link", "del", VETH_HOST], capture_output=True)
    try:
        sh("ip", "netns", "add", NETNS)
        sh("ip", "link", "add", VETH_HOST, "type", "veth", "peer", "name", VETH_NS, "netns", NETNS)
        sh("ip", "addr", "add", f"{HOST_IP}/24", "dev", VETH_HOST)
        sh("ip", "link", "set", VETH_HOST, "up")
        sh("ip", "-n", NETNS, "addr", "add", f"{NS_IP}/24", "dev", VETH_NS)
        sh("ip", "-n", NETNS, "link", "set", VETH_NS, "up")
        sh("ip", "-n", NETNS, "link", "set", "lo", "up")
        sh("tc", "qdisc", "add", "dev", VETH_HOST, "root", "netem", "delay", f"{delay_ms}ms")
        yield NETNS
    finally:
        subprocess.run(["ip", "link", "del", VETH_HOST], capture_output=True)
        subprocess.run(["ip", "netns", "del", NETNS], capture_output=True)


def relay_main(listen_port: int, upstream: str, one_way: float) -> None:
    """A TCP relay 127.0.0.1:listen_port -> upstream that holds every chunk of bytes `one_way`
    seconds in each direction (pure latency: chunks in flight overlap). One thread and one
    selector, so a hop costs no thread hand-over (a relay of threads added ~50 ms per target call
    on 2 busy cores); a process of its own, so the benchmark's Python does not hold it up."""
    listener = socket.create_server(("127.0.0.1", listen_port))
    host, port = upstream.rsplit(":", 1)
    selector = selectors.DefaultSelector()
    selector.register(listener, selectors.EVENT_READ)
    peer: dict[socket.socket, socket.socket] = {}
    held: list = []  # heap of (due, order, destination, bytes)
    order = itertools.count()
    while True:
        timeout = max(0.0, held[0][0] - time.monotonic()) if held else None
        for key, _ in selector.select(timeout):
            sock = key.fileobj
            if sock is listener:
                client, _ = listener.accept()
                server = socket.create_connection((host, int(port)))
                for s in (client, server):
                    s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                    selector.register(s, selectors.EVENT_READ)
                peer[client], peer[server] = server, client
                continue
            data = sock.recv(1 << 20)
            if data:
                heapq.heappush(held, (time.monotonic() + one_way, next(order), peer[sock], data))
                continue
            for s in (sock, peer.pop(sock)):  # one side closed: close the pair
                selector.unregister(s)
                peer.pop(s, None)
                s.close()
        now = time.monotonic()
        while held and held[0][0] <= now:
            _, _, destination, data = heapq.heappop(held)
            if destination.fileno() != -1:
                destination.sendall(data)


@contextmanager
def delay_relay(upstream: str, delay_ms: float):
    port = free_port()
    proc = subprocess.Popen([sys.executable, __file__, "--relay", str(port), upstream, str(delay_ms / 2000)])
    try:
        address = f"127.0.0.1:{port}"
        wait_until_it_answers(proc, address, "the delaying relay did not start")
        yield address
    finally:
        proc.terminate()
        proc.wait(timeout=10)


def measure(target, draft, address, prompts, configs, args) -> dict:
    engine = specllm.load(str(target), str(draft), n_ctx=4096, n_threads=args.threads, rpc=[address])
    try:
        texts = [engine.prompt_tokens(p.prompt, chat=True) for p in prompts]
        engine.generate(texts[0], max_tokens=16, temperature=0, drafter="auto")  # warm-up, calibration
        runs = {c: [] for c in configs}
        for _ in range(args.rounds):
            for tokens in texts:
                for config in configs:
                    drafter, _, gamma = config.partition(":")
                    r = engine.generate(
                        tokens,
                        max_tokens=args.max_tokens,
                        temperature=0,
                        drafter=drafter,
                        gamma=int(gamma) if gamma else None,
                    )
                    runs[config].append(r.stats)
    finally:
        engine.close()
    base = runs["none"]
    return {
        config: {
            "tokens_per_second": median(s.tokens_per_second for s in stats),
            "ratio": median(s.tokens_per_second / b.tokens_per_second for s, b in zip(stats, base)),
            "target_calls_per_token": sum(s.target_calls for s in stats) / sum(s.generated_tokens for s in stats),
        }
        for config, stats in runs.items()
    }


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--delay-ms", type=float, default=2.0, help="round-trip delay added in the second condition")
    ap.add_argument("-n", "--max-tokens", type=int, default=128)
    ap.add_argument(
        "--prompts", type=int, default=6, help="prompts from the built-in suite (spread over its categories)"
    )
    ap.add_argument("--rounds", type=int, default=1)
    ap.add_argument(
        "--threads", type=int, default=specllm.llama.devices.physical_cores(), help="local and server threads"
    )
    ap.add_argument(
        "--configs", default="auto,model:2,model:4,ngram:4", help="speculative configurations, DRAFTER[:GAMMA]"
    )
    ap.add_argument("--json", type=Path, help="write the results here")
    args = ap.parse_args()
    configs = ["none", *args.configs.split(",")]
    target, draft, _ = hub.resolve_models(check=False)
    suite = bench.builtin_prompts()
    prompts = (suite[:: max(1, len(suite) // args.prompts)])[: args.prompts]
    binary = server_binary()
    results, how = {}, {}
    with rpc_server(binary, "127.0.0.1", free_port(), args.threads) as address:
        results["loopback"] = measure(target, draft, address, prompts, configs, args)
        how["loopback"] = "ggml-rpc-server on 127.0.0.1"
        report("loopback", results["loopback"])
    delayed = f"+{args.delay_ms:g} ms"
    with ExitStack() as stack:
        try:
            netns = stack.enter_context(netns_with_delay(args.delay_ms))
            address = stack.enter_context(rpc_server(binary, NS_IP, 50052, args.threads, netns))
            conditions = {delayed: (address, f"netns + veth, tc netem delay {args.delay_ms:g}ms")}
        except RuntimeError as e:
            print(
                f"netem: {e}\n  -> falling back to a delaying TCP relay ({args.delay_ms / 2:g} ms each way), "
                "measured with no delay too: the relay's own cost",
                file=sys.stderr,
            )
            upstream = stack.enter_context(rpc_server(binary, "127.0.0.1", free_port(), args.threads))
            conditions = {
                name: (stack.enter_context(delay_relay(upstream, ms)), f"TCP relay, {ms / 2:g} ms each way")
                for name, ms in (("relay +0 ms", 0.0), (f"relay {delayed}", args.delay_ms))
            }
        for name, (address, description) in conditions.items():
            how[name] = description
            results[name] = measure(target, draft, address, prompts, configs, args)
            report(f"{name} ({description})", results[name])
    if args.json:
        how["OMP_WAIT_POLICY"] = os.environ["OMP_WAIT_POLICY"]
        args.json.write_text(
            json.dumps({"how": how, "settings": vars(args) | {"json": str(args.json)}, "results": results}, indent=1)
        )


def report(name: str, result: dict) -> None:
    print(f"\n{name}")
    print(f"  {'config':<10} {'tok/s':>7} {'vs none':>8} {'calls/tok':>10}")
    for config, r in result.items():
        print(f"  {config:<10} {r['tokens_per_second']:7.1f} {r['ratio']:7.2f}x {r['target_calls_per_token']:10.2f}")
    sys.stdout.flush()


if __name__ == "__main__":
    if sys.argv[1:2] == ["--relay"]:
        relay_main(int(sys.argv[2]), sys.argv[3], float(sys.argv[4]))
    else:
        main()
