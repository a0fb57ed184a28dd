"""Run a probe battery: load a checkpoint and row manifests, run each probe, write the results directory.

A battery is a TOML file, or the name of a shipped one (`default`: workbench/data/probes/default.toml):

    [battery]
    manifest = "chase_n8_d1-7.jsonl"   # default rows of every probe; relative to the TOML file
    batch_size = 16                    # passed to every probe that takes one

    [probes.depth_matrix]              # one table per probe, run in file order
    per_depth = 48                     # row selection: the first `per_depth` rows at each depth,
    depths = [1, 2, 3]                 #   only `depths`, from `manifest` (all optional)
    loops = 7                          # every other key is an option of the probe's `run`;
                                       # the halting probe's `heads` (run directories) are read beside the file

The results directory gets `<table>.parquet` per table and `summary.json` (`workbench probe`
then adds report.html with `workbench.plots.report`: computation never draws). It is written into a
staging directory and moved into place at the end, so a failed battery leaves nothing behind. `summary.json`:

    probes      {probe: {headline numbers..., "wall_s": s}} or {"status": "not_applicable", "reason"}
    probe_runs  {probe: {"rows": {manifest, n, rows_sha256, row_ids_sha256}, "options", "tables"}}
    manifests   {path: {rows_sha256, row_ids_sha256}}  (whole manifests, as their sidecars say)
    checkpoint  {path, kind, provenance_sha256, support}
    model, battery, seed, wall_s, created_by
"""

from __future__ import annotations

import json
import os
import shutil
import time
from collections import defaultdict
from collections.abc import Callable
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path

import pandas as pd
from tqdm.auto import tqdm

from workbench.analysis.readings import chance
from workbench.checkpoints import NATIVE, parse_checkpoint
from workbench.defaults import resolve
from workbench.devices import device_record, resolve_device
from workbench.errors import WorkbenchError
from workbench.guard import OUTPUT_MARKER, OutputKind, guard_output, mark_output
from workbench.io import LOCK, atomic_path, write_json_atomic
from workbench.models.looped import lacking
from workbench.models.native.own import seed_initial_state
from workbench.precision import apply_precision, resolve_precision
from workbench.probes import PROBES, NotApplicable, get_probe
from workbench.probes.common import select_rows
from workbench.probes.options import check, names
from workbench.probes.spec import ProbeSpec
from workbench.readers import read_toml
from workbench.runs import load_checkpoint
from workbench.tasks.manifest import read_manifest, row_ids_sha256, rows_sha256
from workbench.tasks.reader import answer_token_ids, reads_symbol
from workbench.texts import context_limit

SELECTION_KEYS = ("manifest", "depths", "per_depth")
BATTERY_KEYS = ("manifest", "batch_size", "name")
RESULTS_FILES = ("summary.json", "report.html", OUTPUT_MARKER, LOCK)  # and *.parquet: what a results directory holds


def older_results(path: Path) -> bool:
    """Whether directory `path` holds probe results written before the output marker existed: only a probe's own
    files (*.parquet, summary.json whose created_by names the workbench, report.html)."""
    try:
        created_by = json.loads((path / "summary.json").read_text()).get("created_by", "")
    except (OSError, ValueError, AttributeError):
        return False
    return str(created_by).startswith("workbench") and all(
        p.is_file() and not p.is_symlink() and (p.suffix == ".parquet" or p.name in RESULTS_FILES)
        for p in path.iterdir())


# What `probe` writes, handed to the output guard: a results directory written whole and moved in; --overwrite
# replaces one the workbench marked, or one a probe wrote before the marker existed. Results may sit inside a run
# (the keepers' RUN/battery), never under one of its names nor inside a window sweep: the guard asks every directory
# written in place (`workbench.places`) to recognise its own.
RESULTS_OUTPUT = OutputKind("results", owns=older_results)


