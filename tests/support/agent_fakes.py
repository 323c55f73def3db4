"""Fake `cuzk` / `cuzk-bench` / work-command executables for the agent's tests.

They parse their command lines with the real programs' clap definitions
(`vast_manager.sim.cuzk_cli`, refused as clap refuses), read cuzk.toml, serve the
GET /status JSON and print the batch output format (docs/cuzk.md); the daemon
holds its PCE in memory only (the first proof makes it) and, like cuzk,
handles only SIGINT (its engine stops, the process stays), so SIGTERM ends
it. The bench talks to the daemon over plain HTTP on the daemon's `listen`
address where the real one speaks gRPC.
Knobs (environment): FAKE_GPUS (GPUs when gpus.devices is empty),
FAKE_NO_PCE (the PCE extraction never finishes), FAKE_PCE_FAILS (the extraction fails
and says so as cuzk logs it), FAKE_BENCH_CRASH (die mid-batch),
FAKE_BENCH_MARKER (file touched when a
batch of more than one proof starts), FAKE_PROOF_DELAY (real seconds per proof),
FAKE_PROOF_SECONDS (the seconds the bench reports a proof took; default: the daemon's
simulated ones, which a coordinator watching in real time finds implausible),
FAKE_DAEMON_DIES_ON (comma-separated proof numbers, counted over every daemon the test's
agent starts: the daemon is SIGKILLed as that proof arrives, as the OOM killer or a GPU
fault ends cuzk; the warm-up proof is 1, a 3-proof benchmark's are 2 to 4).
"""

from __future__ import annotations

import stat
import sys
from pathlib import Path

FAKE_DAEMON = r"""
import json, os, signal, sys, threading, time, tomllib
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from vast_manager.sim import clap
from vast_manager.sim.cuzk_cli import CUZK_DAEMON

args = clap.parse_or_exit(CUZK_DAEMON, sys.argv).values
with open(args["config"], "rb") as fh:
    cfg = tomllib.load(fh)
devices = cfg["gpus"]["devices"]
gpus = len(devices) or int(os.environ.get("FAKE_GPUS", "1"))
pce = os.path.join(cfg["srs"]["param_cache"], "pce-porep-32g.bin")
state = {"completed": 0, "pce": False, "pipelines": []}  # the PCE: never loaded from disk
lock = threading.Lock()
print(f"fake cuzk up: devices={devices} param_cache={cfg['srs']['param_cache']}", flush=True)
print("param env", os.environ.get("FIL_PROOFS_PARAMETER_CACHE"), file=sys.stderr, flush=True)

class H(BaseHTTPRequestHandler):
    def log_message(self, *a):
        pass

    def _json(self, obj):
        body = json.dumps(obj).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_GET(self):
        if self.path != "/status":
            self.send_error(404)
            return
        with lock:
            self._json({"uptime_secs": 1,
                        "counters": {"total_completed": state["completed"], "total_failed": 0,
                                     "queue_depth": 0},
                        "allocations": {"srs": [], "pce": [{"circuit_id": "porep-32g"}]
                                        if state["pce"] else []},
                        "memory": {"total_bytes": 1, "used_bytes": 0, "available_bytes": 1},
                        "synthesis": {"max_concurrent": 0, "active": 0},
                        "gpu_workers": [], "pipelines": list(state["pipelines"])})

    def do_POST(self):
        if self.path == "/preload":
            self._json({"ok": True})
        elif self.path == "/prove":
            with lock:
                counter = os.path.join(cfg["srs"]["param_cache"], "fake-proofs-arrived")
                number = 1 + (int(open(counter).read()) if os.path.exists(counter) else 0)
                with open(counter, "w") as fh:
                    fh.write(str(number))
            if str(number) in os.environ.get("FAKE_DAEMON_DIES_ON", "").split(","):
                print(f"fake cuzk killed as proof {number} arrives", flush=True)
                os.kill(os.getpid(), signal.SIGKILL)
            time.sleep(0.01)
            # More GPUs prove faster, not quite linearly.
            seconds = 60.0 if gpus == 1 else 60.0 / (gpus * 0.75)
            with lock:
                state["completed"] += 1
                state["pipelines"] = state["pipelines"][-40:] + [{
                    "job_id": f"job-{state['completed']}", "proof_kind": "porep-c2",
                    "started_secs_ago": seconds, "total_partitions": 1, "partitions_done": 1,
                    "partitions": [{"index": 0, "state": "done", "synth_ms": 1, "gpu_ms": 1}]}]
                if not state["pce"] and os.environ.get("FAKE_PCE_FAILS"):
                    print("WARN cuzk_core::engine: background PCE extraction failed "
                          "error=out of memory", flush=True)
                elif not state["pce"] and not os.environ.get("FAKE_NO_PCE"):
                    with open(pce, "wb") as fh:
                        fh.write(b"pce" * 100)
                    state["pce"] = True
            self._json({"seconds": seconds})
        else:
            self.send_error(404)

for addr in (cfg["daemon"]["listen"], cfg["daemon"]["status_listen"]):
    host, port = addr.rsplit(":", 1)
    srv = ThreadingHTTPServer((host, int(port)), H)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
signal.signal(signal.SIGINT, lambda *a: print("received SIGINT, shutting down", flush=True))
while True:
    time.sleep(3600)
"""

