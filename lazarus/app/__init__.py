"""The app floor: the CLI, the client, settings, the report, metrics, the dev server
and the local stack. Fault injection, which signals local processes, is a test tool
(:mod:`infra.chaos`).

It stands on every floor below it (:mod:`lazarus.domain`, :mod:`workflows`,
:mod:`activities`); :mod:`workers` sits beside it. Nothing below imports it.
"""