# ----------------------------------------------------------------------------- the battery file
def load_battery(path: str | os.PathLike) -> dict:
    """Returns {"path", "manifest" (resolved or None), "batch_size", "probes": {name: {option: value}}}.

    Raises:
        WorkbenchError: a missing or malformed file, an unknown probe or top-level key.
    """
    path = resolve("battery", path)
    raw = read_toml(path, "battery file")
    unknown = sorted(set(raw) - {"battery", "probes"})
    if unknown:
        raise WorkbenchError(f"battery file '{path}' has unknown table '{unknown[0]}'; accepted: battery, probes")
    head = raw.get("battery", {})
    bad = sorted(set(head) - set(BATTERY_KEYS))
    if bad:
        raise WorkbenchError(f"battery file '{path}': unknown key battery.{bad[0]}; accepted: {', '.join(BATTERY_KEYS)}")
    probes = raw.get("probes", {})
    for name in probes:
        get_probe(name)  # unknown names are errors that list the known ones
    beside = lambda m: str(path.parent / m) if m is not None and not Path(m).is_absolute() else m  # noqa: E731
    def paths(o: dict) -> dict:   # files a probe option names are read beside the battery file, as manifests
        extra = {"manifest": beside(o["manifest"])} if "manifest" in o else {}
        if isinstance(o.get("heads"), dict):
            extra["heads"] = {k: beside(v) for k, v in o["heads"].items()}
        return {**o, **extra}

    return {"path": str(path), "name": head.get("name", path.stem), "manifest": beside(head.get("manifest")),
            "batch_size": head.get("batch_size"), "probes": {n: paths(o) for n, o in probes.items()}}


def plan(battery: dict, only: list[str] | None, rows: str | None) -> dict[str, dict]:
    """Returns {probe: options} to run: the battery's probes (or `only`), each with its manifest resolved.

    `rows` (a manifest path or a shipped manifest's name) replaces every probe's manifest. A name in
    `only` that the battery does not configure runs with its defaults on the battery's manifest.
    """
    names = only if only is not None else list(battery["probes"])
    rows = None if rows is None else str(resolve("manifest", rows))
    out = {}
    for name in names:
        options = dict(battery["probes"].get(name, {}))
        manifest = rows or options.get("manifest") or battery["manifest"]
        if manifest is None:
            raise WorkbenchError(f"probe '{name}' has no rows: give --rows or a manifest in the battery file")
        check_options(name, {k: v for k, v in options.items() if k not in SELECTION_KEYS})
        out[name] = {**options, "manifest": str(manifest)}
    return out


def check_options(name: str, options: dict) -> None:
    """Raises WorkbenchError, one line, for the first of `options` probe `name`'s record refuses
    (`workbench.probes.options.check`: an unknown name, with the nearest one, or a value of the wrong type)."""
    _check_options(get_probe(name), options)


def _check_options(spec: ProbeSpec, options: dict) -> None:
    """`check_options` of a probe already looked up."""
    if spec.options is None:
        raise WorkbenchError(f"probe '{spec.name}' declares no options record: give its SPEC options=Options "
                             "(docs/adding-a-probe.md)")
    check(spec.name, spec.options, options)


# ----------------------------------------------------------------------------- running
def unmet(spec: ProbeSpec, model, rows: list[dict]) -> str | None:
    """Why probe `spec` does not apply to `model` and `rows`, or None: a capability the model lacks (its own
    reason), then the fields some row lacks ("needs depth, table"), then the first unmet `Need` of `spec.needs`.
    Nothing is run: every probe of a battery is asked before the first runs."""
    missing = lacking(model, spec.requires)
    if missing:   # e.g. a native looped model: nothing retrofit-only applies
        return model.unsupported.get(missing[0], f"the model lacks {missing[0]}")
    fields = spec.lacking(rows)
    if fields:
        return f"needs {', '.join(fields)}"
    return next((reason for need in spec.conditions if (reason := need.why(model, rows)) is not None), None)


