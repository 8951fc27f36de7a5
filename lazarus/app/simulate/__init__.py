"""The simulator: what ETTR would a cluster get with these settings?

``lazarus simulate`` (alias ``python -m bench simulate``) runs the unchanged
``JobWorkflow`` (and, for the lemon rows, the real ``FleetWorkflow``) on Temporal's
time-skipping test server against a simulated cluster that meets one seeded failure
trace, and reports ETTR, MTTR, interruptions by class, steps lost, time per phase and
history size per configuration. Guide: ``docs/guides/simulator.md``.

- :mod:`~lazarus.app.simulate.model`: failure profiles, the trace, the cost model and
  its calibration (the measured files it names);
- :mod:`~lazarus.app.simulate.clock`: the time-skipping clock and the locks the server
  drops, given back (:class:`~lazarus.app.simulate.clock.LockLedger`);
- :mod:`~lazarus.app.simulate.cluster`: the simulated cluster behind the real activity
  names;
- :mod:`~lazarus.app.simulate.fleet`: the lemon rows' fleet, with a past job's reports;
- :mod:`~lazarus.app.simulate.runner`: the configurations (rows), one row's run and
  its figures;
- :mod:`~lazarus.app.simulate.watch`: the test server's binary, progress, a stopped
  clock, an overrun, history figures;
- :mod:`~lazarus.app.simulate.cli` and :mod:`~lazarus.app.simulate.verb`: the options,
  the table and the plot; the ``lazarus`` verb.
"""
