"""A blocked gang in every view Headway gives of it: what issue #26's closing note shows.

Starts a stack of its own (a Temporal dev server with its HTTP API, the control-plane
worker and a simulated cluster worker as processes, each with a Prometheus endpoint and
its spans written to its log as JSON), then, through the CLI as processes:

1. ``filler`` takes one of the two 8-GPU nodes of ``gpu-a`` for ``--hold`` seconds;
2. ``gang`` (2 pods of ``H100:8``) cannot fit whole and blocks the strict queue
   ``train``; ``small`` (one GPU) is held for it.

While the gang waits, and again once it has run, it prints the four views:

- ``headway describe action gang`` (the CLI);
- the control plane's scrape: ``headway_queue_blocked_gang``,
  ``headway_queue_blocked_head_seconds``, the waiting-by-reason gauge and the reason,
  admission and wait-histogram counters of the gang's queue;
- the Temporal server's HTTP API, as the Web UI reads it: the workflow's summary and
  details (user metadata), its current details, the ``HeadwayReason`` and
  ``HeadwayReasons`` search attributes, and a visibility query by reason;
- the gang's trace: every span of its trace id from the CLI's, the control plane's and
  the cluster worker's exporters, in start order, with its service.

It exits non-zero if a view does not say what it should (the gauge raised while blocked
and gone after, the reason in each view, one trace joining the three processes).

    python bench/observe_blocked_gang.py [--hold 20] [--out DIR]
"""

from __future__ import annotations

import argparse
import base64
import json
import os
import subprocess
import sys
import tempfile
import time
import urllib.parse
import urllib.request
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

from headway import protocol
from headway.cli._common import free_port
from headway.cli._stack import Stack, _headway, local_env, start_server
from headway.cli.server import server_argv

T = TypeVar("T")

FLEET = """
clusters:
  - name: gpu-a
    node_groups:
      - {name: h100, count: 2, shape: {cpu: 96, memory: 1Ti, gpu: "H100:8"}}
queues:
  - {name: train, priority: high, algorithm: strict, clusters: [gpu-a]}
"""

SPANS_ENV = {"HEADWAY_OTEL_EXPORTER": "console", "HEADWAY_METRICS_INTERVAL_S": "1"}


class ViewFailed(AssertionError):
    pass


def eventually(probe: Callable[[], T | None], what: str, timeout_s: float = 60.0) -> T:
    deadline = time.monotonic() + timeout_s
    while True:
        got = probe()
        if got is not None:
            return got
        if time.monotonic() > deadline:
            raise ViewFailed(f"timed out waiting for {what}")
        time.sleep(0.3)


class Observer:
    def __init__(self, stack: Stack, tenant: str, http: int, scrape_url: str) -> None:
        self.stack, self.tenant = stack, tenant
        self.api_base = f"http://127.0.0.1:{http}/api/v1/namespaces/default"
        self.scrape_url = scrape_url
        self.cli_log = stack.data_dir / "logs" / "cli.log"

    # -- the CLI --------------------------------------------------------------------
    def hw(self, *args: str, spans: bool = False) -> tuple[int, str]:
        env = {**local_env(), **(SPANS_ENV if spans else {})}
        argv = _headway("--address", self.stack.address, "--tenant", self.tenant, *args)
        proc = subprocess.run(argv, capture_output=True, text=True, env=env, timeout=120)
        if spans:
            with self.cli_log.open("a") as f:
                f.write(proc.stderr)
        return proc.returncode, proc.stdout + ("" if spans else proc.stderr)

    # -- the HTTP API, as the Web UI reads it ----------------------------------------
    def api(self, path: str, body: dict[str, Any] | None = None) -> Any:
        data = json.dumps(body).encode() if body is not None else None
        req = urllib.request.Request(
            self.api_base + path, data=data, method="POST" if data else "GET"
        )
        with urllib.request.urlopen(req, timeout=10) as resp:
            return json.loads(resp.read())

    def wf(self, action: str) -> str:
        return urllib.parse.quote(protocol.action_workflow_id(self.tenant, action), safe="")

    def web_ui(self, action: str) -> dict[str, Any]:
        desc = self.api(f"/workflows/{self.wf(action)}")
        meta = desc.get("executionConfig", {}).get("userMetadata", {})
        fields = desc["workflowExecutionInfo"].get("searchAttributes", {}).get("indexedFields", {})
        out = self.api(f"/workflows/{self.wf(action)}/query/__temporal_workflow_metadata", {})
        result = out["queryResult"]
        (current,) = result["payloads"] if isinstance(result, dict) else result
        return {
            "status": desc["workflowExecutionInfo"]["status"],
            "summary": _value(meta.get("summary")),
            "details": _value(meta.get("details")),
            "currentDetails": _value(current).get("currentDetails"),
            "HeadwayReason": _value(fields.get("HeadwayReason")),
            "HeadwayReasons": _value(fields.get("HeadwayReasons")),
            "HeadwayQueue": _value(fields.get("HeadwayQueue")),
        }

    def search(self, reason: str) -> list[str]:
        query = urllib.parse.quote(
            f"HeadwayTenant = '{self.tenant}' AND HeadwayReasons = '{reason}'"
        )
        got = self.api(f"/workflows?query={query}").get("executions", [])
        return sorted(e["execution"]["workflowId"] for e in got)

    # -- the scrape ------------------------------------------------------------------
    def scrape(self) -> list[str]:
        with urllib.request.urlopen(self.scrape_url, timeout=10) as resp:
            text = resp.read().decode()
        keep = (
            "headway_queue_blocked_gang",
            "headway_queue_blocked_head_seconds",
            "headway_queue_waiting",
            "headway_reasons_total",
            "headway_admissions_total",
            "headway_admission_wait_seconds_count",
        )
        return [
            line
            for line in text.splitlines()
            if line.startswith(keep) and f'tenant="{self.tenant}"' in line
        ]

    # -- the trace -------------------------------------------------------------------
    def spans(self) -> list[dict[str, Any]]:
        found: list[dict[str, Any]] = []
        for log in sorted((self.stack.data_dir / "logs").glob("*.log")):
            found += _console_spans(log.read_text(errors="replace"))
        return found