def check_positions(manifests: dict, model, tokenizer) -> None:
    """Raises WorkbenchError naming the first row of any manifest whose prompt (and answer, when it is read
    exactly) is longer than the model's positions: refused before any probe, not found by one minutes in."""
    limit = context_limit(tokenizer, model.config)
    for path, manifest in manifests.items():
        for row in manifest.rows:
            n = len(tokenizer(row["prompt"])["input_ids"])
            if n == 0:
                raise WorkbenchError(f"manifest '{path}' row '{row['row_id']}' has a prompt that encodes to no "
                                     "tokens (the tokenizer drops all of its text); give it text the tokenizer reads")
            n += 0 if reads_symbol(row) else len(answer_token_ids(tokenizer, row))
            if limit is not None and n > limit:
                raise WorkbenchError(f"manifest '{path}' row '{row['row_id']}' is {n} tokens, longer than the model's "
                                     f"{limit}-token context; shorten its prompt")


def run_probe(name: str, model, tokenizer, rows: list[dict], options: dict, context: dict) -> dict[str, pd.DataFrame]:
    """Runs one probe with `options` (unknown ones are errors) plus the `context` values it accepts.

    Returns {table name: DataFrame}.

    Raises:
        NotApplicable: `unmet`'s reason (a capability, a field or a `Need` the probe declares), before it runs;
            or the probe's own reason.
    """
    module = get_probe(name)
    _check_options(module, options)
    reason = unmet(module, model, rows)
    if reason is not None:
        raise NotApplicable(reason)
    declared = names(module.options)
    kwargs = {k: v for k, v in context.items() if k in declared and v is not None}
    kwargs.update(options)
    result = module.run(model, tokenizer, rows, **kwargs)
    tables = result if isinstance(result, dict) else {name: result}
    undeclared = [t for t in tables if t not in module.tables]
    if undeclared:
        raise WorkbenchError(f"probe '{name}' returned table(s) its SPEC does not declare: {', '.join(undeclared)}; "
                             f"declared: {', '.join(module.tables)} (ProbeSpec.parts)")
    return tables


EXACT_PROBES = ("identity", "gradient_audit")  # always in fp32: their point is exactness


