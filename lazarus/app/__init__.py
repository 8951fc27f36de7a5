"""The app floor: the CLI, the client, settings, the report, metrics, the dev server,
the local stack and fault injection (:mod:`lazarus.app.chaos`).

It stands on every floor below it (:mod:`lazarus.domain`, :mod:`workflows`,
:mod:`activities`); :mod:`workers` sits beside it. Nothing below imports it.
"""
