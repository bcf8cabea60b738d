"""What one redraw of the live view (`specllm run`, `chat`) costs as the text grows. It redraws up
to 12 times a second from the decoding thread, so its cost comes out of the generation's wall time.

    python benchmarks/live_view.py [--steps 500,2000,8000] [--target-only] [--width 120] [--height 40]

Each step appends about 12 characters in three colours (accepted, rejected, the target's own), as a
speculative step does (with --target-only, one token of the target's own); after each count of
steps, the median of 20 redraws is reported, drawn to an in-memory terminal.
"""

import argparse
import io
import statistics
import time

from rich.console import Console

from specllm.chat.view import LiveView
from specllm.engine.loop import Stats, Step


def redraw_ms(view: LiveView, repeats: int = 20) -> float:
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        view._live.refresh()  # what step() does at most every REDRAW_SECONDS
        times.append(time.perf_counter() - start)
    return 1000 * statistics.median(times)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--steps", default="500,2000,8000", help="step counts at which to time a redraw")
    ap.add_argument("--width", type=int, default=120)
    ap.add_argument("--height", type=int, default=40)
    ap.add_argument("--target-only", action="store_true", help="steps of one token the target chose, no drafts")
    args = ap.parse_args()
    counts = sorted(int(n) for n in args.steps.split(","))
    console = Console(file=io.StringIO(), force_terminal=True, width=args.width, height=args.height)
    view = LiveView(console, "auto")
    stats = Stats()
    rows = []
    with view:
        done = 0
        for count in counts:
            for i in range(done, count):
                if args.target_only:
                    view.step(Step([], 0, 3, "", f"w{i} ", "", stats, "none"))
                else:
                    rejected = "nope " if i % 3 == 0 else ""
                    view.step(Step([1, 2], 1, 3, f"word{i} ", "x ", rejected, stats, "model"))
            done = count
            rows.append((count, len(view.body), len(view.body.spans), redraw_ms(view)))
    for count, chars, spans, ms in rows:
        print(f"after {count:6d} steps ({chars:7d} characters, {spans:6d} spans): a redraw takes {ms:6.2f} ms")


if __name__ == "__main__":
    main()