def run_battery(checkpoint: str, battery: str | os.PathLike | None, out: str | os.PathLike, rows: str | None = None,
                only: list[str] | None = None, overwrite: bool = False, seed: int = 0,
                progress: bool = True, precision: str = "fp32", finish: Callable[[Path], None] | None = None,
                device: str | None = None, announce: Callable[[dict[str, str]], None] | None = None,
                init_seed: int | None = None) -> dict:
    """Runs a battery on a checkpoint into the results directory `out`; returns the summary.

    Args:
        checkpoint: a `--checkpoint` spec (`workbench.checkpoints.parse_checkpoint`).
        battery: the battery TOML file (None: `native` for a native looped model, else `default`).
        out: the results directory (refused if it exists and is not empty, unless `overwrite` and the
            workbench wrote it; refused if it holds the checkpoint or a manifest read).
        rows: a manifest replacing every probe's rows.
        only: run only these probes.
        seed: passed to every probe that takes a seed (splits, pairings, nulls).
        precision: "fp32" or "bf16" (`workbench.precision`; falls back to fp32 without bf16 units). A native
            looped model is loaded in it; a retrofit's identity and gradient-audit probes run first, in fp32,
            whatever is asked.
        finish: called with the staging directory once tables and summary.json are in it, before it
            replaces `out` (the probe command writes the report there: computation never draws).
        device: "auto" (None), "cpu", "cuda" or "cuda:N" (`workbench.devices`), recorded in the summary.
        announce: called with {probe: reason} of the probes that do not apply, once every probe is asked
            (`unmet`) and before the first runs.
        init_seed: the seed a model whose loop starts from a random state (Raven) draws s_0 from; recorded.

    Raises:
        WorkbenchError: bad input (a battery, a manifest, --out, a row longer than the model's positions),
            before any probe runs.
    """
    start = time.perf_counter()
    run_on = resolve_device(device)   # before anything is read or written: a bad name is one line
    used, precision_record = resolve_precision(precision, run_on)
    checkpoint = parse_checkpoint(checkpoint, used)
    native = checkpoint.kind == NATIVE
    spec = load_battery(battery if battery is not None else "native" if native else "default")
    todo = plan(spec, only, rows)
    if not isinstance(seed, int) or isinstance(seed, bool) or not 0 <= seed < 2**32:
        raise WorkbenchError(f"--seed {seed!r} is out of range; accepted: an integer in 0..2**32-1")
    reading = [*{o["manifest"] for o in todo.values()}, checkpoint.reads, spec["path"]]
    manifests = {m: read_manifest(m) for m in dict.fromkeys(o["manifest"] for o in todo.values())}  # checked first
    guard = guard_output(out, "probe", kind=RESULTS_OUTPUT, overwrite=overwrite, reading=reading)  # before any work,
    # held to the move
    out = Path(out)
    if progress and precision != "fp32":
        tqdm.write(f"precision: {used} ({precision_record['hardware']['name']}; bf16 units: "
                   f"{', '.join(precision_record['hardware']['bf16_units']) or 'none'}); identity and gradient_audit in fp32")
    if used != "fp32":  # the exact probes first, before the frozen weights go to bf16
        todo = {**{n: o for n, o in todo.items() if n in EXACT_PROBES},
                **{n: o for n, o in todo.items() if n not in EXACT_PROBES}}
    model, tok, info = load_checkpoint(checkpoint)   # a native model in `used`; a retrofit in fp32, cast below
    seed_initial_state(model, init_seed, f"'{checkpoint.given}'")   # Raven's s_0 seed (--init-seed); others refuse it
    check_positions(manifests, model, tok)
    chosen = {name: chosen_rows(o, manifests) for name, o in todo.items()}
    probe_specs = {name: get_probe(name) for name in todo}   # looked up once a probe: asked, then summarized
    skipped = {name: reason for name in todo if (reason := unmet(probe_specs[name], model, chosen[name])) is not None}
    if announce is not None and skipped:
        announce(skipped)
    model.to(run_on)
    context = {"batch_size": spec["batch_size"], "seed": seed, "progress": progress, "base": info["base"],
               "support": info["support"]}
    staging = out.with_name(f".{out.name}.tmp{os.getpid()}")
    summary = {"probes": {}, "probe_runs": {},
               "checkpoint": {k: info[k] for k in ("path", "kind", "provenance_sha256", "support")},
               "manifests": {m: {k: man.sidecar[k] for k in ("rows_sha256", "row_ids_sha256")} for m, man in manifests.items()},
               "model": _model_record(model, info), "battery": spec["path"], "seed": seed, "created_by": _created_by(),
               "device": device_record(device, run_on),
               "precision": {**precision_record, "fp32_probes": [n for n in todo if n in EXACT_PROBES or used == "fp32"]}}
    if init_seed is not None:   # only when given: a summary without it is byte for byte what it was
        summary["model"]["init_seed"] = init_seed
    try:  # made inside the try: a signal that lands as it is made still removes it
        staging.mkdir(parents=True, exist_ok=False)
        for name in tqdm(todo, desc="probes", disable=not progress):
            if used != "fp32" and name not in EXACT_PROBES and model.precision != used:
                apply_precision(model, used)
            summary["probes"][name], summary["probe_runs"][name] = _one(probe_specs[name], todo[name], chosen[name],
                                                                         skipped.get(name), model, tok, context,
                                                                         staging)
        summary["wall_s"] = round(time.perf_counter() - start, 1)
        write_json_atomic(staging / "summary.json", summary)
        failed = None
        if finish is not None:
            try:
                finish(staging)  # e.g. the report: written before the move, so `out` is never without it
            except Exception as err:  # the tables are complete: a report that fails must not discard them
                failed = err
                summary["finish_error"] = f"{type(err).__name__}: {err}"
                write_json_atomic(staging / "summary.json", summary)
        mark_output(staging, "probe")
        guard.commit_dir(staging)  # only now does `out` change, re-checked under the lock: complete, or as it was
    except BaseException:  # Ctrl-C and SIGTERM (workbench.cli) included
        shutil.rmtree(staging, ignore_errors=True)
        raise
    if failed is not None:
        raise WorkbenchError(f"the results are written to {out}, but its report failed ({summary['finish_error']}); "
                             f"run `workbench report {out}` once the cause is fixed") from failed
    return summary


