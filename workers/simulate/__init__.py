"""The simulator: what ETTR would a cluster get with these settings?

``lazarus simulate`` (alias ``python -m bench simulate``) runs the unchanged
``JobWorkflow`` (and, for the lemon rows, the real ``FleetWorkflow``) on Temporal's
time-skipping test server against a simulated cluster that meets one seeded failure
trace, and reports ETTR, MTTR, interruptions by class, steps lost, time per phase and
history size per configuration. Guide: ``docs/guides/simulator.md``.

It lives in the worker room, beside ``workers/controller.py``, because it is a worker:
it registers the workflows and activities (stand-ins behind the real names, the real
fleet activities) on a server of its own, in one process (issue 40, part 2: the app is
a client and imports no activity). ``lazarus simulate`` starts it from the CLI as
``lazarus worker`` starts the controller, importing this room when the verb runs.

- :mod:`~workers.simulate.model`: failure profiles, the trace, the cost model and
  its calibration (the measured files it names);
- :mod:`~workers.simulate.clock`: the time-skipping clock and the locks the server
  drops, given back (:class:`~workers.simulate.clock.LockLedger`);
- :mod:`~workers.simulate.cluster`: the simulated cluster behind the real activity
  names;
- :mod:`~workers.simulate.fleet`: the lemon rows' fleet, with a past job's reports;
- :mod:`~workers.simulate.runner`: the configurations (rows), one row's run and
  its figures;
- :mod:`~workers.simulate.watch`: the test server's binary, progress, a stopped
  clock, an overrun, history figures;
- :mod:`~workers.simulate.cli` and :mod:`~workers.simulate.verb`: the options,
  the table and the plot; the ``lazarus`` verb.
"""
