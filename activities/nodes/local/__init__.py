"""Local nodes: ranks on the controller's own machine, started through the rank wrapper
and watched through ``/proc`` and the run directory directly (``agent``), with the
preflight's checks run here (``checks``)."""