def _value(payload: Any) -> Any:
    if isinstance(payload, dict) and "data" in payload and "metadata" in payload:
        return json.loads(base64.b64decode(payload["data"]))
    return payload


def _console_spans(text: str) -> list[dict[str, Any]]:
    """The spans OpenTelemetry's console exporter wrote into a log: each a JSON object
    from a line ``{`` to a line ``}``, between the process's other lines."""
    spans, chunk = [], None
    for line in text.splitlines():
        if line == "{":
            chunk = [line]
        elif chunk is not None:
            chunk.append(line)
            if line == "}":
                try:
                    obj = json.loads("\n".join(chunk))
                except json.JSONDecodeError:
                    obj = None
                if isinstance(obj, dict) and "context" in obj:
                    spans.append(obj)
                chunk = None
    return spans


def show(title: str, body: str) -> None:
    print(f"\n=== {title} ===\n{body.rstrip()}", flush=True)


def check(ok: bool, what: str) -> None:
    if not ok:
        raise ViewFailed(what)


def run(hold_s: int, out_dir: Path) -> None:
    fleet_file = out_dir / "fleet.yaml"
    fleet_file.write_text(FLEET)
    port, http, metrics = free_port(), free_port(), free_port()
    tenant = f"obs-{uuid.uuid4().hex[:6]}"
    stack = Stack(out_dir, f"127.0.0.1:{port}", None)
    try:
        argv = [*server_argv(out_dir, port=port, headless=True), "--http-port", str(http)]
        start_server(stack, argv, port)
        common = ["--address", stack.address, "--tenant", tenant]
        db = f"sqlite:///{out_dir / 'headway.db'}"
        stack.spawn(
            "control-plane",
            _headway(
                *common,
                "worker",
                "control-plane",
                "--fleet",
                str(fleet_file),
                "--database-url",
                db,
                "--metrics-port",
                str(metrics),
            ),
            env=SPANS_ENV,
        )
        stack.spawn(
            "cluster-gpu-a",
            _headway(*common, "worker", "cluster", "--name", "gpu-a", "--fleet", str(fleet_file)),
            env=SPANS_ENV,
        )
        o = Observer(stack, tenant, http, f"http://127.0.0.1:{metrics}/metrics")

        def ready() -> bool | None:
            dead = stack.failed()
            if dead is not None:
                raise ViewFailed(f"{dead.name} exited:\n{dead.tail()}")
            code, out = o.hw("get", "clusters", "-o", "json")
            status = {c["name"]: c["status"] for c in json.loads(out)} if code == 0 else {}
            return True if status.get("gpu-a") == "Ready" else None

        eventually(ready, "gpu-a reporting")
        print(f"stack up: tenant {tenant}, server {stack.address}, logs in {out_dir / 'logs'}")
        for action_id, *flags in (
            ("filler", "--gpu", "H100:8", "--duration", str(hold_s), "--estimate", str(hold_s)),
            ("gang", "--gpu", "H100:8", "--replicas", "2", "--duration", "2"),
            ("small", "--gpu", "H100:1", "--duration", "1"),
        ):
            code, out = o.hw("submit", "--queue", "train", "--id", action_id, *flags, spans=True)
            check(code == 0, f"submit {action_id}: exit {code}: {out}")
            print(f"$ headway submit --queue train --id {action_id} {' '.join(flags)}\n{out}")

        # While it waits: the gauge is raised and every view says why.
        def blocked() -> list[str] | None:
            lines = o.scrape()
            return (
                lines if any(ln.startswith("headway_queue_blocked_gang{") for ln in lines) else None
            )

        lines = eventually(blocked, "headway_queue_blocked_gang in the scrape")
        eventually(
            lambda: True if o.web_ui("gang")["HeadwayReason"] == "NoClusterCapacity" else None,
            "HeadwayReason NoClusterCapacity",
        )
        time.sleep(1.0)  # a few more seconds of blocked head
        show("WHILE BLOCKED: headway describe action gang", o.hw("describe", "action", "gang")[1])
        show("WHILE BLOCKED: headway why small", o.hw("why", "small")[1])
        show("WHILE BLOCKED: headway get queue train", o.hw("get", "queue", "train")[1])
        lines = o.scrape()
        show(
            f"WHILE BLOCKED: Prometheus scrape ({o.scrape_url}, the queue's lines)",
            "\n".join(lines),
        )
        check(any(ln.startswith("headway_queue_blocked_gang{") for ln in lines), "gauge raised")
        ui = o.web_ui("gang")
        show(
            "WHILE BLOCKED: the Temporal HTTP API (as the Web UI reads it)",
            json.dumps(ui, indent=2),
        )
        check("NoClusterCapacity" in str(ui["currentDetails"]), "current details name the reason")

        # Once it ran: the gauge is gone, the reasons stay searchable, one trace.
        def ended() -> dict[str, Any] | None:
            got = o.web_ui("gang")
            return got if got["status"] == "WORKFLOW_EXECUTION_STATUS_COMPLETED" else None

        ui = eventually(ended, "the gang's end", timeout_s=hold_s + 90)
        eventually(
            lambda: (
                True
                if not any(ln.startswith("headway_queue_blocked_gang{") for ln in o.scrape())
                else None
            ),
            "the gauge cleared",
        )
        show("AFTER: headway describe action gang", o.hw("describe", "action", "gang")[1])
        show("AFTER: headway get queue train", o.hw("get", "queue", "train")[1])
        lines = o.scrape()
        show("AFTER: Prometheus scrape (the queue's lines)", "\n".join(lines))
        check(not any(ln.startswith("headway_queue_blocked_gang{") for ln in lines), "gauge gone")
        show("AFTER: the Temporal HTTP API", json.dumps(ui, indent=2))
        hits = eventually(
            lambda: o.search("NoClusterCapacity") or None, "a search by HeadwayReasons"
        )
        show(
            "AFTER: Web UI search HeadwayReasons = 'NoClusterCapacity'",
            "\n".join(hits),
        )
        check(any(h.endswith("-gang") for h in hits), "the gang is found by its reason")
        time.sleep(6)  # the exporters' batches (every 5 s)
        _show_trace(o)
    finally:
        stack.stop()


