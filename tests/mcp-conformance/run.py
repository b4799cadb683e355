#!/usr/bin/env python3
"""Runs every client scenario of the MCP conformance suite against agentloop's gateway.

    run.py AGENTLOOP_BIN RESULTS_DIR

after `npm ci` in this folder, which brings the suite and the Node.js 22 it needs.

Each scenario of `expected.txt` runs on its own (`conformance client --scenario S`, with
client.py as the client), and is judged by the suite's own check results, not only its
exit code: a scenario passes when the suite exited 0 and its checks.json holds at least
one SUCCESS and no FAILURE or WARNING. A scenario whose checks are absent has not passed.

The outcome must match `expected.txt`: a scenario expected to pass that fails, and one
expected to fail that passes (a stale expectation), both fail the run. The table printed
at the end lists every scenario with its result.
"""

import glob
import json
import os
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
# Longest a scenario may take, client included (the suite's own default is 30 s).
TIMEOUT_MS = 60_000


def expectations():
    """(scenario, expected, reason) from expected.txt: `scenario pass` or
    `scenario fail  why it does not pass`."""
    rows = []
    with open(os.path.join(HERE, "expected.txt")) as lines:
        for line in lines:
            line = line.strip()
            if not line or line.startswith("#"):
                continue
            parts = line.split(None, 2)
            if len(parts) < 2 or parts[1] not in ("pass", "fail"):
                sys.exit(f"expected.txt: cannot read {line!r}")
            rows.append((parts[0], parts[1], parts[2] if len(parts) > 2 else ""))
    return rows


def judge(scenario_dir, exit_code):
    """(passed, summary) from the checks.json the suite wrote under `scenario_dir`."""
    found = sorted(glob.glob(os.path.join(scenario_dir, "**", "checks.json"), recursive=True))
    if not found:
        return False, "no checks.json"
    with open(found[-1]) as f:
        checks = json.load(f)
    counts = {}
    for check in checks:
        counts[check.get("status")] = counts.get(check.get("status"), 0) + 1
    failures = [c for c in checks if c.get("status") in ("FAILURE", "WARNING")]
    success = counts.get("SUCCESS", 0)
    summary = f"{success} ok, {counts.get('FAILURE', 0)} failed, {counts.get('WARNING', 0)} warnings"
    if failures:
        summary += ": " + "; ".join(
            f"{c.get('id')}: {c.get('errorMessage') or c.get('description')}"[:160] for c in failures[:3])
    passed = exit_code == 0 and success > 0 and not failures
    if exit_code != 0 and not failures:
        summary += f" (suite exited {exit_code})"
    return passed, summary


def main():
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    binary, results_dir = sys.argv[1:]
    modules = os.path.join(HERE, "node_modules")
    node = os.path.join(modules, ".bin", "node")
    conformance = os.path.join(modules, "@modelcontextprotocol", "conformance", "dist", "index.js")
    for needed in (node, conformance):
        if not os.path.exists(needed):
            sys.exit(f"{needed} is missing: run `npm ci` in {HERE}")
    os.makedirs(results_dir, exist_ok=True)
    env = dict(os.environ, AGENTLOOP_BIN=os.path.abspath(binary))
    client = os.path.join(HERE, "client.py")
    rows = []
    for scenario, expected, reason in expectations():
        scenario_dir = os.path.join(results_dir, scenario.replace("/", "-"))
        run = subprocess.run(
            [node, conformance, "client", "--command", client, "--scenario", scenario,
             "--timeout", str(TIMEOUT_MS), "-o", scenario_dir],
            env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, check=False)
        with open(os.path.join(results_dir, scenario.replace("/", "-") + ".log"), "w") as log:
            log.write(run.stdout)
        passed, summary = judge(scenario_dir, run.returncode)
        rows.append((scenario, expected, passed, summary, reason))

    wrong = 0
    print(f"{'scenario':45} {'result':6} {'expected':8} checks")
    for scenario, expected, passed, summary, reason in rows:
        result = "pass" if passed else "fail"
        mark = "" if result == expected else "  <-- NOT AS EXPECTED"
        wrong += result != expected
        print(f"{scenario:45} {result:6} {expected:8} {summary}{mark}")
        if expected == "fail" and reason:
            print(f"{'':45} why: {reason}")
    total = len(rows)
    passing = sum(1 for r in rows if r[2])
    print(f"\n{passing} of {total} scenarios pass; {wrong} not as expected")
    if wrong:
        print(f"logs and checks: {results_dir}")
        sys.exit(1)


if __name__ == "__main__":
    main()
