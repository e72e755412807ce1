"""Failure detection, the sensor's logic: events in, signals out — pure, deterministic, driven
by explicit times.

The service feeds every event with the time it received it (``now``, epoch ns) and calls
:meth:`Detector.poll` every ``heartbeat_polling_period_s``; nothing here reads a clock, does
I/O or touches the bus, so the same event sequence always yields the same signals.

What is detected:

* **crash** — a rank exited non-zero (or by a signal) without being told to (immediately;
  its CUDA cause, from the exit code, on ``Signal.rank_fault``; a rank out of GPU memory
  after ``oom_gather_s`` for its peers to follow — every rank out is one signal naming no
  node, the job's memory — and meanwhile no rank is found hung);
  or its host monitor counts fewer live ranks than the detector believes alive there (an
  exited or not yet started rank is not missing) and no exit report came within
  ``pod_termination_threshold_s`` (the process vanished).
* **missed_heartbeat** — a live rank silent longer than its heartbeat timeout:
  ``max(heartbeat_timeout_s, heartbeat_safety_factor × longest gap seen)``, and at least
  ``first_heartbeat_timeout_s`` before a started rank's first heartbeat. When every rank of
  the node is silent and its host monitor is silent too, the node is believed lost: one
  node-wide, uncorrectable signal; otherwise a correctable one naming the rank. A rank whose
  last beat said it is leaving (``schemas.BUSY_EXITING``: finished or told to stop) gets
  ``exit_timeout_s`` for its exit report, and its vanishing process is not a crash.
* **hang** — a rank still heartbeating but without step progress for
  ``max(hang_min_timeout_s, hang_safety_factor × the hang_quantile of its last hang_window
  progress intervals)`` (:mod:`.intervals`; ``hang_warmup_timeout_s`` until it has
  ``hang_min_samples`` of them, ``first_step_timeout_s`` for the first step after a start): a
  few of its own step times, so a hang on a sub-second step is found in about two seconds.
  A rank inside a checkpoint save or load (``Heartbeat.busy``) is not hung unless that lasts
  ``checkpoint_timeout_s``; the interval spent there is neither counted nor learnt. It is
  blamed on the live rank furthest behind in finished steps: its peers finished the step and
  only wait for it in the next collective. When nothing at all was heard for two polling
  periods the sensor itself stalled (progress may be queued unread): hang checks wait.
* **straggler** — see :mod:`.straggler`; reported once per node.
* **degraded_host** — a host report that is unhealthy or lists faults (GPU XID, uncorrected
  ECC, a missing GPU, the driver asking for a recovery, disk full ...), once per new set of
  faults; faults the GPU fault table (:mod:`goodput.gpu_faults`) says ask for nothing (a
  thermal slowdown, XID 45) are not counted. **node_returned** when that host reports
  healthy again.
* **nonfinite**, **loss_spike**, **replica_mismatch** — from the trainer's ``Numerics``
  windows (:mod:`.numerics`): a NaN or infinite loss or gradient norm, a window's loss over
  the median of the healthy ones by a MAD-scaled margin, data-parallel replicas holding
  different parameters (the majority names the corrupt one; a node caught twice is
  ``uncorrectable``). Each carries ``Signal.first_bad_step``, for the rollback.
* **job_down** — the job should be running but no rank made progress (a step, or a busy
  checkpoint heartbeat) for ``jobset_downtime_threshold_s`` (``first_step_timeout_s`` while a
  started rank has not made its first step yet).

Learnt intervals shrink by ``interval_decay`` per observation, so an old peak is forgotten.

One failure is one incident, not a storm: a rank is reported at most once per failure (an
exited rank has no heartbeat or hang deadline left), a node that has been reported is not
reported again (unless a correctable report of it is followed by its loss: a hung rank whose
host then dies is reported lost too, once), and while a correctable job-wide incident (crash, hang, a single rank's missed
heartbeat) is open, further correctable failures elsewhere are taken as its collateral
(in synchronous training every rank stalls or dies when one does). A rank (re)start closes
the incident of its node and the job's open incident. The first start or rejoin of a new
attempt starts over the progress of every live rank of an older attempt (restarting in
process, or being stopped): one fault, one remediation across an in-process restart. A node-wide loss or a degraded host is
still reported during an open incident: it needs the node replaced, not just a restart.
"""