def battery_rows(rows: list[dict], depths=None, per_depth: int | None = None) -> list[dict]:
    """Returns a probe's rows: the battery's depth selection applied to rows with a depth, every row without one.

    A battery's `depths` and `per_depth` were written for rows that have depths (its own manifest). A row
    whose depth is not given (depth 0: a user's row, `workbench.tasks.user`) has no depth to select on, so
    it is always read, and never capped: `--rows` on a user's file reads the whole file.
    """
    if all(r["depth"] != 0 for r in rows):
        return select_rows(rows, depths, per_depth)
    taken: dict[int, int] = defaultdict(int)
    out = []
    for r in rows:
        d = r["depth"]
        if d != 0 and ((depths is not None and d not in depths) or (per_depth is not None and taken[d] >= per_depth)):
            continue
        taken[d] += 1
        out.append(r)
    return out


def chosen_rows(options: dict, manifests: dict) -> list[dict]:
    """A probe's rows: its manifest's, with its `depths` and `per_depth` selection (`battery_rows`)."""
    return battery_rows(manifests[options["manifest"]].rows, options.get("depths"), options.get("per_depth"))


def _one(spec, options, chosen, skipped, model, tok, context, staging) -> tuple[dict, dict]:
    name = spec.name
    options = dict(options)
    manifest = options.pop("manifest")
    selection = {k: options.pop(k) for k in ("depths", "per_depth") if k in options}
    record = {"rows": {"manifest": manifest, "n": len(chosen), "rows_sha256": rows_sha256(chosen),
                       "row_ids_sha256": row_ids_sha256(chosen), "chance": chance(chosen), **selection},
              "options": options}
    unknown = sum(r["depth"] == 0 for r in chosen)
    if unknown:   # rows that give no depth: the battery's per-depth selection did not apply to them
        record["rows"]["depth_not_given"] = unknown
    if skipped is not None:   # asked before the first probe ran (`unmet`)
        return {"status": "not_applicable", "reason": skipped}, {**record, "tables": []}
    t0 = time.perf_counter()
    try:
        tables = run_probe(name, model, tok, chosen, options, context)
    except NotApplicable as reason:
        return {"status": "not_applicable", "reason": str(reason)}, {**record, "tables": []}
    for table, frame in tables.items():
        _write_parquet(frame, staging / f"{table}.parquet")
    headline = spec.summarize(tables)
    return ({**headline, "wall_s": round(time.perf_counter() - t0, 1)},
            {**record, "tables": sorted(tables)})


def _write_parquet(frame: pd.DataFrame, path: Path) -> None:
    with atomic_path(path) as tmp:
        frame.to_parquet(tmp, index=False)


def _model_record(model, info: dict) -> dict:
    cfg = model.config
    return {"base": info["base"], "base_sha256": info["base_sha256"], "block": [model.a, model.b],
            "n_layers": model.n_layers, "d_model": cfg.hidden_size, "settings": info["settings"],
            "dtype": str(next(model.parameters()).dtype).removeprefix("torch."), "device": str(next(model.parameters()).device)}


def _created_by() -> str:
    try:
        return f"workbench {version('workbench')}"
    except PackageNotFoundError:
        return "workbench"


__all__ = ["PROBES", "load_battery", "plan", "run_battery", "run_probe", "unmet"]
