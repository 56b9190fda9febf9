"""Runs the OpInfo conformance harness and prints the table and the totals.

    python -m tests.opinfo.report                      # the whole op_db (tens of minutes)
    python -m tests.opinfo.report add mul softmax      # only these ops (name or name.variant)
    python -m tests.opinfo.report --dtypes float32,int64 --samples 2 --json out.json
    python -m tests.opinfo.report cummax abs --update opinfo_results.json   # rerun some, merge

The ops run in a worker process that the driver restarts after a crash or a hang, so one bad op
costs only its own row ("error: worker crashed" / "timeout").
"""
from __future__ import annotations

import argparse
import collections
import json
import os
import subprocess
import sys
import time

RESULTS = ("pass", "layout", "mismatch", "error", "fallback", "skip")  # layout: equal values, other strides


def _worker(args):
    import torch
    os.environ.setdefault("TORCH_TPU_CACHE_DIR", os.path.join(os.path.expanduser("~"), ".cache", "torch_tpu_opinfo"))
    import warnings
    warnings.filterwarnings("ignore")
    import torch_tpu  # noqa: F401
    from . import harness
    dtypes = [getattr(torch, d) for d in args.dtypes.split(",")]
    names = [line.strip() for line in open(args.ops_file) if line.strip()]
    by_key = {harness.op_key(o): o for o in harness.select_ops()}
    with open(args.out, "a") as f:
        for name in names:
            f.write(json.dumps({"begin": name}) + "\n")
            f.flush()
            for r in harness.run_op(by_key[name], dtypes, args.samples, args.timeout):
                f.write(json.dumps(r) + "\n")
            f.flush()


def _drive(keys, args, out_path):
    """Runs `keys` in worker processes until each has its rows; returns the rows."""
    rows, todo = [], list(keys)
    dtype_names = args.dtypes.split(",")
    while todo:
        ops_file = out_path + ".ops"
        with open(ops_file, "w") as f:
            f.write("\n".join(todo))
        if os.path.exists(out_path):
            os.remove(out_path)
        cmd = [sys.executable, "-m", "tests.opinfo.report", "--worker", "--ops-file", ops_file, "--out", out_path,
               "--dtypes", args.dtypes, "--samples", str(args.samples), "--timeout", str(args.timeout)]
        proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        hard = args.timeout * len(dtype_names) + 60
        last_size, last_change = -1, time.time()
        while proc.poll() is None:
            time.sleep(1)
            size = os.path.getsize(out_path) if os.path.exists(out_path) else 0
            if size != last_size:
                last_size, last_change = size, time.time()
            elif time.time() - last_change > hard:
                proc.kill()  # the worker we started, stuck in one op
                proc.wait()
                break
        err = proc.stderr.read() if proc.stderr else ""
        done_rows, current = [], None
        if os.path.exists(out_path):
            for line in open(out_path):
                d = json.loads(line)
                if "begin" in d:
                    current = d["begin"]
                else:
                    done_rows.append(d)
        finished = {r["op"] for r in done_rows}
        rows += done_rows
        # ops done in full; the one that was running when the worker died gets error rows
        pending = [k for k in todo if k not in finished]
        if proc.returncode != 0 and pending:
            bad = current if current in pending else pending[0]
            partial = {r["dtype"] for r in done_rows if r["op"] == bad}
            why = "worker crashed or hung (rc=%s): %s" % (proc.returncode, (err.strip().splitlines() or [""])[-1][:150])
            rows = [r for r in rows if r["op"] != bad]
            rows += [dict(op=bad, dtype=d, result="error", reason=why) for d in dtype_names]
            pending = [k for k in pending if k != bad]
            del partial
        elif pending and proc.returncode == 0:
            # rows of an op still being written when the worker ended normally cannot happen; guard anyway
            rows += [dict(op=k, dtype=d, result="error", reason="no result") for k in pending for d in dtype_names]
            pending = []
        todo = pending
        print(f"[opinfo] {len(keys) - len(todo)}/{len(keys)} ops done", file=sys.stderr, flush=True)
    return rows


def totals(rows):
    c = collections.Counter(r["result"] for r in rows)
    ran = sum(c[k] for k in RESULTS if k != "skip")
    pct = 100.0 * c["pass"] / ran if ran else 0.0
    return {**{k: c[k] for k in RESULTS}, "ran": ran, "pass_pct": round(pct, 2)}


def print_table(rows, show_pass=True, file=sys.stdout):
    w = max([len(r["op"]) for r in rows] + [2])
    for r in rows:
        if not show_pass and r["result"] in ("pass",):
            continue
        if r["result"] == "skip" and r.get("reason", "").startswith("dtype not supported"):
            continue
        print(f"{r['op']:<{w}}  {r['dtype']:<10} {r['result']:<9} {r.get('reason', '')[:240]}", file=file)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("ops", nargs="*", help="op names (or name.variant); default: all of op_db")
    p.add_argument("--dtypes", default="float32,bfloat16,float16,int32,int64,bool,float64,complex64")
    p.add_argument("--samples", type=int, default=3, help="samples per (op, dtype)")
    p.add_argument("--timeout", type=float, default=60.0, help="seconds per (op, dtype)")
    p.add_argument("--json", default="opinfo_results.json", help="where to write the rows and totals")
    p.add_argument("--update", metavar="JSON", help="rerun the named ops and replace their rows in this "
                   "earlier result file (which is rewritten with new totals)")
    p.add_argument("--failures-only", action="store_true", help="print only rows that did not pass")
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--ops-file", help=argparse.SUPPRESS)
    p.add_argument("--out", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.worker:
        return _worker(args)

    from torch.testing._internal.common_methods_invocations import op_db

    from .harness import op_key
    keys = [op_key(o) for o in op_db]
    if args.ops:
        wanted = set(args.ops)
        keys = [k for o, k in zip(op_db, keys) if k in wanted or o.name in wanted]
        if not keys:
            sys.exit(f"no op_db entry named {args.ops}")
    t0 = time.time()
    partial = os.path.abspath(args.json) + ".partial"
    rows = _drive(keys, args, partial)
    order = {k: i for i, k in enumerate(keys)}
    if args.update:
        with open(args.update) as f:
            old = json.load(f)["rows"]
        rerun = {(r["op"], r["dtype"]) for r in rows}
        rows = [r for r in old if (r["op"], r["dtype"]) not in rerun] + rows
        order = {k: i for i, k in enumerate(op_key(o) for o in op_db)}
        args.json = args.update
    rows.sort(key=lambda r: order.get(r["op"], 0))
    print_table(rows, show_pass=not args.failures_only)
    t = totals(rows)
    print()
    print("totals: " + "  ".join(f"{k}={t[k]}" for k in RESULTS) +
          f"  (ran {t['ran']}, pass {t['pass_pct']}% of those run; skips excluded)  {time.time() - t0:.0f}s")
    with open(args.json, "w") as f:
        json.dump({"totals": t, "rows": rows}, f, indent=1)
    for path in (partial, partial + ".ops"):
        if os.path.exists(path):
            os.remove(path)


if __name__ == "__main__":
    main()
