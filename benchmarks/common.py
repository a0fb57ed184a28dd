"""Shared pieces of the benchmarks: arguments, the model and rows, interleaved timing, results.

Every benchmark measures its competing ways in one process, one repetition of each per
round (A, B, C, A, B, C, ...; odd rounds run in reverse order so a slow drift in machine
load does not always hit the same case first), after `warmup` untimed rounds. On a shared
machine only ratios mean anything, so ratios are taken *within* a round (the cases of a
round ran next to each other) and summarised by their median, with the min-max spread
over rounds.

Results go to `benchmarks/results/<name>.json` as one JSON line, written to a temporary
name, fsynced and `os.replace`d (`workbench.io.atomic_path`).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import torch
from tqdm.auto import tqdm

from workbench.defaults import EMBEDDED_DEFAULT
from workbench.io import atomic_path

BENCH_DIR = Path(__file__).resolve().parent
RESULTS_DIR = BENCH_DIR / "results"
DEFAULT_MODEL = EMBEDDED_DEFAULT
DEFAULT_BLOCK = "10:16"


# ----------------------------------------------------------------------------- arguments
def parser(description: str) -> argparse.ArgumentParser:
    """Returns an ArgumentParser with the options every benchmark takes.

    Size options a benchmark adds should default to None; `parse` fills them from the
    benchmark's full or `--quick` defaults, so a size given on the command line always wins.
    """
    p = argparse.ArgumentParser(description=description)
    p.add_argument("--model", default=DEFAULT_MODEL, help="base model spec (as `workbench --model`)")
    p.add_argument("--block", default=DEFAULT_BLOCK, help="looped block A:B")
    p.add_argument("--quick", action="store_true", help="small sizes and few repetitions")
    p.add_argument("--reps", type=int, default=None, help="timed rounds")
    p.add_argument("--warmup", type=int, default=None, help="untimed rounds first")
    p.add_argument("--threads", type=int, default=None, help="torch intra-op threads (default: torch's)")
    p.add_argument("--seed", type=int, default=0, help="row seed")
    p.add_argument("--out", type=Path, default=RESULTS_DIR, help="directory for <name>.json")
    p.add_argument("--no-progress", action="store_true", help="hide progress bars")
    return p


def parse(p: argparse.ArgumentParser, argv: list[str] | None, full: dict, quick: dict) -> argparse.Namespace:
    """Parses `argv`; options left at None take the `--quick` or full defaults."""
    args = p.parse_args(argv)
    for key, value in (quick if args.quick else full).items():
        if getattr(args, key, None) is None:
            setattr(args, key, value)
    if args.threads is not None:
        torch.set_num_threads(args.threads)
    return args


# ----------------------------------------------------------------------------- model and rows
def load_looped(model: str, block: str, max_loops: int = 16, **options):
    """Returns `(looped, tokenizer)`: a fresh retrofit of `model` at `block`, in eval mode and frozen.

    The re-entry is at its identity init; its values do not change the cost of a pass. `options` go to
    `retrofit` (e.g. reentry="inject", memory=True, halting=True).
    """
    from workbench.loop.config import Block, RetrofitConfig
    from workbench.loop.surgery import retrofit
    from workbench.models import load_base

    base, tok = load_base(model)
    looped = retrofit(base, RetrofitConfig(Block.parse(block, "--block"), max_loops=max_loops, **options))
    looped.eval()
    for p in looped.parameters():
        p.requires_grad_(False)
    return looped, tok


def chase_rows(tok, rows: int, alphabet: int = 8, seed: int = 0, depths: range | None = None) -> list[dict]:
    """Returns `rows` function-table chase rows over `alphabet` letters, depths cycled 1..N-1."""
    from workbench.tasks.chase import chase_rows as generate

    depths = depths or range(1, alphabet)
    per_depth = -(-rows // len(depths))
    made = generate(alphabet, depths, per_depth, seed, tokenizer=tok)
    # depth-major from the generator; interleave depths so any prefix mixes them
    return sorted(made, key=lambda r: (r["index"], r["depth"]))[:rows]


def chase_inputs(tok, rows: int, alphabet: int = 8, seed: int = 0):
    """Returns `(input_ids, attention_mask, candidates)` for chase rows; candidates [N] token ids."""
    from workbench.tasks.reader import candidate_ids, encode_prompts

    made = chase_rows(tok, rows, alphabet, seed)
    enc = encode_prompts(tok, [r["prompt"] for r in made])
    return enc["input_ids"], enc["attention_mask"], candidate_ids(tok, made[0]["symbols"])


def prime(looped, input_ids, attention_mask) -> None:
    """One untimed loop-1 forward: library start-up and first allocations land here, not in a case."""
    with torch.no_grad():
        looped(input_ids, attention_mask, loops=1)


# ----------------------------------------------------------------------------- timing
@dataclass
class Timings:
    """Seconds per case, one entry per timed round: wall clock and this process's CPU time.

    On a loaded machine wall time includes waiting for a core; CPU time (all threads of this
    process, `time.process_time`) counts only the work, so it is the steadier of the two.
    """

    wall: dict[str, list[float]]
    cpu: dict[str, list[float]]

    def summary(self, case: str) -> dict:
        """{"wall": summary, "cpu": summary} of one case's seconds."""
        return {"wall": summary(self.wall[case]), "cpu": summary(self.cpu[case])}

    def ratio(self, num: str, den: str) -> dict:
        """{"wall": ..., "cpu": ...}: summaries of time[num] / time[den] taken round by round."""
        return {"wall": paired_ratio(self.wall, num, den), "cpu": paired_ratio(self.cpu, num, den)}


