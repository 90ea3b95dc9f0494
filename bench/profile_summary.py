"""Summarise the py-spy profiles of `python bench/run.py --profile DIR`.

    python bench/profile_summary.py DIR [--top 12]

`run.py --profile` records, during one extra run of each phase, every API worker and the
dispatcher with `py-spy record --gil --format raw`: only the thread holding the GIL is sampled,
so the samples are where each process spends its Python CPU time (waits on Postgres, Redis and
sockets release the GIL and do not show).  For each phase and process kind this prints:

- where the time goes by library (each sample charged to the innermost frame that belongs to a
  known library: the ORM, DRF, psycopg, logging, ...);
- what the time is spent doing (inclusive: a sample counts for every activity on its stack, so
  these overlap; e.g. "auth" includes the ORM and psycopg time of the API key lookup);
- the hottest functions (self time).
"""

from __future__ import annotations

import argparse
import re
import sys
from collections import Counter, defaultdict
from pathlib import Path

# Innermost matching frame wins; order matters only between overlapping patterns.
LIBRARIES: list[tuple[str, re.Pattern[str]]] = [
    (name, re.compile(pattern))
    for name, pattern in [
        ("json (stdlib)", r"\(json/"),
        ("logging (stdlib + JSON formatter)", r"\(logging/|\(taskforge/lib/logging\.py"),
        ("psycopg (driver)", r"\(psycopg(_pool)?/"),
        ("redis-py", r"\(redis/"),
        ("Django ORM", r"\(django/db/"),
        ("DRF", r"\(rest_framework/"),
        ("prometheus", r"\((django_prometheus|prometheus_client)/"),
        ("whitenoise", r"\(whitenoise/"),
        ("Django (handler, middleware, urls, settings)", r"\(django/"),
        (
            "gunicorn + thread pool + sockets",
            r"\(gunicorn/|concurrent/futures|selectors\.py|socket",
        ),
        ("TaskForge code (self)", r"\((taskforge|tasks|workers|queues|dlq)/"),
    ]
]

# Inclusive activities: a sample counts for each whose pattern appears on its stack.
ACTIVITIES: list[tuple[str, re.Pattern[str]]] = [
    (name, re.compile(pattern))
    for name, pattern in [
        (
            "outside Django (gunicorn: accept, parse, write, keep-alive)",
            r"^(?=.*gunicorn/)(?!.*WSGIHandler)",
        ),
        ("Django middleware + URL routing (outside the view)", r"WSGIHandler(?!.*APIView\.)"),
        ("DRF view machinery (dispatch, negotiation, finalize)", r"APIView\.dispatch"),
        ("  auth: API key lookup (+ last_used_at)", r"ApiKeyAuthentication\.authenticate"),
        ("  request body parse (JSON)", r"Request\._parse|StrictJSONParser"),
        ("  body validation (serializer is_valid)", r"\.is_valid \("),
        ("  queue lookup by name", r"get_queue \(|resolve_queues|_refresh \(workers/protocol"),
        ("  enqueue: build tasks + INSERTs", r"_enqueue \(tasks/services"),
        ("  transition events + log lines (_move)", r"_move \(tasks/transitions"),
        ("  NOTIFY dispatchers", r"wake_dispatchers"),
        ("  transaction commit (+ on_commit log lines)", r"Atomic\.__exit__"),
        ("  log lines written", r"_log \(tasks/transitions|Logger\.(info|_log)"),
        ("  claim: Redis pop + hand-out UPDATE", r"take \(workers/protocol"),
        ("  worker last-seen upsert", r"record_seen"),
        ("  ack (UPDATE + events)", r"ack \(workers/protocol"),
        ("  response body (task_to_dict)", r"task_to_dict|claimed_task|_batch_result"),
        ("  response render (JSONRenderer)", r"JSONRenderer\.render|rendered_content"),
        ("dispatcher: select + mark claimed", r"_select_and_buffer"),
        ("dispatcher: preempt (buffer full)", r"_preempt"),
        ("dispatcher: Redis push + wake", r"DispatcherLoop\._push"),
        ("dispatcher: drain paused queue", r"DispatcherLoop\.drain"),
        ("dispatcher: wait for NOTIFY", r"DispatcherLoop\.wait"),
        ("dispatcher: rebuffer_missing", r"rebuffer_missing"),
        ("Django ORM (anywhere)", r"\(django/db/models/"),
        ("psycopg (anywhere)", r"\(psycopg/"),
        ("logging (anywhere)", r"\(logging/"),
    ]
]


def read_raw(path: Path) -> list[tuple[list[str], int]]:
    """py-spy raw output: `frame;frame;...;leaf count` per line."""
    samples = []
    for line in path.read_text().splitlines():
        stack, _, count = line.rpartition(" ")
        if stack and count.isdigit():
            samples.append((stack.split(";"), int(count)))
    return samples


def library(frames: list[str]) -> str:
    for frame in reversed(frames):
        for name, pattern in LIBRARIES:
            if pattern.search(frame):
                return name
    return "other (stdlib, C)"


def summarise(samples: list[tuple[list[str], int]], top: int) -> list[str]:
    total = sum(n for _, n in samples)
    if not total:
        return ["  (no samples)"]
    libs: Counter[str] = Counter()
    acts: Counter[str] = Counter()
    leaves: Counter[str] = Counter()
    for frames, n in samples:
        libs[library(frames)] += n
        joined = ";".join(frames)
        for name, pattern in ACTIVITIES:
            if pattern.search(joined):
                acts[name] += n
        leaves[re.sub(r":\d+\)$", ")", frames[-1])] += n
    out = [f"  {total} samples holding the GIL"]
    out.append("  by library (self time):")
    out += [f"    {n / total:6.1%}  {name}" for name, n in libs.most_common()]
    out.append("  by activity (inclusive, overlapping):")
    out += [f"    {acts[name] / total:6.1%}  {name}" for name, _ in ACTIVITIES if acts[name]]
    out.append(f"  hottest functions (self time, top {top}):")
    out += [f"    {n / total:6.1%}  {name}" for name, n in leaves.most_common(top)]
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("directory", type=Path)
    parser.add_argument("--top", type=int, default=12)
    args = parser.parse_args(argv)
    groups: dict[tuple[str, str], list[tuple[list[str], int]]] = defaultdict(list)
    for path in sorted(args.directory.glob("*.txt")):
        parts = path.name.split(".")
        if len(parts) < 4:
            continue
        groups[(parts[0], parts[1])] += read_raw(path)
    if not groups:
        print(f"no py-spy profiles in {args.directory}", file=sys.stderr)
        return 1
    for (phase, component), samples in groups.items():
        print(f"== {phase} / {component}")
        print("\n".join(summarise(samples, args.top)))
        print()
    return 0


if __name__ == "__main__":
    sys.exit(main())