def _show_trace(o: Observer) -> None:
    spans = o.spans()
    gang_wf = protocol.action_workflow_id(o.tenant, "gang")
    roots = [
        s["context"]["trace_id"]
        for s in spans
        if gang_wf in json.dumps(s.get("attributes", {})) or gang_wf in s.get("name", "")
    ]
    check(bool(roots), f"a span of {gang_wf}")
    trace_id = max(set(roots), key=roots.count)
    mine = sorted(
        (s for s in spans if s["context"]["trace_id"] == trace_id), key=lambda s: s["start_time"]
    )
    services = sorted({s["resource"]["attributes"].get("service.name", "?") for s in mine})
    rows = [f"trace {trace_id}: {len(mine)} spans from {', '.join(services)}"]
    for s in mine:
        svc = s["resource"]["attributes"].get("service.name", "?")
        rows.append(f"  {s['start_time'][11:23]}  {svc:<24} {s['name']}")
    show(
        "AFTER: the gang's trace (every exporter's spans of its trace id, by start)",
        "\n".join(rows),
    )
    check(len(services) >= 3, f"one trace across the CLI and both workers, got {services}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--hold", type=int, default=20, help="seconds the filler holds a node")
    ap.add_argument("--out", type=Path, default=None, help="keep the stack's files here")
    args = ap.parse_args()
    out = args.out or Path(tempfile.mkdtemp(prefix="hw-observe-"))
    out.mkdir(parents=True, exist_ok=True)
    try:
        run(args.hold, out)
    except ViewFailed as exc:
        print(f"observe_blocked_gang: FAILED: {exc}", file=sys.stderr)
        sys.exit(1)
    print("\nobserve_blocked_gang: every view showed the blocked gang, and cleared it")


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    main()