def interleave(cases: dict[str, Callable[[], object]], reps: int, warmup: int = 1,
               progress: bool = True, desc: str = "rounds") -> Timings:
    """Returns wall and CPU seconds per case, one entry per timed round, cases run side by side.

    Each round runs every case once; odd rounds run them in reverse order. `warmup` rounds
    run first and are discarded (first calls pay for allocation and kernel selection).
    """
    names = list(cases)
    timings = Timings({n: [] for n in names}, {n: [] for n in names})
    for r in tqdm(range(warmup + reps), desc=desc, disable=not progress, leave=False):
        for name in (names if r % 2 == 0 else names[::-1]):
            wall, cpu = time.perf_counter(), time.process_time()
            cases[name]()
            wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
            if r >= warmup:
                timings.wall[name].append(wall)
                timings.cpu[name].append(cpu)
    return timings


def summary(values: list[float]) -> dict:
    """Median, min, max and relative spread ((max - min) / median) of a list of numbers."""
    med = statistics.median(values)
    return {"median": med, "min": min(values), "max": max(values),
            "spread": (max(values) - min(values)) / med if med else float("nan"), "n": len(values),
            "values": [round(v, 6) for v in values]}


def paired_ratio(times: dict[str, list[float]], num: str, den: str) -> dict:
    """Summary of time[num] / time[den] taken round by round (both ran in the same round)."""
    return summary([a / b for a, b in zip(times[num], times[den])])


# ----------------------------------------------------------------------------- memory
def _status_bytes(key: str) -> int:
    text = Path("/proc/self/status").read_text()
    return int(re.search(rf"^{key}:\s+(\d+) kB", text, re.MULTILINE).group(1)) * 1024


def rss_bytes() -> int:
    """Current resident set size of this process (Linux /proc)."""
    return _status_bytes("VmRSS")


def reset_peak_rss() -> bool:
    """Resets the kernel's peak-RSS mark (VmHWM) to the current RSS; False where not allowed."""
    try:
        Path("/proc/self/clear_refs").write_text("5")
        return True
    except OSError:
        return False


def peak_rss_bytes() -> int:
    """Peak resident set size since start or the last `reset_peak_rss` (VmHWM)."""
    return _status_bytes("VmHWM")


