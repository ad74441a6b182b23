"""Private memory of the shared data reader on a generated file (docs/reliability.md's table).

    python benchmarks/reader_memory.py --mib 900 --format jsonl
    python benchmarks/reader_memory.py --mib 200 --format gzip      # a 200 MiB text in a <1 MiB .gz
    python benchmarks/reader_memory.py --mib 256 --format jsonl --whole-text   # the old way, for contrast

Each measurement runs in a fresh process: the file is read with `toolkit.readers.read` and its
text field checked with `check_text`, while a thread samples RssAnon (private memory) every
5 ms. RssAnon, not ru_maxrss: the Arrow cache is memory-mapped, and its file-backed pages, which
ru_maxrss counts, are the kernel's to drop. The file and datasets' cache live in a temporary
folder removed at the end.
"""

from __future__ import annotations

import gzip
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

from toolkit.arguments import ScriptParser

MEASURE = """
import json, sys, threading, time
from pathlib import Path

def anon():
    for line in open("/proc/self/status"):
        if line.startswith("RssAnon"):
            return int(line.split()[1]) << 10

peak, done = [0], [False]
def sample():
    while not done[0]:
        peak[0] = max(peak[0], anon())
        time.sleep(0.005)

path, fmt, whole = Path(sys.argv[1]), sys.argv[2], sys.argv[3] == "1"
import datasets
from toolkit import readers
base, start = anon(), time.perf_counter()
thread = threading.Thread(target=sample)
thread.start()
if whole:
    rows = len([json.loads(line) for line in path.read_text().splitlines()])
else:
    ds = readers.read(path, fmt)
    readers.check_text(ds, "text", path, fmt)
    rows = len(ds)
done[0] = True
thread.join()
print(json.dumps({"rows": rows, "growth_mib": (max(peak[0], anon()) - base) / 2**20,
                  "seconds": time.perf_counter() - start}))
"""


def generate(folder: Path, mib: int, fmt: str) -> tuple[Path, str]:
    words = "the quick brown fox jumps over the lazy dog " * 4
    if fmt == "csv":
        path, line, head = folder / "data.csv", f"{words.strip()},pos\n", "text,label\n"
    elif fmt == "gzip":
        path, line, head = folder / "data.txt.gz", words.strip() + "\n", ""
    else:
        path, line, head = folder / "data.jsonl", json.dumps({"text": words, "label": "pos"}) + "\n", ""
    block = line * 1000
    opener = gzip.open if fmt == "gzip" else open
    with opener(path, "wt") as handle:
        handle.write(head)
        for _ in range((mib << 20) // len(block)):
            handle.write(block)
    return path, {"gzip": "text"}.get(fmt, fmt)


def measure(path: Path, fmt: str, whole_text: bool, cache: Path) -> dict:
    """Rows read, private-memory growth (MiB) and seconds of one read of `path`, in a fresh
    process (tests/test_hostile.py asserts the bound with it)."""
    env = {**os.environ, "HF_DATASETS_CACHE": str(cache), "OMP_NUM_THREADS": "1"}
    out = subprocess.run([sys.executable, "-c", MEASURE, str(path), fmt, str(int(whole_text))],
                         env=env, capture_output=True, text=True, check=True)
    return json.loads(out.stdout)


def main() -> None:
    parser = ScriptParser(prog="benchmarks/reader_memory.py", description=__doc__.splitlines()[0])
    parser.add_argument("--mib", type=int, default=256, help="size of the (decompressed) file")
    parser.add_argument("--format", choices=["jsonl", "csv", "gzip"], default="jsonl")
    parser.add_argument("--whole-text", action="store_true", help="read the text into Python instead (jsonl)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        path, fmt = generate(Path(tmp), args.mib, args.format)
        result = measure(path, fmt, args.whole_text, Path(tmp) / "cache")
        print(f"| {args.mib} MiB {args.format}{' (whole text)' if args.whole_text else ''} "
              f"({path.stat().st_size / 2**20:.1f} MiB on disk) | {result['rows']:,} rows | "
              f"+{result['growth_mib']:.0f} MiB private memory | {result['seconds']:.1f} s |")


if __name__ == "__main__":
    main()
