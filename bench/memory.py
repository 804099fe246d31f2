"""Idle memory with one echo replica: surge vs Ray Serve 2.60.

    python bench/memory.py [--quick] [--settle 10] [--systems surge,ray]

Each system runs the same one-replica echo app (bench/apps/pid_echo_driver.py) from a
fresh driver; ~10 s after its first HTTP 200, PSS (and RSS, and USS = private pages, for
reference) is read from /proc/PID/smaps_rollup for every process of the driver's process
tree, each listed with its command line. Processes of the system that are not in that tree
are looked for too, and added (and said so) when found: for Ray, by its session directory
(a command line naming it, or stdout/stderr open on its logs -- Ray's workers write
there); for surge, by its control address (SURGE_ADDRESS in the process environment).

PSS splits shared pages between the processes that map them, so pages shared with
processes outside the tree (another program using the same libraries) are partly
counted elsewhere; USS is the lower bound that ignores shared pages entirely.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.common import (
    APPS,
    RAY_VENV,
    ROOT,
    cmdline,
    driver,
    exit_on_sigterm,
    free_port,
    process_tree,
    pss_kib,
    rss_kib,
    surge_env,
    system_python,
)

START_TIMEOUT_S = 180.0


def uss_kib(pid: int) -> int:
    try:
        text = Path(f"/proc/{pid}/smaps_rollup").read_text()
    except OSError:
        return 0
    return sum(int(m) for m in re.findall(r"^Private_(?:Clean|Dirty):\s+(\d+) kB", text, re.M))


def ppid_of(pid: int) -> int:
    try:
        return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])
    except (OSError, IndexError, ValueError):
        return -1


def first_200(url: str, timeout_s: float, alive: Any) -> int:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(url, timeout=2) as response:
                if response.status == 200:
                    return int(json.loads(response.read())["pid"])
        except (OSError, ValueError, KeyError):
            pass
        if not alive():
            raise RuntimeError("the driver exited before serving")
        time.sleep(0.05)
    raise RuntimeError(f"no HTTP 200 from {url} within {timeout_s:.0f} s")


def all_pids() -> list[int]:
    return [int(e) for e in os.listdir("/proc") if e.isdigit()]


def ray_session_dir(pids: list[int]) -> str | None:
    for pid in pids:
        match = re.search(r"(/tmp/ray/session_[0-9_\-]+)", cmdline(pid))
        if match:
            return match.group(1)
    return None


def in_session(pid: int, session: str) -> bool:
    if session in cmdline(pid):
        return True
    for fd in (1, 2):
        try:
            if os.readlink(f"/proc/{pid}/fd/{fd}").startswith(session + "/"):
                return True
        except OSError:
            pass
    return False


def has_env(pid: int, entry: str) -> bool:
    try:
        return entry.encode() in Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    except OSError:
        return False


def measure(system: str, settle_s: float) -> dict[str, Any]:
    port = free_port()
    url = f"http://127.0.0.1:{port}/echo"
    argv = [system_python(system), str(APPS / "pid_echo_driver.py"), "--system", system,
            "--port", str(port)]
    env = surge_env() if system == "surge" else {}
    with driver(system, argv, env) as running:
        try:
            replica_pid = first_200(url, START_TIMEOUT_S, lambda: running.process.poll() is None)
        except RuntimeError as exc:
            fatal = [line for _, line in running.lines if line.startswith("FATAL")]
            raise RuntimeError(f"{system}: {exc} {' '.join(fatal)}\n--- driver stderr tail:\n"
                               f"{running.stderr_tail()}") from None
        print(f"   {system}: serving (replica pid {replica_pid}); settling {settle_s:.0f} s",
              flush=True)
        time.sleep(settle_s)
        tree = process_tree(running.process.pid)
        running.remember_tree()
        notes: list[str] = []
        extra: list[int] = []
        if system == "ray":
            session = ray_session_dir(tree)
            if session is None:
                notes.append("no Ray session directory found in the driver's tree")
            else:
                notes.append(f"Ray session: {session}")
                extra = [p for p in all_pids() if p not in tree and p != os.getpid()
                         and in_session(p, session)]
        else:
            address = f"SURGE_ADDRESS={env['SURGE_ADDRESS']}"
            extra = [p for p in all_pids() if p not in tree and p != os.getpid()
                     and has_env(p, address)]
        if extra:
            notes.append(f"{len(extra)} process(es) of this {system} instance are NOT in the "
                         "driver's process tree; found and added: "
                         + ", ".join(str(p) for p in extra))
        else:
            notes.append(f"every process of this {system} instance found is in the driver's "
                         "process tree (searched by "
                         + ("session directory" if system == "ray" else "SURGE_ADDRESS") + ")")
        if replica_pid not in tree + extra:
            notes.append(f"WARNING: the replica that answered (pid {replica_pid}) was not found")
        rows = []
        for pid in tree + extra:
            rows.append({"pid": pid, "ppid": ppid_of(pid), "in_tree": pid in tree,
                         "driver": pid == running.process.pid, "pss": pss_kib(pid),
                         "rss": rss_kib(pid), "uss": uss_kib(pid), "cmd": cmdline(pid)})
    return {"rows": rows, "notes": notes, "replica_pid": replica_pid}


def shorten(cmd: str) -> str:
    cmd = cmd.replace(str(RAY_VENV), "$RAY_VENV").replace(str(ROOT) + "/", "")
    return re.sub(r"lib/python3\.\d+/site-packages/", "", cmd)


def mib(kib: float) -> float:
    return kib / 1024


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="settle 3 s instead of 10 s")
    parser.add_argument("--settle", type=float, default=10.0)
    parser.add_argument("--systems", default="surge,ray")
    parser.add_argument("--width", type=int, default=90, help="command-line column width")
    args = parser.parse_args()
    exit_on_sigterm()
    settle = 3.0 if args.quick else args.settle
    systems = [s for s in args.systems.split(",") if s]
    print(f"load average before: {os.getloadavg()[0]:.2f} ({os.cpu_count()} CPUs)", flush=True)
    results: dict[str, dict[str, Any]] = {}
    for system in systems:
        print(f"== {system}", flush=True)
        try:
            results[system] = measure(system, settle)
        except RuntimeError as exc:
            print(f"   {system} FAILED: {exc}", flush=True)
    totals: dict[str, dict[str, float]] = {}
    for system, result in results.items():
        rows = result["rows"]
        print()
        print(f"### {system}: {len(rows)} processes, {settle:.0f} s after the first 200")
        for note in result["notes"]:
            print(f"- {note}")
        print()
        print("| pid | ppid | in driver tree | PSS MiB | RSS MiB | USS MiB | command line |")
        print("|---|---|---|---|---|---|---|")
        for row in sorted(rows, key=lambda r: -r["pss"]):
            cmd = shorten(row["cmd"])[:args.width].replace("|", "\\|")
            flag = "driver" if row["driver"] else ("yes" if row["in_tree"] else "NO (added)")
            print(f"| {row['pid']} | {row['ppid']} | {flag} | {mib(row['pss']):.1f} "
                  f"| {mib(row['rss']):.1f} | {mib(row['uss']):.1f} | {cmd} |")
        total = {key: mib(sum(r[key] for r in rows)) for key in ("pss", "rss", "uss")}
        driver_pss = mib(sum(r["pss"] for r in rows if r["driver"]))
        total["pss_without_driver"] = total["pss"] - driver_pss
        total["procs"] = len(rows)
        totals[system] = total
        print(f"| **total** | | | **{total['pss']:.1f}** | {total['rss']:.1f} "
              f"| {total['uss']:.1f} | {len(rows)} processes (PSS without the driver "
              f"script: {total['pss_without_driver']:.1f}) |")

    def t(system: str, key: str) -> float:
        return totals.get(system, {}).get(key, float("nan"))

    ratio = t("ray", "pss") / t("surge", "pss") if t("surge", "pss") else float("nan")
    print()
    print(f"($RAY_VENV = {RAY_VENV}; paths under site-packages/ and {ROOT} shortened)")
    print()
    print("| system | processes | PSS MiB | RSS MiB | USS MiB | PSS without driver MiB |")
    print("|---|---|---|---|---|---|")
    for system in totals:
        print(f"| {system} | {t(system, 'procs'):.0f} | {t(system, 'pss'):.1f} "
              f"| {t(system, 'rss'):.1f} | {t(system, 'uss'):.1f} "
              f"| {t(system, 'pss_without_driver'):.1f} |")
    print()
    print(f"ratio = ray PSS / surge PSS = {ratio:.2f}")
    print(f"load average after: {os.getloadavg()[0]:.2f}", flush=True)
    print("summary: " + " ".join([
        f"surge_pss_mib={t('surge', 'pss'):.1f}",
        f"ray_pss_mib={t('ray', 'pss'):.1f}",
        f"ratio={ratio:.2f}",
        f"surge_rss_mib={t('surge', 'rss'):.1f}",
        f"ray_rss_mib={t('ray', 'rss'):.1f}",
        f"surge_uss_mib={t('surge', 'uss'):.1f}",
        f"ray_uss_mib={t('ray', 'uss'):.1f}",
        f"surge_procs={t('surge', 'procs'):.0f}",
        f"ray_procs={t('ray', 'procs'):.0f}",
    ]))


if __name__ == "__main__":
    main()