def allocator_peak(fn: Callable[[], object]) -> tuple[object, int]:
    """Runs `fn` under the torch profiler; returns (its result, peak bytes the CPU allocator held
    live at once for allocations made inside `fn`, relative to its start; kept results included)."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        result = fn()
    events = sorted((e.start_ns(), e.nbytes()) for e in prof.profiler.kineto_results.events()
                    if e.name() == "[memory]")
    live = peak = 0
    for _, nbytes in events:
        live += nbytes
        peak = max(peak, live)
    return result, peak


# ----------------------------------------------------------------------------- results
def machine() -> dict:
    """The machine a measurement ran on: cores, CPU model, load, torch and its threads."""
    cpu = "unknown"
    try:
        match = re.search(r"^model name\s*:\s*(.+)$", Path("/proc/cpuinfo").read_text(), re.MULTILINE)
        cpu = match.group(1).strip() if match else cpu
    except OSError:
        pass
    return {"nproc": os.cpu_count(), "cpu": cpu, "torch": torch.__version__,
            "threads": torch.get_num_threads(), "python": platform.python_version(),
            "loadavg": [round(x, 2) for x in os.getloadavg()], "commit": _commit()}


def _commit() -> str | None:
    """The checkout's short commit, with "-dirty" when tracked files differ from it (the code that ran is not that
    commit's alone)."""
    try:
        head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=BENCH_DIR, capture_output=True,
                              text=True, timeout=10).stdout.strip()
        changed = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=BENCH_DIR,
                                 capture_output=True, text=True, timeout=10).stdout.strip()
        return (head + ("-dirty" if changed else "")) or None
    except (OSError, subprocess.SubprocessError):
        return None


def command_line(name: str, argv: list[str] | None) -> str:
    """The command that reproduces a run of benchmark `name` with `argv`."""
    args = sys.argv[1:] if argv is None else argv
    return " ".join([".venv/bin/python", f"benchmarks/{name}.py", *args])


def write_result(name: str, record: dict, out_dir: Path = RESULTS_DIR) -> Path:
    """Writes `record` as one JSON line to `out_dir/<name>.json`, atomically; returns the path."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / f"{name}.json"
    with atomic_path(path) as tmp:
        tmp.write_text(json.dumps(record, sort_keys=True, allow_nan=True) + "\n")
    return path


def finish(name: str, args: argparse.Namespace, argv: list[str] | None, results: dict, started: float,
           report: Callable[[dict, str, str], None]) -> dict:
    """Prints the benchmark's report, then writes and returns its record (the end of every benchmark's main)."""
    report(results, args.model, args.block)
    rec = record(name, args, argv, results, started)
    write_result(name, rec, args.out)
    return rec


def record(name: str, args: argparse.Namespace, argv: list[str] | None, results: dict, started: float) -> dict:
    """The JSON record of one run: benchmark, command, arguments, machine, wall time, results."""
    options = {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()}
    return {"benchmark": name, "command": command_line(name, argv), "args": options, "machine": machine(),
            "time": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "wall_s": round(time.perf_counter() - started, 1),
            "results": results}


def verdicts(values: dict[str, float], ok) -> dict[str, bool]:
    """{"wall": ok(wall value), "cpu": ok(cpu value)}: a target judged on each clock."""
    return {clock: bool(ok(values[clock])) for clock in ("wall", "cpu")}


def fmt_verdicts(met: dict[str, bool]) -> str:
    """'met on CPU time, MISSED on wall clock'."""
    word = {True: "met", False: "MISSED"}
    return f"{word[met['cpu']]} on CPU time, {word[met['wall']]} on wall clock"


def fmt_ratio(s: dict) -> str:
    """'3.21x (2.98-3.40)': median and min-max of a ratio summary; 'wall .., cpu ..' for both clocks."""
    if "wall" in s:
        return f"wall {fmt_ratio(s['wall'])}, cpu {fmt_ratio(s['cpu'])}"
    return f"{s['median']:.2f}x ({s['min']:.2f}-{s['max']:.2f})"


def fmt_time(s: dict) -> str:
    """'wall 1.234 s (spread 8%), cpu 1.200 s (spread 3%)' for a Timings.summary."""
    return ", ".join(f"{k} {s[k]['median']:8.3f} s (spread {s[k]['spread']:.0%})" for k in ("wall", "cpu"))