FAKE_BENCH = r"""
import json, os, sys, time, urllib.request
from vast_manager.sim import clap
from vast_manager.sim.cuzk_cli import CUZK_BENCH

m = clap.parse_or_exit(CUZK_BENCH, sys.argv)
addr = m.values["addr"]
sub = m.subcommand.command.name
v = m.subcommand.values

def post(path):
    req = urllib.request.Request(addr + path, data=b"", method="POST")
    with urllib.request.urlopen(req, timeout=10) as resp:
        return json.loads(resp.read())

if sub == "preload":
    post("/preload")
    print(v["circuit_id"], "loaded in 1 ms")
    sys.exit(0)
n, j = v["count"], v["concurrency"]
open(v["c1"], "rb").close()
print("=== Batch Benchmark ===\nproof type:  porep\ncount:       %d\nconcurrency: %d\n" % (n, j))
if n > 1 and os.environ.get("FAKE_BENCH_MARKER"):
    open(os.environ["FAKE_BENCH_MARKER"], "w").close()  # the real benchmark has begun
walls = []
for i in range(1, n + 1):
    time.sleep(float(os.environ.get("FAKE_PROOF_DELAY", "0")))
    if os.environ.get("FAKE_BENCH_CRASH"):
        print("  [%d/%d] COMPLETED \u2014 1.0s (prove=1 ms, queue=0 ms)" % (i, n), flush=True)
        sys.exit(1)
    secs = float(os.environ.get("FAKE_PROOF_SECONDS") or post("/prove")["seconds"])
    if os.environ.get("FAKE_PROOF_SECONDS"):
        post("/prove")  # the daemon still counts it
    walls.append(secs)
    print("  [%d/%d] COMPLETED \u2014 %.1fs (prove=%d ms, queue=0 ms)" % (i, n, secs, secs * 500),
          flush=True)
total = sum(walls) / j
print("\n=== Batch Summary ===\ntotal time:    %.1fs" % total)
print("completed:     %d\nfailed:        0" % n)
print("wall time:     avg=%.1fs min=%.1fs max=%.1fs" % (total / n, min(walls), max(walls)))
print("prove time:    avg=1.0s min=1.0s max=1.0s")
print("throughput:    %.3f proofs/min (%.1fs/proof)" % (n / total * 60, total / n))
"""

FAKE_WORK = r"""
import json, os, sys, time, urllib.request

marker = sys.argv[1]
first = not os.path.exists(marker)
with open(marker, "a") as fh:
    fh.write("start\n")
print("work started", flush=True)
addr = os.environ["VM_CUZK_ADDR"]
assert "VM_AGENT_KEY" not in os.environ
k = 0
while True:
    urllib.request.urlopen(urllib.request.Request(addr + "/prove", data=b"", method="POST"),
                           timeout=10).read()
    k += 1
    if first and k >= 2:
        sys.exit(1)  # die once: the agent must restart it
    time.sleep(0.05)
"""


def write_script(path: Path, source: str) -> str:
    path.write_text(f"#!{sys.executable}\n{source}")
    path.chmod(path.stat().st_mode | stat.S_IXUSR)
    return str(path)
