"""The commands that only look: ``status``, ``holders`` and ``waiters``."""

from __future__ import annotations

import json
import time
from collections.abc import Sequence
from typing import Any

import click

from .errors import SemaphoreCommand
from .operator import Operator, operator_for
from .params import INTERVAL
from .render import (
    HOLDERS_COLUMNS,
    WAITER_KEY_COLUMN,
    WAITERS_BY_KEY_COLUMNS,
    WAITERS_COLUMNS,
    echo_rates,
    status_text,
    table,
    with_semaphore,
)
from .rows import describe, family_summary, flat, is_one, waiter_state, waiters_by_key


@click.command(cls=SemaphoreCommand, example="status partner-api --watch --interval 5")
@click.argument("names", nargs=-1)
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
@click.option("--watch", is_flag=True, help="Refresh in place until Ctrl-C.")
@click.option(
    "--interval",
    default="2",
    type=INTERVAL,
    metavar="SECONDS",
    show_default=True,
    help="Time between refreshes (0.1 to 604800).",
)
@click.pass_context
def status(
    ctx: click.Context, names: tuple[str, ...], as_json: bool, watch: bool, interval: float
) -> None:
    """Limits, holders, waiters and utilization of NAMES (default: all in Redis and
    all the app declares). A per-key family's name shows the family's sums and
    its busiest members.

    LIMIT shows an override over the declared limit as 3(5), over none yet (set
    before first use) as 3(-); D marks a draining semaphore. WAIT counts every
    task waiting for it, and the next columns say where they wait: PARKED, kept
    aside until their turn (or handed over for it, not at a worker yet); IN PLACE,
    blocked at a worker, their turn near (the line below the table says where parked
    messages wait: in the broker's parking queues on RabbitMQ, else in the
    semaphores' Redis); SENT, published and not at a worker yet
    (in the broker, with a place or with one that lapsed); COUNTDOWN, the rest:
    refused at a worker and retried with a countdown, their messages held by a
    worker until due.

    Below the table, each semaphore whose line is shared by fair keys (fair_key=)
    shows how many keys wait and the 5 with the most waiting: their waiters in
    line, their grants in this minute and the one before (Redis's clock: 60 to
    120 s), and their SHARE of all fair grants then (--json lists up to 20).
    Last, each semaphore with shadow limits (shadow=True), or whose shadow limits
    counted anything: which limits are shadow limits now (as the last task to ask
    declared them), the grants its limit would have refused and the most permits
    held at once over it (the peak it would have had to allow), the grants its rate
    would have delayed and by how long in all.
    """
    with operator_for(ctx) as operator:
        parked_in = operator.parked_in()
        while True:
            rows = [{**row, "parked_in": parked_in} for row in _status_rows(operator, names)]
            text = json.dumps(rows, indent=2) if as_json else status_text(flat(rows))
            if not as_json and any(row["parked"] + row["handed_over"] for row in rows):
                text += f"\nPARKED: their messages wait {parked_in}."
            if not watch:
                click.echo(text)
                return
            click.echo("\x1b[H\x1b[2J" + time.strftime("%H:%M:%S ") + operator.url + "\n" + text)
            try:
                time.sleep(interval)
            except KeyboardInterrupt:
                return


def _status_rows(operator: Operator, names: Sequence[str]) -> list[dict[str, Any]]:
    """``status`` of NAMES (default: all), a family as its `family_summary`."""
    if not names:
        return [operator.summary(s) for s in operator.open_all()]
    rows = []
    for name in names:
        found = operator.semaphores(name)
        summaries = [operator.summary(s) for s in found]
        rows += summaries if is_one(found, name) else [family_summary(name, summaries)]
    return rows


@click.command(cls=SemaphoreCommand, example="holders partner-api --json")
@click.argument("name")
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
@click.pass_context
def holders(ctx: click.Context, name: str, as_json: bool) -> None:
    """Who holds a permit of NAME: task id, permits held (its weight), task name,
    worker, held since."""
    with operator_for(ctx) as operator:
        found = operator.semaphores(name)
        states = [s.status() for s in found]
        rows = [
            {
                "semaphore": state.name,
                "holder": h.holder,
                "permits": h.permits,
                **describe(h.info),
                "held_for": round(state.server_time - h.acquired_at, 3),
                "lease_left": round(h.expires_at - state.server_time, 3),
                "fencing_token": h.fencing_token,
            }
            for state in states
            for h in state.holders
        ]
        if as_json:
            click.echo(json.dumps(rows, indent=2))
            return
        click.echo(table(with_semaphore(HOLDERS_COLUMNS, found, name), rows))
        echo_rates(states)


@click.command(cls=SemaphoreCommand, example="waiters partner-api --json")
@click.argument("name")
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
@click.option(
    "--by-key",
    is_flag=True,
    help="One row per fair key (fair_key=): its waiters in line, the position of its "
    "first, the longest wait.",
)
@click.pass_context
def waiters(ctx: click.Context, name: str, as_json: bool, by_key: bool) -> None:
    """Who waits for NAME, in line order: task id, task name, worker, state, fair key,
    waiting since.

    State: parked (its message kept aside for its turn), handed over (published for
    its turn, not yet at a worker), waiting in place (blocked at a worker, its turn
    near), in line (none of these: its message is in the broker, not at a worker
    yet, or held by a worker as a countdown retry; the line does not record which),
    in broker (published with a place that lapsed before it reached a worker; listed
    last, no position). KEY: the fair key whose turns it takes (-: none).

    --by-key groups the waiters in line by fair key, in the order of each key's
    first waiter (those without a key as -; tasks in the broker have no place, so
    no key, and are left out); of a line of more than 1,000, the first 1,000."""
    with operator_for(ctx) as operator:
        found = operator.semaphores(name)
        states = [s.status() for s in found]
        if by_key:
            rows = [row for state in states for row in waiters_by_key(state)]
            if as_json:
                click.echo(json.dumps(rows, indent=2))
                return
            click.echo(table(with_semaphore(WAITERS_BY_KEY_COLUMNS, found, name), rows))
            for state in states:
                if state.waiter_count > len(state.waiters):
                    click.echo(
                        f"{state.name}: the first {len(state.waiters)} of "
                        f"{state.waiter_count} waiters in line"
                    )
            return
        rows = [
            {
                "semaphore": state.name,
                "position": w.position,
                "holder": w.holder,
                **describe(w.info),
                "ticket": w.ticket,
                "state": waiter_state(w),
                "fair_key": w.fair_key,
                "waiting_for": round(state.server_time - w.since, 3),
            }
            for state in states
            for w in [*state.waiters, *state.sent_without_place]
        ]
        if as_json:
            click.echo(json.dumps(rows, indent=2))
            return
        columns = WAITERS_COLUMNS
        if any(state.fair_keys_waiting for state in states):
            columns = [*columns[:-1], WAITER_KEY_COLUMN, columns[-1]]
        click.echo(table(with_semaphore(columns, found, name), rows))
        echo_rates(states)
