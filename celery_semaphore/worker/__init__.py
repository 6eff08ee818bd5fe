"""The worker side, in the worker's main process.

Who hears of each ending (prefork; see docs/guarantees.md):

- the child ends the body (success, exception, retry, Ignore, Reject, soft
  time limit): `celery_semaphore.admission` releases in ``finally``;
- revoke, a killed child, a hard time limit, cold shutdown: only the main
  process hears of it; `release` releases by task id (idempotent);
- the whole worker killed: nobody; the lease runs out (the backstop).

- `received`: decides each request's gates when its message arrives;
- `heartbeat`: renews the leases of running tasks (a plain service), and each beat
  runs `parked_look` (hands over parked tasks now due) and, after a loss of Redis's
  data, `data_loss` (the write-back's clean-up and the report); `watch` makes it beat
  at once when Redis restarts or an operator's command may admit tasks;
- `bootstep`: the worker bootstep that starts and stops the heartbeat
  and the metrics endpoint, and the ``--semaphore-metrics-port`` option;
- `pool_occupancy`: how many of the pool's processes run a task (made here,
  read in the pool): a wait in place is short while none other is idle.
"""
