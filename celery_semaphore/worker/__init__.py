"""The worker side, in the worker's main process.

Who hears of each ending (prefork; see docs/guarantees.md):

- the child ends the body (success, exception, retry, Ignore, Reject, soft
  time limit): `celery_semaphore.admission` releases in ``finally``;
- revoke, a killed child, a hard time limit, cold shutdown: only the main
  process hears of it; `release` releases by task id (idempotent);
- the whole worker killed: nobody; the lease runs out (the backstop).

- `received`: decides each request's gates when its message arrives;
- `heartbeat`: renews the leases of running tasks (a plain service);
- `bootstep`: the worker bootstep that starts and stops the heartbeat
  and the metrics endpoint, and the ``--semaphore-metrics-port`` option;
- `pool_occupancy`: how many of the pool's processes run a task (made here,
  read in the pool): a wait in place is short while none other is idle.
"""
